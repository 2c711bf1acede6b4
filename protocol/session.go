package protocol

import (
	"encoding/json"
	"errors"
	"fmt"
)

// StreamKind names one ordered stream of a session's operations. Seqs are numbered per
// (session, ownerEpoch, runEpoch, streamKind) from 1; ACKs are cumulative.
type StreamKind string

// Stream kinds.
const (
	StreamTranscript StreamKind = "transcript"
	StreamLive       StreamKind = "live"
)

// Valid reports whether k is a known stream kind.
func (k StreamKind) Valid() bool { return k == StreamTranscript || k == StreamLive }

// maxRunIDLen bounds a run id.
const maxRunIDLen = 128

// The id bounds every worker request is checked against.
var (
	errSessionID = fmt.Errorf("sessionId must be 1..%d bytes", maxIDLen)
	errRunID     = fmt.Errorf("runId longer than %d bytes", maxRunIDLen)
)

func badSessionID(id string) bool { return id == "" || len(id) > maxIDLen }

// MaxCommitMessages is the most messages one worker.transcript.commit may carry.
const MaxCommitMessages = 64

// Binding is what the gateway reads of a session to admit a worker's request for it: the environment
// it is attached to ("" when local), its active owner epoch and its lifecycle revision.
type Binding struct {
	EnvironmentID     string
	OwnerEpoch        uint64
	LifecycleRevision uint64
}

// Refuse returns why the binding refuses a request for sessionID that comes through environment envID
// ("": not checked) at ownerEpoch and lifecycleRevision (0: not checked), or nil: session-not-attached
// through another environment, epoch-mismatch for another owner epoch or lifecycle revision.
func (b Binding) Refuse(sessionID, envID string, ownerEpoch, lifecycleRevision uint64) *Error {
	switch {
	case envID != "" && b.EnvironmentID != envID:
		return Errorf(CodeSessionNotAttached, "session %.128q is not attached to environment %s", sessionID, envID)
	case ownerEpoch != b.OwnerEpoch:
		return Errorf(CodeEpochMismatch, "owner epoch %d is not the session's active epoch %d", ownerEpoch, b.OwnerEpoch)
	case lifecycleRevision != 0 && lifecycleRevision != b.LifecycleRevision:
		return Errorf(CodeEpochMismatch, "lifecycle revision %d is not the session's revision %d", lifecycleRevision, b.LifecycleRevision)
	}
	return nil
}

// Scope is the identity every durable worker operation carries. The gateway checks that SessionID is
// attached to the worker's environment, that OwnerEpoch is the session's active owner epoch
// (epoch-mismatch otherwise, for every frame of a stale owner), and that StreamKind matches the method.
// (SessionID, OwnerEpoch, RunEpoch, StreamKind, Seq) is the dedupe key.
type Scope struct {
	SessionID string `json:"sessionId"`
	// LifecycleRevision, when not 0, must equal the session's lifecycle revision.
	LifecycleRevision uint64     `json:"lifecycleRevision,omitempty"`
	RunID             string     `json:"runId"`
	OwnerEpoch        uint64     `json:"ownerEpoch"`
	StreamKind        StreamKind `json:"streamKind"`
	RunEpoch          uint64     `json:"runEpoch"`
	Seq               uint64     `json:"seq"`
}

// Validate checks the shape of a scope for a stream of kind want.
func (s Scope) Validate(want StreamKind) error {
	switch {
	case badSessionID(s.SessionID):
		return errSessionID
	case len(s.RunID) > maxRunIDLen:
		return errRunID
	case s.StreamKind != want:
		return fmt.Errorf("streamKind %.32q, want %q", string(s.StreamKind), want)
	case s.OwnerEpoch == 0 || s.RunEpoch == 0 || s.Seq == 0:
		return fmt.Errorf("ownerEpoch, runEpoch and seq start at 1")
	}
	return nil
}

// StreamKey identifies the stream of an operation within one connection.
func (s Scope) StreamKey() string { return s.SessionID + "\x00" + string(s.StreamKind) }

// TranscriptCommitParams are the params of worker.transcript.commit: a batch of 1..MaxCommitMessages
// messages appended under BaseLeafID (compare-and-swap). Messages are Message objects; the gateway
// generates every entry and parent id, so a message carrying one is invalid-batch.
type TranscriptCommitParams struct {
	Scope
	BaseLeafID string            `json:"baseLeafId"`
	Messages   []json.RawMessage `json:"messages"`
}

// TranscriptCommitResult answers worker.transcript.commit. Replayed is set when the operation was
// already committed and the cached result is returned again.
type TranscriptCommitResult struct {
	EntryIDs  []string `json:"entryIds"`
	NewLeafID string   `json:"newLeafId"`
	Replayed  bool     `json:"replayed,omitempty"`
}

// ResumeParams are the params of worker.resume.
type ResumeParams struct {
	SessionID  string `json:"sessionId"`
	OwnerEpoch uint64 `json:"ownerEpoch"`
}

// Validate checks the shape of a worker.resume: a session id of 1..128 bytes and an owner epoch.
func (p ResumeParams) Validate() error {
	switch {
	case badSessionID(p.SessionID):
		return errSessionID
	case p.OwnerEpoch == 0:
		return errors.New("ownerEpoch is required")
	}
	return nil
}

// StreamCursor is a position in one (runEpoch) stream; the zero value means nothing yet.
type StreamCursor struct {
	RunEpoch uint64 `json:"runEpoch"`
	Seq      uint64 `json:"seq"`
}

// ResumeResult is the gateway's persisted view of a session for the worker's owner epoch: where the
// transcript is (LeafID, the newest committed operation) and the cumulative live ACK of the newest
// live stream. A worker that kept its outbox resends everything after these cursors; a worker that
// lost it continues numbering after them.
type ResumeResult struct {
	SessionID         string `json:"sessionId"`
	OwnerEpoch        uint64 `json:"ownerEpoch"`
	LifecycleRevision uint64 `json:"lifecycleRevision"`
	LeafID            string `json:"leafId"`
	// LastCommitted is the highest (runEpoch, seq) committed in this owner epoch.
	LastCommitted StreamCursor `json:"lastCommitted"`
	// LiveAcked is the newest live stream of this owner epoch and its cumulative ACK.
	LiveAcked StreamCursor `json:"liveAcked"`
}

// Package protocol defines the closed, versioned worker protocol spoken between the gateway and a worker.
package protocol

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"
)

// ProtocolVersion is the worker protocol version this binary speaks. Admission requires an exact match.
const ProtocolVersion = 1

// Frame size limits, in bytes of one WebSocket message.
const (
	// PreAdmissionFrameLimit bounds every frame read before a worker is admitted.
	PreAdmissionFrameLimit = 64 << 10
	// DefaultFrameLimit bounds frames after admission.
	DefaultFrameLimit = 25 << 20
)

// maxIDLen bounds request ids, method and event names.
const maxIDLen = 128

// FrameType is the "type" of a frame.
type FrameType string

// Frame types.
const (
	TypeReq    FrameType = "req"
	TypeRes    FrameType = "res"
	TypeEvent  FrameType = "event"
	TypeCancel FrameType = "cancel"
)

// Method and event names. Method names follow the upstream worker vocabulary.
const (
	// MethodConnect is the admission request; it must be the first frame on a connection.
	MethodConnect = "connect"
	// MethodHeartbeat is the worker's liveness request.
	MethodHeartbeat = "worker.heartbeat"
	// MethodCredentialRefresh asks the gateway for a fresh credential (see CredentialRefreshResult).
	MethodCredentialRefresh = "worker.credential.refresh"
	// MethodShutdown is sent by the gateway (as an event, or a request) telling the worker to exit cleanly.
	MethodShutdown = "worker.shutdown"
	// MethodTranscriptCommit appends a batch of messages to a session's transcript (TranscriptCommitParams).
	MethodTranscriptCommit = "worker.transcript.commit"
	// MethodLiveEvent publishes one live event of a run (LiveEventParams).
	MethodLiveEvent = "worker.live-event"
	// MethodResume returns the gateway's persisted cursors of a session (ResumeParams, ResumeResult).
	MethodResume = "worker.resume"
)

// workerMethods is the allowlist of methods a worker may call after admission. A credential's method
// set is always a subset of it; anything else is answered with CodeMethodNotAllowed. It is read
// through IsWorkerMethod and WorkerMethods, so nothing can add to it at run time.
var workerMethods = map[string]bool{
	MethodHeartbeat:         true,
	MethodCredentialRefresh: true,
	MethodTranscriptCommit:  true,
	MethodLiveEvent:         true,
	MethodResume:            true,
	MethodInferenceStart:    true,
	MethodInferenceCredit:   true,
	MethodInferenceCancel:   true,
	MethodTranscriptContext: true,
	MethodToolCall:          true,
	MethodSessionsSpawn:     true,
}

// IsWorkerMethod reports whether a worker may call method after admission (the allowlist).
func IsWorkerMethod(method string) bool { return workerMethods[method] }

// WorkerMethods returns the allowlist of worker methods, sorted.
func WorkerMethods() []string {
	out := make([]string, 0, len(workerMethods))
	for m := range workerMethods {
		out = append(out, m)
	}
	slices.Sort(out)
	return out
}

// IsGatewayMethod reports whether method is one of the methods and events the gateway sends to a
// worker.
func IsGatewayMethod(method string) bool { return gatewayMethods[method] }

// gatewayMethods are the methods and events the gateway sends to a worker (behind IsGatewayMethod,
// so that no one can change the set).
var gatewayMethods = map[string]bool{
	MethodShutdown:          true,
	MethodInferenceEvent:    true,
	MethodInferenceTerminal: true,
	MethodTurnStart:         true,
	MethodTurnCancel:        true,
	MethodTurnStatus:        true,
}

// RoleWorker is the only role accepted on the worker endpoint.
const RoleWorker = "worker"

// Protocol feature flags, negotiated at admission independently of ProtocolVersion.
const (
	FeatureHeartbeat         = "heartbeat"
	FeatureCredentialRefresh = "credential-refresh"
	FeatureShutdown          = "shutdown"
	// FeatureDurableSessions: worker.transcript.commit, worker.live-event and worker.resume.
	FeatureDurableSessions = "durable-sessions"
)

// Features lists the feature flags this binary supports.
var Features = []string{FeatureHeartbeat, FeatureCredentialRefresh, FeatureShutdown, FeatureDurableSessions}

// NegotiateFeatures returns the features both sides support, in Features order.
func NegotiateFeatures(offered []string) []string {
	out := []string{}
	for _, f := range Features {
		if slices.Contains(offered, f) {
			out = append(out, f)
		}
	}
	return out
}

// Code is a machine-readable error code carried in a res frame's error.
type Code string

// Error codes.
const (
	CodeUnauthorized       Code = "unauthorized"
	CodeCredentialExpired  Code = "credential-expired"
	CodeWrongEnvironment   Code = "wrong-environment"
	CodeBundleMismatch     Code = "bundle-mismatch"
	CodeUnsupportedVersion Code = "unsupported-version"
	CodeFrameTooLarge      Code = "frame-too-large"
	CodeExpectedConnect    Code = "expected-connect"
	CodeMethodNotAllowed   Code = "method-not-allowed"
	CodeInvalidFrame       Code = "invalid-frame"
	CodeEpochMismatch      Code = "epoch-mismatch"
	CodeSessionNotAttached Code = "session-not-attached"
	CodeCapacityExceeded   Code = "capacity-exceeded"
	CodeStaleBaseLeaf      Code = "stale-base-leaf"
	CodeInvalidBatch       Code = "invalid-batch"
	// CodeResyncRequired answers a seq that skips ahead of the gateway's cursor; the error carries
	// AckedSeq and ExpectedSeq and the worker resends from ExpectedSeq.
	CodeResyncRequired Code = "resync-required"
	// CodeUnknownRun answers a call (worker.inference.start, worker.tool.call) that names no turn the
	// gateway started for the session (worker.turn.start) and that is still running.
	CodeUnknownRun Code = "unknown-run"
	// CodeRunYield answers the model call of a run that a live move asked to stop at its next
	// model call (worker.inference.start): the run ends with lifecycle_yield, and the turn goes on
	// from the transcript on the session's next owner.
	CodeRunYield Code = "run-yield"
	CodeInternal Code = "internal"
)

// PermanentAdmission reports whether an admission rejected with this code can never succeed by
// retrying with the same credential and binary.
func (c Code) PermanentAdmission() bool {
	switch c {
	case CodeUnauthorized, CodeCredentialExpired, CodeWrongEnvironment, CodeBundleMismatch, CodeUnsupportedVersion,
		CodeSessionNotAttached, CodeEpochMismatch:
		return true
	}
	return false
}

// Error is the error object of a failed res frame. It is also a Go error.
type Error struct {
	Code         Code   `json:"code"`
	Message      string `json:"message,omitempty"`
	Retryable    bool   `json:"retryable,omitempty"`
	RetryAfterMs int64  `json:"retryAfterMs,omitempty"`
	// AckedSeq and ExpectedSeq are set with CodeResyncRequired (ackedSeq 0 is omitted).
	AckedSeq    uint64 `json:"ackedSeq,omitempty"`
	ExpectedSeq uint64 `json:"expectedSeq,omitempty"`
	// LeafID is the session's current leaf, set with CodeStaleBaseLeaf.
	LeafID string `json:"leafId,omitempty"`
}

func (e *Error) Error() string {
	if e.Message == "" {
		return string(e.Code)
	}
	return string(e.Code) + ": " + e.Message
}

// Errorf returns an *Error with a formatted message.
func Errorf(code Code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// Frame is one protocol message. Which fields are meaningful depends on Type:
//
//	req:    ID, Method, Params
//	res:    ID, OK, Payload (when OK) or Error (when not)
//	event:  Event, Payload, Seq (0 means none)
//	cancel: ID
type Frame struct {
	Type    FrameType
	ID      string
	Method  string
	Params  json.RawMessage
	OK      bool
	Payload json.RawMessage
	Error   *Error
	Event   string
	Seq     uint64
}

// wireFrame is the JSON shape; pointers record presence so Decode can enforce a per-type schema.
type wireFrame struct {
	Type    FrameType       `json:"type"`
	ID      *string         `json:"id,omitempty"`
	Method  *string         `json:"method,omitempty"`
	Params  json.RawMessage `json:"params,omitempty"`
	OK      *bool           `json:"ok,omitempty"`
	Payload json.RawMessage `json:"payload,omitempty"`
	Error   *Error          `json:"error,omitempty"`
	Event   *string         `json:"event,omitempty"`
	Seq     *uint64         `json:"seq,omitempty"`
}

// MarshalJSON emits only the fields that belong to the frame's type.
func (f Frame) MarshalJSON() ([]byte, error) {
	w := wireFrame{Type: f.Type}
	switch f.Type {
	case TypeReq:
		w.ID, w.Method, w.Params = &f.ID, &f.Method, f.Params
	case TypeRes:
		w.ID, w.OK = &f.ID, &f.OK
		if f.OK {
			w.Payload = f.Payload
		} else {
			w.Error = f.Error
		}
	case TypeEvent:
		w.Event, w.Payload = &f.Event, f.Payload
		if f.Seq != 0 {
			w.Seq = &f.Seq
		}
	case TypeCancel:
		w.ID = &f.ID
	default:
		return nil, fmt.Errorf("marshal frame: unknown type %q", f.Type)
	}
	return json.Marshal(w)
}

// Encode returns f's wire bytes, the JSON that json.Marshal(f) returns, built directly: Params and
// Payload, which Request, Response and NewEvent already encoded, are copied as they are instead of
// being validated and compacted once more by encoding/json (the token relay writes a frame per
// token). They must hold one JSON value, as those constructors make them; anything else (a frame
// assembled from bytes a worker sent, say) is refused rather than copied, so no member can be
// smuggled into the frame through them. Only their validity is checked (json.Valid, no
// allocation), not re-encoded.
func (f Frame) Encode() ([]byte, error) {
	for _, raw := range []json.RawMessage{f.Params, f.Payload} {
		if len(raw) > 0 && !json.Valid(raw) {
			return nil, fmt.Errorf("marshal frame: params or payload is not one JSON value")
		}
	}
	b := make([]byte, 0, 64+len(f.ID)+len(f.Method)+len(f.Params)+len(f.Payload)+len(f.Event))
	b = append(b, `{"type":`...)
	b = appendString(b, string(f.Type))
	switch f.Type {
	case TypeReq:
		b = appendString(append(b, `,"id":`...), f.ID)
		b = appendString(append(b, `,"method":`...), f.Method)
		b = appendRaw(b, `,"params":`, f.Params)
	case TypeRes:
		b = appendString(append(b, `,"id":`...), f.ID)
		if f.OK {
			b = appendRaw(append(b, `,"ok":true`...), `,"payload":`, f.Payload)
			break
		}
		b = append(b, `,"ok":false`...)
		if f.Error != nil {
			e, err := json.Marshal(f.Error)
			if err != nil {
				return nil, fmt.Errorf("marshal frame error: %w", err)
			}
			b = append(append(b, `,"error":`...), e...)
		}
	case TypeEvent:
		b = appendRaw(b, `,"payload":`, f.Payload)
		b = appendString(append(b, `,"event":`...), f.Event)
		if f.Seq != 0 {
			b = strconv.AppendUint(append(b, `,"seq":`...), f.Seq, 10)
		}
	case TypeCancel:
		b = appendString(append(b, `,"id":`...), f.ID)
	default:
		return nil, fmt.Errorf("marshal frame: unknown type %q", f.Type)
	}
	return append(b, '}'), nil
}

// appendRaw appends the member name and raw, unless raw is empty (omitempty).
func appendRaw(b []byte, name string, raw json.RawMessage) []byte {
	if len(raw) == 0 {
		return b
	}
	return append(append(b, name...), raw...)
}

// appendString appends s as a JSON string, escaped as encoding/json escapes it.
func appendString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x7f || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			q, _ := json.Marshal(s) // a string always encodes
			return append(b, q...)
		}
	}
	return append(append(append(b, '"'), s...), '"')
}

// Request builds a req frame, marshalling params.
func Request(id, method string, params any) (Frame, error) {
	p, err := marshalRaw(params)
	if err != nil {
		return Frame{}, fmt.Errorf("marshal %s params: %w", method, err)
	}
	return Frame{Type: TypeReq, ID: id, Method: method, Params: p}, nil
}

// Response builds a successful res frame, marshalling payload.
func Response(id string, payload any) (Frame, error) {
	p, err := marshalRaw(payload)
	if err != nil {
		return Frame{}, fmt.Errorf("marshal response payload: %w", err)
	}
	return Frame{Type: TypeRes, ID: id, OK: true, Payload: p}, nil
}

// ErrorResponse builds a failed res frame.
func ErrorResponse(id string, e *Error) Frame {
	return Frame{Type: TypeRes, ID: id, Error: e}
}

// NewEvent builds an event frame, marshalling payload.
func NewEvent(event string, seq uint64, payload any) (Frame, error) {
	p, err := marshalRaw(payload)
	if err != nil {
		return Frame{}, fmt.Errorf("marshal %s payload: %w", event, err)
	}
	return Frame{Type: TypeEvent, Event: event, Seq: seq, Payload: p}, nil
}

func marshalRaw(v any) (json.RawMessage, error) {
	if v == nil {
		return nil, nil
	}
	b, err := json.Marshal(v)
	return json.RawMessage(b), err
}

// ErrFrameTooLarge is returned (wrapped in a *DecodeError) for a frame larger than the limit.
var ErrFrameTooLarge = errors.New("frame too large")

// DecodeError is a frame that does not follow the schema. Code is CodeFrameTooLarge or CodeInvalidFrame.
type DecodeError struct {
	Code Code
	Err  error
}

func (e *DecodeError) Error() string { return "decode frame: " + e.Err.Error() }
func (e *DecodeError) Unwrap() error { return e.Err }

// Decode parses one frame of at most limit bytes against the closed schema: unknown frame types,
// unknown fields, fields of another frame type, missing required fields and trailing data are errors.
func Decode(b []byte, limit int) (Frame, error) {
	if len(b) > limit {
		return Frame{}, &DecodeError{Code: CodeFrameTooLarge, Err: fmt.Errorf("%w: %d bytes, limit %d", ErrFrameTooLarge, len(b), limit)}
	}
	invalid := func(format string, args ...any) (Frame, error) {
		return Frame{}, &DecodeError{Code: CodeInvalidFrame, Err: fmt.Errorf(format, args...)}
	}
	var w wireFrame
	if err := strictUnmarshal(b, &w); err != nil {
		return invalid("%v", err)
	}
	has := func(s *string) bool { return s != nil }
	nonEmpty := func(name string, s *string) error {
		if s == nil || *s == "" {
			return fmt.Errorf("%s frame: missing %s", w.Type, name)
		}
		if len(*s) > maxIDLen {
			return fmt.Errorf("%s frame: %s longer than %d bytes", w.Type, name, maxIDLen)
		}
		return nil
	}
	f := Frame{Type: w.Type}
	switch w.Type {
	case TypeReq:
		if err := errors.Join(nonEmpty("id", w.ID), nonEmpty("method", w.Method)); err != nil {
			return invalid("%v", err)
		}
		if w.OK != nil || w.Payload != nil || w.Error != nil || has(w.Event) || w.Seq != nil {
			return invalid("req frame: fields of another frame type")
		}
		f.ID, f.Method, f.Params = *w.ID, *w.Method, w.Params
	case TypeRes:
		if err := nonEmpty("id", w.ID); err != nil {
			return invalid("%v", err)
		}
		if w.OK == nil {
			return invalid("res frame: missing ok")
		}
		if has(w.Method) || w.Params != nil || has(w.Event) || w.Seq != nil {
			return invalid("res frame: fields of another frame type")
		}
		if *w.OK && w.Error != nil {
			return invalid("res frame: ok with error")
		}
		if !*w.OK {
			if w.Error == nil || w.Error.Code == "" {
				return invalid("res frame: not ok without error code")
			}
			if w.Payload != nil {
				return invalid("res frame: error with payload")
			}
		}
		f.ID, f.OK, f.Payload, f.Error = *w.ID, *w.OK, w.Payload, w.Error
	case TypeEvent:
		if err := nonEmpty("event", w.Event); err != nil {
			return invalid("%v", err)
		}
		if has(w.ID) || has(w.Method) || w.Params != nil || w.OK != nil || w.Error != nil {
			return invalid("event frame: fields of another frame type")
		}
		f.Event, f.Payload = *w.Event, w.Payload
		if w.Seq != nil {
			f.Seq = *w.Seq
		}
	case TypeCancel:
		if err := nonEmpty("id", w.ID); err != nil {
			return invalid("%v", err)
		}
		if has(w.Method) || w.Params != nil || w.OK != nil || w.Payload != nil || w.Error != nil || has(w.Event) || w.Seq != nil {
			return invalid("cancel frame: fields of another frame type")
		}
		f.ID = *w.ID
	case "":
		return invalid("missing type")
	default:
		return invalid("unknown frame type %.32q", string(w.Type))
	}
	return f, nil
}

// DecodeParams strictly decodes a params or payload object into v: unknown fields and trailing
// data are errors, and a missing or null object is an error.
func DecodeParams(raw json.RawMessage, v any) error {
	if len(raw) == 0 || string(raw) == "null" {
		return errors.New("missing object")
	}
	return strictUnmarshal(raw, v)
}

func strictUnmarshal(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("trailing data after JSON value")
	}
	return nil
}

// ConnectParams are the params of the connect request.
type ConnectParams struct {
	Role      string    `json:"role"`
	Admission Admission `json:"admission"`
}

// Admission is what a worker presents to be admitted.
type Admission struct {
	EnvironmentID string    `json:"environmentId"`
	Credential    string    `json:"credential"`
	OwnerEpoch    uint64    `json:"ownerEpoch"`
	SessionID     string    `json:"sessionId,omitempty"`
	Handshake     Handshake `json:"handshake"`
	// PublicKey is the worker's ed25519 public key (base64), made at launch and kept in memory
	// only; Proof is its signature of AdmissionMessage at SignedAtMs (SignAdmission). The
	// gateway binds a credential's lineage to the first key admitted with it.
	PublicKey  string `json:"publicKey,omitempty"`
	Proof      string `json:"proof,omitempty"`
	SignedAtMs int64  `json:"signedAtMs,omitempty"`
}

// AdmissionMessage is what a worker's key signs: every claim of the admission, the credential
// included, and the time of signing.
func AdmissionMessage(a Admission) []byte {
	return fmt.Appendf(nil, "openclaw-worker-admission/v1\n%s\n%s\n%d\n%s\n%s\n%d\n%s",
		a.EnvironmentID, a.Credential, a.OwnerEpoch, a.SessionID, a.Handshake.BundleHash, a.SignedAtMs, a.PublicKey)
}

// SignAdmission signs a with key at now.
func SignAdmission(a *Admission, key ed25519.PrivateKey, now time.Time) {
	a.PublicKey = base64.StdEncoding.EncodeToString(key.Public().(ed25519.PublicKey))
	a.SignedAtMs = now.UnixMilli()
	a.Proof = base64.StdEncoding.EncodeToString(ed25519.Sign(key, AdmissionMessage(*a)))
}

// VerifyAdmission checks a's proof against its public key (not the time, nor the binding).
func VerifyAdmission(a Admission) error {
	if a.PublicKey == "" || a.Proof == "" {
		return errors.New("the admission carries no worker key proof")
	}
	pub, err := base64.StdEncoding.DecodeString(a.PublicKey)
	if err != nil || len(pub) != ed25519.PublicKeySize {
		return errors.New("the worker's public key is not a base64 ed25519 key")
	}
	sig, err := base64.StdEncoding.DecodeString(a.Proof)
	if err != nil || len(sig) != ed25519.SignatureSize || !ed25519.Verify(pub, AdmissionMessage(a), sig) {
		return errors.New("the admission proof does not verify with the worker's key")
	}
	return nil
}

// Handshake identifies the worker binary.
type Handshake struct {
	// BundleHash is the hex sha256 of the worker's own executable.
	BundleHash string `json:"bundleHash"`
	// Version is the protocol version (ProtocolVersion); it must match exactly.
	Version int `json:"version"`
	// BuildVersion is the openclaw build version, informational (logs and audit).
	BuildVersion     string   `json:"buildVersion,omitempty"`
	ProtocolFeatures []string `json:"protocolFeatures"`
	// Tools is the worker's tool manifest (ToolManifest of its built-in tools): a worker whose
	// tools differ from the bundle's is refused (bundle-mismatch).
	Tools []ToolDigest `json:"tools,omitempty"`
}

// ToolDigest names one tool and the sha256 of its schema (name, description, parameters).
type ToolDigest struct {
	Name   string `json:"name"`
	Schema string `json:"schema"`
}

// MaxManifestTools bounds a worker's tool manifest.
const MaxManifestTools = 256

// ToolManifest is the manifest of a tool set, sorted by name.
func ToolManifest(schemas []Tool) []ToolDigest {
	out := make([]ToolDigest, 0, len(schemas))
	for _, t := range schemas {
		b, _ := json.Marshal(t)
		sum := sha256.Sum256(b)
		out = append(out, ToolDigest{Name: t.Name, Schema: hex.EncodeToString(sum[:])})
	}
	slices.SortFunc(out, func(a, b ToolDigest) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// ManifestDiff says how manifest got differs from want ("" when it does not), naming at most a
// few tools.
func ManifestDiff(want, got []ToolDigest) string {
	if slices.Equal(want, got) {
		return ""
	}
	if len(got) > MaxManifestTools {
		return fmt.Sprintf("%d tools, more than %d", len(got), MaxManifestTools)
	}
	wantBy := map[string]string{}
	for _, d := range want {
		wantBy[d.Name] = d.Schema
	}
	gotBy := map[string]string{}
	var diffs []string
	for _, d := range got {
		gotBy[d.Name] = d.Schema
		switch s, ok := wantBy[d.Name]; {
		case !ok:
			diffs = append(diffs, fmt.Sprintf("unknown tool %.64q", d.Name))
		case s != d.Schema:
			diffs = append(diffs, fmt.Sprintf("tool %.64q has another schema", d.Name))
		}
	}
	for _, d := range want {
		if _, ok := gotBy[d.Name]; !ok {
			diffs = append(diffs, fmt.Sprintf("tool %q is missing", d.Name))
		}
	}
	if len(diffs) == 0 {
		return "the tools are listed in another order or twice"
	}
	if len(diffs) > 3 {
		diffs = append(diffs[:3], fmt.Sprintf("%d more", len(diffs)-3))
	}
	return strings.Join(diffs, ", ")
}

// ConnectResult is the payload of a successful connect response.
type ConnectResult struct {
	EnvironmentID       string   `json:"environmentId"`
	HeartbeatIntervalMs int64    `json:"heartbeatIntervalMs"`
	Features            []string `json:"features"`
	// CredentialExpiresInMs is how long the presented credential stays valid; 0 means unknown.
	CredentialExpiresInMs int64 `json:"credentialExpiresInMs,omitempty"`
}

// CredentialRefreshResult is the payload of a successful worker.credential.refresh response.
type CredentialRefreshResult struct {
	Credential  string `json:"credential"`
	ExpiresInMs int64  `json:"expiresInMs"`
}

// ShutdownPayload is the payload of the worker.shutdown event or request.
type ShutdownPayload struct {
	Reason string `json:"reason,omitempty"`
}

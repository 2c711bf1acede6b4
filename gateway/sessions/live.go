package sessions

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/openclaw/cloudworkers/gateway/store"
	"github.com/openclaw/cloudworkers/protocol"
)

// LiveParams are one live event from a run. (SessionID, OwnerEpoch) come from the caller's binding.
type LiveParams struct {
	SessionID string
	// EnvironmentID, when set, is the environment the event comes through: it is refused
	// session-not-attached unless the session is attached to that environment.
	EnvironmentID string
	OwnerEpoch    uint64
	// LifecycleRevision, when not zero, must be the session's lifecycle revision (epoch-mismatch).
	LifecycleRevision uint64
	RunEpoch          uint64
	RunID             string
	// Seq numbers the events of one (OwnerEpoch, RunEpoch) stream from 1.
	Seq uint64
	// LastAckedSeq is the worker's view of the cumulative ACK; informational.
	LastAckedSeq uint64
	Event        protocol.LiveEvent
}

// LiveRequest is the wire params of worker.live-event.
type LiveRequest struct {
	RunEpoch     uint64             `json:"runEpoch"`
	LastAckedSeq uint64             `json:"lastAckedSeq"`
	Seq          uint64             `json:"seq"`
	RunID        string             `json:"runId"`
	Event        protocol.LiveEvent `json:"event"`
}

// LiveResult is the wire payload answering worker.live-event.
type LiveResult struct {
	AckedSeq uint64 `json:"ackedSeq"`
}

// DecodeLive strictly decodes worker.live-event params for the worker's bound session and owner epoch.
func DecodeLive(sessionID string, ownerEpoch uint64, raw json.RawMessage) (LiveParams, error) {
	var req LiveRequest
	if err := protocol.DecodeParams(raw, &req); err != nil {
		return LiveParams{}, &Error{Code: protocol.CodeInvalidFrame, Message: err.Error(), Err: err}
	}
	p := LiveParams{SessionID: sessionID, OwnerEpoch: ownerEpoch, RunEpoch: req.RunEpoch, RunID: req.RunID,
		Seq: req.Seq, LastAckedSeq: req.LastAckedSeq, Event: req.Event}
	if err := p.Event.Validate(); err != nil {
		return LiveParams{}, &Error{Code: protocol.CodeInvalidFrame, Message: err.Error(), Err: err}
	}
	return p, nil
}

// LiveRecord is a live event as subscribers see it. Cursor numbers the session's stream across runs
// and gateway restarts; a subscriber resumes after the last Cursor it received.
type LiveRecord struct {
	Cursor    uint64             `json:"cursor"`
	SessionID string             `json:"sessionId"`
	RunEpoch  uint64             `json:"runEpoch"`
	RunID     string             `json:"runId,omitempty"`
	Seq       uint64             `json:"seq"`
	At        time.Time          `json:"at"`
	Event     protocol.LiveEvent `json:"event"`
}

func (r *LiveRecord) cursor() uint64 { return r.Cursor }

// liveState is the ACK cursor and fan-out of one session. It changes only after the transaction that
// persists the event and its cursor commits, so memory never runs ahead of SQLite; after a failed
// commit (whose outcome is unknown) it is marked stale and caught up from SQLite before the next event.
type liveState struct {
	ready   chan struct{} // closed once loaded from SQLite
	loadErr error
	// mu serialises PublishLive for the session; it is held across the transaction and the fan-out.
	mu                chan struct{}
	owner, run, acked uint64
	runID             string
	stream            uint64 // last Cursor assigned
	stale             bool   // SQLite may be ahead of the fields above; see catchUpLive
	feed              *feed[*LiveRecord]
}

func (ls *liveState) lock(ctx context.Context) error {
	select {
	case ls.mu <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (ls *liveState) unlock() { <-ls.mu }

// liveFor returns the loaded live state of a session.
func (s *Store) liveFor(ctx context.Context, id string) (*liveState, error) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, ErrClosed
	}
	ls, ok := s.live[id]
	if !ok {
		ls = &liveState{ready: make(chan struct{}), mu: make(chan struct{}, 1),
			feed: newFeed[*LiveRecord](s.cfg.Retention, s.cfg.SubscriberBuffer, 0)}
		s.live[id] = ls
	}
	s.mu.Unlock()
	if ok {
		select {
		case <-ls.ready:
			return ls, ls.loadErr
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	ls.loadErr = s.loadLive(ctx, id, ls)
	if ls.loadErr != nil {
		s.mu.Lock()
		delete(s.live, id)
		s.mu.Unlock()
	}
	close(ls.ready)
	return ls, ls.loadErr
}

// loadLive restores a session's cursor and its retained events (see catchUpLive). Nobody else sees
// ls before ready is closed.
func (s *Store) loadLive(ctx context.Context, id string, ls *liveState) error {
	var n int
	if err := s.db.R.QueryRowContext(ctx, `SELECT COUNT(*) FROM sessions WHERE id = ?`, id).Scan(&n); err != nil {
		return fmt.Errorf("load live cursor of %s: %w", id, err)
	}
	if n == 0 {
		return notFound(id)
	}
	return s.catchUpLive(ctx, id, ls)
}

// PublishLive accepts one live event and returns the cumulative ACK of its stream. A seq already
// acknowledged is acknowledged again without being published twice; a seq past ackedSeq+1 is
// resync-required; an event of an older run epoch, or of an owner epoch that is not the session's, is
// epoch-mismatch; so is one from an environment the session is not attached to (EnvironmentID). The
// binding is checked, and the event and the cursor that acknowledges it are written, in one
// transaction; the event then reaches subscribers, and only then is the ACK returned.
func (s *Store) PublishLive(ctx context.Context, p LiveParams) (uint64, error) {
	if err := p.Event.Validate(); err != nil {
		return 0, &Error{Code: protocol.CodeInvalidFrame, Message: err.Error(), Err: err}
	}
	if p.Seq == 0 || p.RunEpoch == 0 {
		return 0, errorf(protocol.CodeInvalidFrame, "runEpoch and seq start at 1")
	}
	ls, err := s.liveFor(ctx, p.SessionID)
	if err != nil {
		return 0, err
	}
	if err := ls.lock(ctx); err != nil {
		return 0, err
	}
	defer ls.unlock()
	if ls.stale {
		if err := s.catchUpLive(ctx, p.SessionID, ls); err != nil {
			return 0, fmt.Errorf("live event of session %s: %w", p.SessionID, err)
		}
	}
	var acked uint64
	var rec *LiveRecord
	// Group commit: the events of sessions streaming at once share a transaction and its fsync;
	// each is acknowledged only once that transaction committed.
	err = s.db.GroupTx(ctx, func(tx *sql.Tx) error {
		var b protocol.Binding
		err := tx.StmtContext(ctx, s.liveSQL.owner).QueryRowContext(ctx, p.SessionID).Scan(&b.EnvironmentID, &b.OwnerEpoch, &b.LifecycleRevision)
		if err := bindingCheck(err, p.SessionID, b, p.EnvironmentID, p.OwnerEpoch, p.LifecycleRevision); err != nil {
			return err
		}
		curAcked := ls.acked
		switch {
		case p.OwnerEpoch < ls.owner || (p.OwnerEpoch == ls.owner && p.RunEpoch < ls.run):
			return errorf(protocol.CodeEpochMismatch, "late event of run epoch %d/%d; the stream is at %d/%d",
				p.OwnerEpoch, p.RunEpoch, ls.owner, ls.run)
		case p.OwnerEpoch > ls.owner || p.RunEpoch > ls.run:
			curAcked = 0 // a new run stream
		}
		if p.Seq <= curAcked {
			acked = curAcked // stored and published when it was first acknowledged
			return nil
		}
		if p.Seq > curAcked+1 {
			return &Error{Code: CodeResyncRequired, AckedSeq: curAcked, ExpectedSeq: curAcked + 1,
				Message: fmt.Sprintf("seq %d skips ahead: ackedSeq %d, expectedSeq %d", p.Seq, curAcked, curAcked+1)}
		}
		r := &LiveRecord{Cursor: ls.stream + 1, SessionID: p.SessionID, RunEpoch: p.RunEpoch, RunID: p.RunID,
			Seq: p.Seq, At: store.ParseTime(store.FormatTime(s.now())), Event: p.Event}
		if err := s.insertLiveEvent(ctx, tx, p.OwnerEpoch, r); err != nil {
			return err
		}
		if err := s.writeCursor(ctx, tx, p.SessionID, p.OwnerEpoch, p.RunEpoch, p.RunID, p.Seq, r.Cursor); err != nil {
			return err
		}
		acked, rec = p.Seq, r
		return nil
	})
	if err != nil {
		var se *Error
		if errors.As(err, &se) {
			return 0, se
		}
		// The commit may or may not have happened: catch up from SQLite before the next event, so the
		// worker's resend is acknowledged, and published, exactly once either way.
		ls.stale = true
		return 0, fmt.Errorf("live event of session %s: %w", p.SessionID, err)
	}
	if rec == nil {
		return acked, nil
	}
	ls.owner, ls.run, ls.runID, ls.acked, ls.stream = p.OwnerEpoch, p.RunEpoch, p.RunID, p.Seq, rec.Cursor
	ls.feed.publish(rec)
	if p.Event.Type.Lifecycle() {
		s.Notify(ChangeSessionUpdated, p.SessionID)
	}
	return acked, nil
}

// The statements of every live event (prepared once in New).
const (
	sqlLiveOwner = `SELECT environment_id, owner_epoch, lifecycle_revision FROM sessions WHERE id = ?`
	// sqlWorkerBinding is WorkerBinding's, asked before every model call and transcript commit.
	sqlWorkerBinding = `SELECT environment_id, owner_epoch, lifecycle_revision FROM sessions WHERE id = ?`
	sqlLiveInsert    = `INSERT INTO live_events(session_id, stream_seq, owner_epoch, run_epoch, run_id, seq, at, event)
		VALUES(?,?,?,?,?,?,?,?)`
	sqlLiveTrim   = `DELETE FROM live_events WHERE session_id = ? AND stream_seq <= ?`
	sqlLiveCursor = `INSERT INTO live_cursors(session_id, owner_epoch, run_epoch, run_id, acked_seq, stream_seq, updated_at)
		VALUES(?,?,?,?,?,?,?) ON CONFLICT(session_id) DO UPDATE SET owner_epoch = excluded.owner_epoch,
		run_epoch = excluded.run_epoch, run_id = excluded.run_id, acked_seq = excluded.acked_seq,
		stream_seq = excluded.stream_seq, updated_at = excluded.updated_at`
)

func (s *Store) writeCursor(ctx context.Context, tx *sql.Tx, id string, owner, run uint64, runID string, acked, stream uint64) error {
	_, err := tx.StmtContext(ctx, s.liveSQL.cursor).ExecContext(ctx, id, owner, run, runID, acked, stream, store.FormatTime(s.now()))
	if err != nil {
		return fmt.Errorf("write live cursor: %w", err)
	}
	return nil
}

// Subscribe follows a session's live events after cursor (0: everything retained), replaying the
// retained ones first. The subscription is dropped with ErrLagged if its reader falls more than
// Config.SubscriberBuffer events behind; publishers never wait for it.
func (s *Store) Subscribe(ctx context.Context, sessionID string, cursor uint64) (*Subscription[*LiveRecord], error) {
	ls, err := s.liveFor(ctx, sessionID)
	if err != nil {
		return nil, err
	}
	return ls.feed.subscribe(cursor), nil
}

// LiveCursor returns the Cursor of the newest live event of a session.
func (s *Store) LiveCursor(ctx context.Context, sessionID string) (uint64, error) {
	ls, err := s.liveFor(ctx, sessionID)
	if err != nil {
		return 0, err
	}
	return ls.feed.lastCursor(), nil
}

// LastRunEnd returns the newest lifecycle end (or error) event the session's runs published, if
// one is still kept. What it says is what the run's owner (perhaps a worker) reported.
func (s *Store) LastRunEnd(ctx context.Context, id string) (protocol.LiveEvent, bool, error) {
	var b []byte
	err := s.db.R.QueryRowContext(ctx, `SELECT event FROM live_events WHERE session_id = ?
		AND json_valid(event) AND json_extract(event, '$.type') IN (?, ?) ORDER BY stream_seq DESC LIMIT 1`,
		id, string(protocol.LiveLifecycleEnd), string(protocol.LiveLifecycleError)).Scan(&b)
	if errors.Is(err, sql.ErrNoRows) {
		return protocol.LiveEvent{}, false, nil
	}
	if err != nil {
		return protocol.LiveEvent{}, false, err
	}
	var ev protocol.LiveEvent
	if err := json.Unmarshal(b, &ev); err != nil {
		return protocol.LiveEvent{}, false, nil
	}
	return ev, true, nil
}

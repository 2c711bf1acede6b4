package sessions

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/openclaw/cloudworkers/gateway/store"
	"github.com/openclaw/cloudworkers/protocol"
)

// BindTx binds a session to an environment's worker (envID "" returns it to the gateway) and
// advances its owner epoch, fencing any previous owner, inside tx: the placement state machine
// calls it in the transaction of the transition that moves the session, so the binding and the
// placement never disagree. It returns the new owner epoch; once tx has committed, the caller
// announces the change with Notify(ChangeSessionUpdated, id).
func (s *Store) BindTx(ctx context.Context, tx *sql.Tx, id, envID string) (uint64, error) {
	kind := "session.attach"
	if envID == "" {
		kind = "session.detach"
	}
	var epoch uint64
	err := tx.QueryRowContext(ctx, `UPDATE sessions SET environment_id = ?, owner_epoch = owner_epoch + 1, updated_at = ?
		WHERE id = ? RETURNING owner_epoch`, envID, store.FormatTime(s.now()), id).Scan(&epoch)
	if errors.Is(err, sql.ErrNoRows) {
		err = notFound(id)
	}
	if err == nil {
		err = store.Audit(ctx, tx, s.now(), kind, envID, fmt.Sprintf("session %s owner epoch %d", id, epoch))
	}
	if err != nil {
		return 0, fmt.Errorf("%s %s: %w", kind, id, err)
	}
	return epoch, nil
}

// Attach is BindTx in a transaction of its own, for tests of the worker endpoint that need a
// session bound without a placement; sessions are put on workers by dispatch.
func (s *Store) Attach(ctx context.Context, id, envID string) (uint64, error) {
	if envID == "" {
		return 0, fmt.Errorf("attach session %s: environment id is required", id)
	}
	return s.bind(ctx, id, envID)
}

func (s *Store) bind(ctx context.Context, id, envID string) (uint64, error) {
	var epoch uint64
	err := s.db.InTx(ctx, func(tx *sql.Tx) (err error) {
		epoch, err = s.BindTx(ctx, tx, id, envID)
		return err
	})
	if err != nil {
		return 0, err
	}
	s.Notify(ChangeSessionUpdated, id)
	return epoch, nil
}

// WorkerBinding returns the session's binding: the environment it is attached to ("" when local),
// its active owner epoch and its lifecycle revision. An unknown session is session-not-attached.
func (s *Store) WorkerBinding(ctx context.Context, id string) (protocol.Binding, error) {
	var b protocol.Binding
	err := s.liveSQL.binding.QueryRowContext(ctx, id).Scan(&b.EnvironmentID, &b.OwnerEpoch, &b.LifecycleRevision)
	if errors.Is(err, sql.ErrNoRows) {
		return b, notFound(id)
	}
	if err != nil {
		return b, fmt.Errorf("binding of session %s: %w", id, err)
	}
	return b, nil
}

// WorkerCommit serves worker.transcript.commit once the caller has checked the scope against the
// worker's admission: it decodes the batch (invalid-batch) and commits it (see Commit).
func (s *Store) WorkerCommit(ctx context.Context, p protocol.TranscriptCommitParams) (protocol.TranscriptCommitResult, error) {
	cp, err := decodeCommitRequest(p.SessionID, p.OwnerEpoch,
		CommitRequest{RunEpoch: p.RunEpoch, Seq: p.Seq, BaseLeafID: p.BaseLeafID, Messages: p.Messages})
	if err != nil {
		return protocol.TranscriptCommitResult{}, err
	}
	res, err := s.Commit(ctx, cp)
	if err != nil {
		return protocol.TranscriptCommitResult{}, err
	}
	return protocol.TranscriptCommitResult{EntryIDs: res.EntryIDs, NewLeafID: res.NewLeafID, Replayed: res.Replayed}, nil
}

// WorkerLive serves worker.live-event from envID's worker: it publishes the event, which PublishLive
// validates (invalid-frame) and checks against the session's binding in its transaction.
func (s *Store) WorkerLive(ctx context.Context, envID string, p protocol.LiveEventParams) (protocol.LiveEventResult, error) {
	acked, err := s.PublishLive(ctx, LiveParams{SessionID: p.SessionID, EnvironmentID: envID, OwnerEpoch: p.OwnerEpoch,
		LifecycleRevision: p.LifecycleRevision, RunEpoch: p.RunEpoch, RunID: p.RunID, Seq: p.Seq,
		LastAckedSeq: p.LastAckedSeq, Event: p.Event})
	if err != nil {
		return protocol.LiveEventResult{}, err
	}
	return protocol.LiveEventResult{AckedSeq: acked}, nil
}

// ownerCheck refuses a worker's write or read at epoch, given readErr and owner, the read of the
// session's active owner epoch: not-found for no such session, readErr itself, or epoch-mismatch.
func ownerCheck(readErr error, sessionID string, epoch, owner uint64) error {
	return bindingCheck(readErr, sessionID, protocol.Binding{OwnerEpoch: owner}, "", epoch, 0)
}

// bindingCheck refuses a worker's request for sessionID through envID at epoch and rev, given
// readErr and the session's binding b as read in the request's transaction: not-found for no such
// session, readErr itself, or as b.Refuse says (the hub's own check).
func bindingCheck(readErr error, sessionID string, b protocol.Binding, envID string, epoch, rev uint64) error {
	switch {
	case errors.Is(readErr, sql.ErrNoRows):
		return notFound(sessionID)
	case readErr != nil:
		return readErr
	}
	if e := b.Refuse(sessionID, envID, epoch, rev); e != nil {
		return &Error{Code: e.Code, Message: e.Message}
	}
	return nil
}

// workerSession reads the session for a worker at epoch: refused as ownerCheck says unless
// epoch is the session's active owner epoch.
func (s *Store) workerSession(ctx context.Context, sessionID string, epoch uint64) (Session, error) {
	ses, err := s.Get(ctx, sessionID)
	if err != nil {
		return Session{}, err
	}
	return ses, ownerCheck(nil, sessionID, epoch, ses.OwnerEpoch)
}

// WorkerResume serves worker.resume: the session's leaf, the newest transcript operation committed
// in the owner epoch and the live ACK cursor of the owner epoch's newest live stream. A stale owner
// epoch is epoch-mismatch.
func (s *Store) WorkerResume(ctx context.Context, p protocol.ResumeParams) (protocol.ResumeResult, error) {
	ses, err := s.workerSession(ctx, p.SessionID, p.OwnerEpoch)
	if err != nil {
		return protocol.ResumeResult{}, err
	}
	res := protocol.ResumeResult{SessionID: ses.ID, OwnerEpoch: ses.OwnerEpoch, LifecycleRevision: ses.LifecycleRevision, LeafID: ses.LeafID}
	err = s.db.R.QueryRowContext(ctx, `SELECT run_epoch, seq FROM transcript_commits WHERE session_id = ? AND owner_epoch = ?
		ORDER BY run_epoch DESC, seq DESC LIMIT 1`, p.SessionID, p.OwnerEpoch).Scan(&res.LastCommitted.RunEpoch, &res.LastCommitted.Seq)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return protocol.ResumeResult{}, fmt.Errorf("resume session %s: %w", p.SessionID, err)
	}
	ls, err := s.liveFor(ctx, p.SessionID)
	if err != nil {
		return protocol.ResumeResult{}, err
	}
	if err := ls.lock(ctx); err != nil {
		return protocol.ResumeResult{}, err
	}
	if ls.owner == p.OwnerEpoch {
		res.LiveAcked = protocol.StreamCursor{RunEpoch: ls.run, Seq: ls.acked}
	}
	ls.unlock()
	return res, nil
}

// WorkerContext serves worker.transcript.context once the caller has checked the binding: the
// session's messages (root first) and its leaf, for a worker that starts a run.
func (s *Store) WorkerContext(ctx context.Context, p protocol.TranscriptContextParams) (protocol.TranscriptContextResult, error) {
	ses, err := s.workerSession(ctx, p.SessionID, p.OwnerEpoch)
	if err != nil {
		return protocol.TranscriptContextResult{}, err
	}
	msgs, err := s.Context(ctx, p.SessionID)
	if err != nil {
		return protocol.TranscriptContextResult{}, err
	}
	if msgs == nil {
		msgs = []protocol.Message{}
	}
	return protocol.TranscriptContextResult{Messages: msgs, LeafID: ses.LeafID}, nil
}

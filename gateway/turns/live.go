package turns

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/openclaw/cloudworkers/gateway/placement"
	"github.com/openclaw/cloudworkers/gateway/store"
)

// A live move (placement.BusyLive) stops a running turn at its next model-call boundary and goes
// on with it, as the same run id, where the session rests next:
//
//  1. Yield asks the session's running run to stop at its next model call. The local loop checks
//     it before each call (catalogModel); a worker's call is answered protocol.CodeRunYield by the
//     hub (Yielding). A call already streaming finishes, its tools run and their results are
//     committed first: no tool runs twice, nothing of the transcript is written twice.
//  2. The run ends with lifecycle_yield and its turn is recorded moving. The turn's claim on the
//     placement is released, so the barrier's drain step passes; no message is admitted while a
//     turn of the session is moving.
//  3. Once the move rests (placement.DispatchConfig.AfterMove), ContinueMoved goes on with the
//     turn there: a run with a new run epoch and the same run id that opens with
//     lifecycle_resume and starts with a model call on the transcript. A move that rests nowhere
//     the turn can run (failed, reclaimed) ends the turn failed, naming why and what to do.
//
// The moving status is stored, so a gateway restarted mid-move goes on with the turn once the
// resumed move rests (ContinueAllMoved at start for those already at rest).

// Yield asks the session's running turn to stop at its next model call for a live move. It
// reports the run asked, or "" when no turn runs on this gateway.
func (s *Service) Yield(sessionID string) string {
	runID, err := s.runningRun(sessionID) // read before the lock: s.mu is never held across the database
	if err != nil || runID == "" {
		return ""
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.running[sessionID]; !ok {
		return ""
	}
	if again, err := s.runningRun(sessionID); err != nil || again != runID {
		return "" // ended (or another began) meanwhile
	}
	s.yielding[sessionID] = runID
	return runID
}

// runningRun returns the run id of the session's running turn row.
func (s *Service) runningRun(sessionID string) (string, error) {
	ids, err := store.Strings(s.ctx, s.cfg.DB.R, `SELECT run_id FROM turns WHERE session_id=? AND status=?`, sessionID, string(TurnRunning))
	if err != nil || len(ids) == 0 {
		return "", err
	}
	return ids[0], nil
}

// Unyield withdraws a live move's request to stop runID (a move that did not happen): the run
// goes on where it is. A run that has already stopped is moving; ContinueMoved goes on with it.
func (s *Service) Unyield(sessionID, runID string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.yielding[sessionID] == runID {
		delete(s.yielding, sessionID)
	}
}

// Yielding reports whether a live move asked the run to stop at its next model call; it is asked
// at that call (hub.Yields, the local loop's model), and a yes is recorded as granted: the run
// stops there even if the move withdraws its request a moment later.
func (s *Service) Yielding(sessionID, runID string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if runID == "" || s.yielding[sessionID] != runID {
		return false
	}
	s.granted[sessionID] = runID
	return true
}

// yieldGranted reports whether the run was answered run-yield at a model call (a lifecycle_yield
// that no model call was refused for is a worker's own doing).
func (s *Service) yieldGranted(sessionID, runID string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return runID != "" && s.granted[sessionID] == runID
}

// movingTurn returns the session's moving turn, if any.
func (s *Service) movingTurn(ctx context.Context, sessionID string) (Turn, bool, error) {
	t, err := scanTurn(s.cfg.DB.R.QueryRowContext(ctx, `SELECT `+turnCols+` FROM turns WHERE session_id=? AND status=? ORDER BY run_epoch DESC LIMIT 1`,
		sessionID, string(TurnMoving)))
	if errors.Is(err, sql.ErrNoRows) {
		return t, false, nil
	}
	return t, err == nil, err
}

// ContinueMoved goes on with the session's moving turn where the session rests now: on the gateway
// (local) or on its worker (active). A session still on its way (a move in flight) is left to the
// move's end; one that rests nowhere a turn runs (failed, reclaimed) ends the turn failed, naming
// why. It returns at once; the turn runs in the background.
func (s *Service) ContinueMoved(sessionID string) {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		if err := s.continueMoved(s.ctx, sessionID); err != nil && s.ctx.Err() == nil {
			s.log.Warn("continue a turn after a live move", "session", sessionID, "err", err)
		}
	}()
}

// ContinueAllMoved goes on with every moving turn whose session rests (a gateway that stopped
// between a live move's rest and its continuation); those still moving go on at the move's end.
func (s *Service) ContinueAllMoved(ctx context.Context) error {
	ids, err := store.Strings(ctx, s.cfg.DB.R, `SELECT DISTINCT session_id FROM turns WHERE status=?`, string(TurnMoving))
	if err != nil {
		return err
	}
	for _, id := range ids {
		s.ContinueMoved(id)
	}
	return nil
}

func (s *Service) continueMoved(ctx context.Context, sessionID string) error {
	t, ok, err := s.movingTurn(ctx, sessionID)
	if err != nil || !ok {
		return err
	}
	if s.cfg.Placements != nil {
		p, err := s.cfg.Placements.Get(ctx, sessionID)
		if err != nil {
			return err
		}
		switch p.State {
		case placement.Local, placement.Active:
		case placement.Failed, placement.Reclaimed:
			why := p.Error
			if why == "" {
				why = "no reason recorded"
			}
			s.endMoving(t, TurnFailed, fmt.Sprintf("the live move ended with the session's placement %s (%s), so the turn could not go on; its transcript is complete up to the move: send a message to carry on", p.State, why))
			return nil
		default:
			return nil // on its way: the move's end continues it
		}
	}
	sess, err := s.cfg.Sessions.Get(ctx, sessionID)
	if err != nil {
		return err
	}
	if _, err := s.begin(ctx, sess, "", "", t.RunID, &t); err != nil {
		if errors.Is(err, placement.ErrStale) || errors.Is(err, ErrPlacementMoving) {
			return nil // moved again meanwhile: that move's end continues it
		}
		s.endMoving(t, TurnFailed, "the turn could not go on after its live move: "+err.Error()+"; send a message to carry on")
		return err
	}
	s.log.Info("turn goes on after a live move", "session", sessionID, "run", t.RunID)
	return nil
}

// endMoving ends a moving turn (failed: it cannot go on; canceled: its user stopped it).
func (s *Service) endMoving(t Turn, status TurnStatus, msg string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(s.ctx), 10*time.Second)
	defer cancel()
	if err := s.cfg.DB.InTx(ctx, func(tx *sql.Tx) error {
		return transitionTurn(ctx, tx, s.clock().Now(), t.RunID, TurnMoving, status, msg)
	}); err != nil {
		s.log.Warn("end a moving turn", "run", t.RunID, "err", err)
		return
	}
	s.metrics.finished.WithLabelValues(t.Placement, string(status)).Inc()
	if s.cfg.Placements != nil {
		s.cfg.Placements.Changed(t.SessionID) // its end frees the session for messages
	}
}

// cancelMoving cancels the session's moving turn, if any.
func (s *Service) cancelMoving(sessionID string) bool {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(s.ctx), 10*time.Second)
	defer cancel()
	t, ok, err := s.movingTurn(ctx, sessionID)
	if err != nil || !ok {
		return false
	}
	s.endMoving(t, TurnCanceled, "canceled")
	return true
}

// continueTx records, in the admission transaction, that the moving turn cont goes on as t (its
// run id, with t's new run epoch and placement).
func (s *Service) continueTx(ctx context.Context, tx *sql.Tx, t *Turn, cont Turn) error {
	if !CanTransitionTurn(TurnMoving, TurnRunning) {
		return &TurnTransitionError{RunID: cont.RunID, From: TurnMoving, To: TurnRunning}
	}
	res, err := tx.ExecContext(ctx, `UPDATE turns SET status=?, run_epoch=?, placement=? WHERE run_id=? AND status=?`,
		string(TurnRunning), t.RunEpoch, t.Placement, cont.RunID, string(TurnMoving))
	if err != nil {
		return fmt.Errorf("turn %s goes on: %w", cont.RunID, err)
	}
	if n, _ := res.RowsAffected(); n != 1 {
		return fmt.Errorf("turn %s is no longer moving: %w", cont.RunID, placement.ErrStale)
	}
	t.IdempotencyKey, t.CreatedAt = cont.IdempotencyKey, cont.CreatedAt
	return turnEvent(ctx, tx, cont.RunID, store.FormatTime(s.clock().Now()), TurnMoving, TurnRunning, "goes on ("+t.Placement+") after a live move")
}

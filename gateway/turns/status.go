package turns

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"time"

	"github.com/openclaw/cloudworkers/gateway/store"
	"github.com/openclaw/cloudworkers/internal/clock"
)

// TurnStatus is a turn's status, stored as-is.
type TurnStatus string

// The turn statuses.
const (
	// TurnQueued is a turn waiting for its session's placement to become active (a message to a
	// reclaimed session); it is never stored: the row is written when the turn is admitted.
	TurnQueued   TurnStatus = "queued"
	TurnRunning  TurnStatus = "running"
	TurnDone     TurnStatus = "done"
	TurnFailed   TurnStatus = "failed"
	TurnCanceled TurnStatus = "canceled"
	// TurnMoving is a turn between owners in a live move: its run stopped at a model-call
	// boundary (its tool results committed), and the turn goes on from the transcript, as the
	// same run id, once the session rests on its next owner (or fails, naming why, if it cannot).
	TurnMoving TurnStatus = "moving"
)

// AllTurnStatuses lists every turn status.
var AllTurnStatuses = []TurnStatus{TurnQueued, TurnRunning, TurnMoving, TurnDone, TurnFailed, TurnCanceled}

// turnTransitions is the explicit table of legal moves of a stored turn: a running turn ends once,
// done, failed or canceled, or stops for a live move (moving) and runs again on the next owner. A
// queued turn is admitted (inserted as running), not moved.
var turnTransitions = map[TurnStatus][]TurnStatus{
	TurnQueued:   nil,
	TurnRunning:  {TurnDone, TurnFailed, TurnCanceled, TurnMoving},
	TurnMoving:   {TurnRunning, TurnFailed, TurnCanceled},
	TurnDone:     nil,
	TurnFailed:   nil,
	TurnCanceled: nil,
}

// Ongoing reports whether the turn has not ended yet: queued, running, or moving between owners
// in a live move (it goes on).
func (s TurnStatus) Ongoing() bool { return s == TurnQueued || s == TurnRunning || s == TurnMoving }

// Terminal reports whether the turn has ended: no move leaves a terminal status.
func (s TurnStatus) Terminal() bool { return s == TurnDone || s == TurnFailed || s == TurnCanceled }

// CanTransitionTurn reports whether a turn may move from → to.
func CanTransitionTurn(from, to TurnStatus) bool { return slices.Contains(turnTransitions[from], to) }

// TurnTransitionError is a turn move the table forbids, or one from a status the turn is no
// longer in.
type TurnTransitionError struct {
	RunID    string
	From, To TurnStatus
}

func (e *TurnTransitionError) Error() string {
	return fmt.Sprintf("turn %s: illegal status change %s → %s", e.RunID, e.From, e.To)
}

// transitionTurn moves the turn runID from → to inside tx at time at, with its event row. reason is the
// turn's error for failed and canceled; a terminal status records the finishing time.
func transitionTurn(ctx context.Context, tx *sql.Tx, at time.Time, runID string, from, to TurnStatus, reason string) error {
	if !CanTransitionTurn(from, to) {
		return &TurnTransitionError{RunID: runID, From: from, To: to}
	}
	now := store.FormatTime(at)
	finished := ""
	if to.Terminal() {
		finished = now
	}
	res, err := tx.ExecContext(ctx, `UPDATE turns SET status=?, error=?, finished_at=? WHERE run_id=? AND status=?`,
		string(to), reason, finished, runID, string(from))
	if err != nil {
		return fmt.Errorf("turn %s %s → %s: %w", runID, from, to, err)
	}
	if n, _ := res.RowsAffected(); n != 1 {
		var cur TurnStatus
		_ = tx.QueryRowContext(ctx, `SELECT status FROM turns WHERE run_id=?`, runID).Scan(&cur)
		return &TurnTransitionError{RunID: runID, From: cur, To: to}
	}
	return turnEvent(ctx, tx, runID, now, from, to, reason)
}

// turnEvent records one status change of a turn (from "" when the turn is admitted).
func turnEvent(ctx context.Context, tx *sql.Tx, runID, at string, from, to TurnStatus, reason string) error {
	if _, err := tx.ExecContext(ctx, `INSERT INTO turn_events(run_id, at, from_status, to_status, reason) VALUES(?,?,?,?,?)`,
		runID, at, string(from), string(to), reason); err != nil {
		return fmt.Errorf("turn %s event: %w", runID, err)
	}
	return nil
}

// failRunningTurns marks failed every turn left running by a gateway that died: a turn whose
// gateway died mid-call is retried as a new turn, never replayed into the provider.
func failRunningTurns(ctx context.Context, db *store.DB, clk clock.Clock) error {
	return db.InTx(ctx, func(tx *sql.Tx) error {
		ids, err := store.Strings(ctx, tx, `SELECT run_id FROM turns WHERE status=?`, string(TurnRunning))
		if err != nil {
			return err
		}
		for _, id := range ids {
			if err := transitionTurn(ctx, tx, clk.Now(), id, TurnRunning, TurnFailed, "the gateway stopped during this turn; send the message again to retry"); err != nil {
				return err
			}
		}
		return nil
	})
}

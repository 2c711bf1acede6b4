package turns

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/openclaw/cloudworkers/gateway/store"
	"github.com/openclaw/cloudworkers/gateway/store/storetest"
)

func TestTurnTransitionTableExhaustive(t *testing.T) {
	// Written out independently of the table in status.go: a running turn ends once, or stops
	// for a live move and runs again (or ends) from there.
	legal := map[[2]TurnStatus]bool{
		{TurnRunning, TurnDone}: true, {TurnRunning, TurnFailed}: true, {TurnRunning, TurnCanceled}: true,
		{TurnRunning, TurnMoving}: true, {TurnMoving, TurnRunning}: true, {TurnMoving, TurnFailed}: true, {TurnMoving, TurnCanceled}: true,
	}
	for _, from := range AllTurnStatuses {
		for _, to := range AllTurnStatuses {
			if got, want := CanTransitionTurn(from, to), legal[[2]TurnStatus{from, to}]; got != want {
				t.Errorf("CanTransitionTurn(%s, %s) = %v, want %v", from, to, got, want)
			}
		}
		if _, ok := turnTransitions[from]; !ok {
			t.Errorf("status %s missing from the table", from)
		}
		if from.Terminal() && len(turnTransitions[from]) > 0 {
			t.Errorf("terminal status %s has outgoing moves", from)
		}
	}
	if len(AllTurnStatuses) != 6 || len(turnTransitions) != len(AllTurnStatuses) {
		t.Fatalf("%d statuses, %d in the table", len(AllTurnStatuses), len(turnTransitions))
	}
	for s, want := range map[TurnStatus]bool{TurnQueued: false, TurnRunning: false, TurnMoving: false, TurnDone: true, TurnFailed: true, TurnCanceled: true} {
		if s.Terminal() != want {
			t.Errorf("%s.Terminal() = %v", s, !want)
		}
	}
}

// TestTransitionTurn: a turn's status changes only through the table, once (a second outcome for
// an ended turn is refused and changes nothing), each change with its event row.
func TestTransitionTurn(t *testing.T) {
	ctx := context.Background()
	db := storetest.Open(t)
	if _, err := db.W.ExecContext(ctx, `INSERT INTO turns(session_id, run_epoch, run_id, placement, model, status, created_at) VALUES('ses_1',1,'run_1','local','m','running',?)`, store.FormatTime(time.Now())); err != nil {
		t.Fatal(err)
	}
	move := func(from, to TurnStatus, reason string) error {
		return db.InTx(ctx, func(tx *sql.Tx) error { return transitionTurn(ctx, tx, time.Now(), "run_1", from, to, reason) })
	}
	if err := move(TurnRunning, TurnFailed, "the model refused"); err != nil {
		t.Fatal(err)
	}
	var te *TurnTransitionError
	if err := move(TurnRunning, TurnDone, ""); !errors.As(err, &te) || te.From != TurnFailed {
		t.Fatalf("a second outcome of an ended turn: %v, want a TurnTransitionError from failed", err)
	}
	if err := move(TurnFailed, TurnRunning, ""); !errors.As(err, &te) {
		t.Fatalf("failed → running: %v, want a TurnTransitionError", err)
	}
	var status, msg, finished string
	if err := db.R.QueryRowContext(ctx, `SELECT status, error, finished_at FROM turns WHERE run_id='run_1'`).Scan(&status, &msg, &finished); err != nil {
		t.Fatal(err)
	}
	if status != "failed" || msg != "the model refused" || finished == "" {
		t.Fatalf("turn row: %s %q finished %q", status, msg, finished)
	}
	var n int
	var from, to string
	if err := db.R.QueryRowContext(ctx, `SELECT COUNT(*), MAX(from_status), MAX(to_status) FROM turn_events WHERE run_id='run_1'`).Scan(&n, &from, &to); err != nil {
		t.Fatal(err)
	}
	if n != 1 || from != "running" || to != "failed" {
		t.Fatalf("turn events: %d (%s → %s), want one running → failed", n, from, to)
	}
}

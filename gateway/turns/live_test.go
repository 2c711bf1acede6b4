package turns

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/openclaw/cloudworkers/gateway/placement"
	"github.com/openclaw/cloudworkers/gateway/sessions"
	"github.com/openclaw/cloudworkers/internal/testrig/testenv"
)

// insertMoving inserts a turn of the session stopped between owners by a live move.
func insertMoving(ctx context.Context, t *testing.T, svc *Service, sessionID, runID string) {
	t.Helper()
	if _, err := svc.cfg.DB.W.ExecContext(ctx, `INSERT INTO turns(session_id, run_epoch, run_id, placement, model, status, created_at)
		VALUES(?,(SELECT COALESCE(MAX(run_epoch),0)+1 FROM turns WHERE session_id=?1),?,'local','local/m1',?,?)`,
		sessionID, runID, string(TurnMoving), "2026-12-07T00:00:00Z"); err != nil {
		t.Fatal(err)
	}
}

func waitStatus(ctx context.Context, t *testing.T, svc *Service, runID string, want TurnStatus) Turn {
	t.Helper()
	for {
		got, err := svc.Get(ctx, runID)
		if err != nil {
			t.Fatal(err)
		}
		if got.Status == want {
			return got
		}
		select {
		case <-ctx.Done():
			t.Fatalf("turn %s is %s, want %s", runID, got.Status, want)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// TestAMovingTurnHoldsItsSession: while a turn is between owners, a new message is refused as
// busy, naming the moving turn and how to stop it; the user's cancel ends it (canceled); a turn
// whose move rested nowhere it can run (the placement failed) ends failed, saying why and that
// the transcript is complete; and then a message is admitted again.
func TestAMovingTurnHoldsItsSession(t *testing.T) {
	ctx := testenv.Context(t, 30*time.Second)
	db, st, ps, cat := testDeps(t)
	svc := startService(ctx, t, Config{DB: db, Sessions: st, Catalog: cat, DataDir: t.TempDir(), Placements: ps})
	sess, err := st.Create(ctx, sessions.CreateParams{Workspace: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	insertMoving(ctx, t, svc, sess.ID, "run_moving")
	_, err = svc.Send(ctx, sess.ID, "hello", "")
	if !errors.Is(err, placement.ErrBusy) || !strings.Contains(err.Error(), "run_moving") || !strings.Contains(err.Error(), "session cancel") {
		t.Fatalf("a message while a turn moves: %v, want busy naming the turn and the cancel", err)
	}
	if !svc.Cancel(sess.ID) {
		t.Fatal("cancel found no turn to stop")
	}
	if got := waitStatus(ctx, t, svc, "run_moving", TurnCanceled); got.FinishedAt == "" {
		t.Fatalf("the canceled moving turn has no end time: %+v", got)
	}

	insertMoving(ctx, t, svc, sess.ID, "run_stranded")
	var gen uint64
	for _, c := range []placement.Change{{To: placement.Requested}, {To: placement.Failed, Error: "the lease was refused"}} {
		p, err := ps.Transition(ctx, sess.ID, gen, c)
		if err != nil {
			t.Fatal(err)
		}
		gen = p.Generation
	}
	svc.ContinueMoved(sess.ID)
	got := waitStatus(ctx, t, svc, "run_stranded", TurnFailed)
	if !strings.Contains(got.Error, "placement failed (the lease was refused)") || !strings.Contains(got.Error, "transcript is complete") {
		t.Fatalf("the stranded turn's error %q, want the placement's failure and what to do", got.Error)
	}
}

// TestYieldAsksOnlyTheRunningRun: Yield names the session's running run and Yielding answers for
// that run only; with no turn running there is nothing to ask, and Unyield withdraws the request.
func TestYieldAsksOnlyTheRunningRun(t *testing.T) {
	ctx := testenv.Context(t, 30*time.Second)
	db, st, ps, cat := testDeps(t)
	svc := startService(ctx, t, Config{DB: db, Sessions: st, Catalog: cat, DataDir: t.TempDir(), Placements: ps})
	sess, err := st.Create(ctx, sessions.CreateParams{Workspace: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if run := svc.Yield(sess.ID); run != "" {
		t.Fatalf("Yield of an idle session asked run %q", run)
	}
	// a turn held in admission: its row says running, its run is in the running set
	svc.mu.Lock()
	svc.running[sess.ID] = func() {}
	svc.mu.Unlock()
	if _, err := db.W.ExecContext(ctx, `INSERT INTO turns(session_id, run_epoch, run_id, placement, model, status, created_at) VALUES(?,1,'run_a','local','local/m1','running','2026-12-07T00:00:00Z')`, sess.ID); err != nil {
		t.Fatal(err)
	}
	if run := svc.Yield(sess.ID); run != "run_a" {
		t.Fatalf("Yield asked %q, want run_a", run)
	}
	if !svc.Yielding(sess.ID, "run_a") || svc.Yielding(sess.ID, "run_b") || svc.Yielding(sess.ID, "") {
		t.Fatal("Yielding answers for another run than the one asked")
	}
	svc.Unyield(sess.ID, "run_b")
	if !svc.Yielding(sess.ID, "run_a") {
		t.Fatal("withdrawing another run's request withdrew run_a's")
	}
	svc.Unyield(sess.ID, "run_a")
	if svc.Yielding(sess.ID, "run_a") {
		t.Fatal("the withdrawn request still stands")
	}
	svc.mu.Lock()
	delete(svc.running, sess.ID)
	svc.mu.Unlock()
}

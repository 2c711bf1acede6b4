package turns

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/openclaw/cloudworkers/gateway/placement"
	"github.com/openclaw/cloudworkers/internal/clock"
	"github.com/openclaw/cloudworkers/internal/testrig/testenv"
	"github.com/openclaw/cloudworkers/protocol"
)

// TestAMessageWaitsForTheCheckpoint: after each worker turn a checkpoint holds the session for a
// moment. Its sender saw the turn end, so a message that arrives then is admitted once the
// checkpoint lets go, not refused; a checkpoint that never lets go refuses it after
// checkpointWait, as busy.
func TestAMessageWaitsForTheCheckpoint(t *testing.T) {
	ctx := testenv.Context(t, 60*time.Second)
	db, st, ps, cat := testDeps(t)
	clk := clock.NewManual(time.Date(2026, 12, 7, 0, 0, 0, 0, time.UTC))
	w := &acceptingWorker{st: st, starts: map[string]protocol.TurnStartParams{}}
	svc := startService(ctx, t, Config{DB: db, Sessions: st, Catalog: cat, DataDir: t.TempDir(), Placements: ps, Workers: w, Clock: clk})
	sess := workerSession(ctx, t, st, ps)
	hold := func() {
		t.Helper()
		p, err := ps.Get(ctx, sess.ID)
		if err != nil {
			t.Fatal(err)
		}
		if err := ps.ClaimTurn(ctx, sess.ID, p.Generation, true, "checkpoint"); err != nil {
			t.Fatal(err)
		}
	}
	type result struct {
		turn Turn
		err  error
	}
	// waiting waits until the message waits on the clock (a timer more than base), failing if it
	// was answered instead.
	waiting := func(base int, got <-chan result) {
		t.Helper()
		wctx, cancel := context.WithCancel(ctx)
		defer cancel()
		go func() {
			select {
			case r := <-got:
				t.Errorf("a message during a checkpoint was answered at once: %+v %v", r.turn, r.err)
				cancel()
			case <-wctx.Done():
			}
		}()
		if err := clk.WaitTimers(wctx, base+1); err != nil {
			t.Fatal("the message is not waiting for the checkpoint")
		}
	}
	send := func() <-chan result {
		out := make(chan result, 1)
		go func() {
			turn, err := svc.Send(ctx, sess.ID, "next", "")
			out <- result{turn, err}
		}()
		return out
	}

	hold()
	base := clk.Pending()
	got := send()
	waiting(base, got)
	if err := ps.ReleaseTurn(ctx, sess.ID, "checkpoint"); err != nil {
		t.Fatal(err)
	}
	r := <-got
	if r.err != nil || r.turn.Status != TurnRunning || r.turn.Placement != "worker" {
		t.Fatalf("the message after the checkpoint: %+v %v, want a running worker turn", r.turn, r.err)
	}
	svc.Cancel(sess.ID)
	waitEnded(ctx, t, svc, r.turn.RunID)

	hold()
	base = clk.Pending()
	got = send()
	waiting(base, got)
	clk.Advance(checkpointWait)
	if r := <-got; !errors.Is(r.err, placement.ErrBusy) {
		t.Fatalf("a message behind a checkpoint that never ends: %+v %v, want busy", r.turn, r.err)
	}
}

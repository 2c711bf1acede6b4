package turns

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openclaw/cloudworkers/gateway/placement"
	"github.com/openclaw/cloudworkers/gateway/sessions"
	"github.com/openclaw/cloudworkers/internal/clock"
	"github.com/openclaw/cloudworkers/internal/testrig/testenv"
	"github.com/openclaw/cloudworkers/protocol"
)

// acceptingWorker is an admitted worker that acknowledges every turn start and answers a cancel by
// ending that run with a cancelled lifecycle event, as the real worker does.
type acceptingWorker struct {
	st *sessions.Store

	mu     sync.Mutex
	starts map[string]protocol.TurnStartParams // run → its start
}

func (w *acceptingWorker) Admitted(string) bool                       { return true }
func (w *acceptingWorker) WaitAdmitted(context.Context, string) error { return nil }
func (w *acceptingWorker) AdmissionChanged() <-chan struct{}          { return make(chan struct{}) }

func (w *acceptingWorker) Request(ctx context.Context, _, method string, params any) (json.RawMessage, error) {
	switch method {
	case protocol.MethodTurnStart:
		p := params.(protocol.TurnStartParams)
		w.mu.Lock()
		w.starts[p.RunID] = p
		w.mu.Unlock()
		return json.RawMessage(`{"accepted":true}`), nil
	case protocol.MethodTurnCancel:
		w.mu.Lock()
		p, ok := w.starts[params.(protocol.TurnCancelParams).RunID]
		w.mu.Unlock()
		if !ok {
			return nil, errors.New("cancel of a run never started")
		}
		return endCanceled(ctx, w.st, p)
	}
	return nil, errors.New("unexpected " + method)
}

// TestASendAndATurnsEndGetOneAnswer: messages that arrive while the session's running turn ends
// get one answer between them: exactly one is admitted, the others are refused busy, and every
// record of the running turn names that one run — the run the hub serves model and tool calls
// for (RunningTurn) and the placement's claim. The ended turn is recorded cancelled.
func TestASendAndATurnsEndGetOneAnswer(t *testing.T) {
	ctx := testenv.Context(t, 60*time.Second)
	db, st, ps, cat := testDeps(t)
	w := &acceptingWorker{st: st, starts: map[string]protocol.TurnStartParams{}}
	svc := startService(ctx, t, Config{DB: db, Sessions: st, Catalog: cat, DataDir: t.TempDir(), Placements: ps, Workers: w})
	sess := workerSession(ctx, t, st, ps)
	cur, err := svc.Send(ctx, sess.ID, "go", "")
	if err != nil {
		t.Fatal(err)
	}
	const senders = 8
	for round := range 15 {
		start := make(chan struct{})
		var wins atomic.Int32
		var won atomic.Value
		var wg sync.WaitGroup
		wg.Add(senders + 1)
		go func() {
			defer wg.Done()
			<-start
			svc.Cancel(sess.ID) // the running turn ends
		}()
		for range senders {
			go func() {
				defer wg.Done()
				<-start
				for wins.Load() == 0 && ctx.Err() == nil {
					turn, err := svc.Send(ctx, sess.ID, "next", "")
					if err == nil {
						wins.Add(1)
						won.Store(turn.RunID)
						return
					}
					if !errors.Is(err, placement.ErrBusy) {
						t.Errorf("round %d: a message was refused with %v, want busy", round, err)
						return
					}
				}
			}()
		}
		close(start)
		wg.Wait()
		if n := wins.Load(); n != 1 {
			t.Fatalf("round %d: %d messages admitted, want exactly 1", round, n)
		}
		next := won.Load().(string)
		if run, _, ok, err := svc.RunningTurn(ctx, sess.ID); err != nil || !ok || run != next {
			t.Fatalf("round %d: the hub would serve run %q (%v, %v), want the admitted %s", round, run, ok, err, next)
		}
		if p, err := ps.Get(ctx, sess.ID); err != nil || p.TurnRunID != next {
			t.Fatalf("round %d: the placement's claim is %q (%v), want the admitted %s", round, p.TurnRunID, err, next)
		}
		if got := waitEnded(ctx, t, svc, cur.RunID); got.Status != TurnCanceled {
			t.Fatalf("round %d: the ended turn %s is %s (%s), want canceled", round, cur.RunID, got.Status, got.Error)
		}
		cur = Turn{RunID: next}
	}
}

// waitEnded waits until turn runID is no longer running.
func waitEnded(ctx context.Context, t *testing.T, svc *Service, runID string) Turn {
	t.Helper()
	for {
		got, err := svc.Get(ctx, runID)
		if err != nil {
			t.Fatal(err)
		}
		if got.Status != TurnRunning && got.Status != TurnQueued {
			return got
		}
		if err := clock.Sleep(ctx, clock.Real, 5*time.Millisecond); err != nil {
			t.Fatalf("turn %s still %s: %v", runID, got.Status, err)
		}
	}
}

package turns

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openclaw/cloudworkers/gateway/sessions"
	"github.com/openclaw/cloudworkers/internal/clock"
	"github.com/openclaw/cloudworkers/internal/testrig/testenv"
	"github.com/openclaw/cloudworkers/protocol"
)

// fakeWorker is an admitted worker: it acknowledges worker.turn.start once started is closed, and
// answers a worker.turn.cancel (after failing the first failCancels, as a connection being replaced
// does) by ending the run with a cancelled lifecycle event, as the real worker does.
type fakeWorker struct {
	st          *sessions.Store
	started     chan struct{} // closed by the test to let the start be acknowledged
	failCancels int
	lostRun     bool // answers a cancel canceled:false, with no end event (a relaunched worker)

	mu       sync.Mutex
	start    protocol.TurnStartParams
	gotStart chan struct{}
	cancels  int
	down     bool          // the worker left (setDown)
	changed  chan struct{} // closed at each admission change
}

func (f *fakeWorker) Admitted(string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return !f.down
}

func (f *fakeWorker) WaitAdmitted(context.Context, string) error { return nil }

func (f *fakeWorker) AdmissionChanged() <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.changed == nil {
		f.changed = make(chan struct{})
	}
	return f.changed
}

// setDown makes the worker leave (or come back) and announces the change as the hub does.
func (f *fakeWorker) setDown(down bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.down = down
	if f.changed != nil {
		close(f.changed)
	}
	f.changed = make(chan struct{})
}

func (f *fakeWorker) Request(ctx context.Context, _, method string, params any) (json.RawMessage, error) {
	switch method {
	case protocol.MethodTurnStart:
		f.mu.Lock()
		f.start = params.(protocol.TurnStartParams)
		f.mu.Unlock()
		close(f.gotStart)
		select {
		case <-f.started:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		return json.RawMessage(`{"accepted":true}`), nil
	case protocol.MethodTurnCancel:
		f.mu.Lock()
		f.cancels++
		n, p := f.cancels, f.start
		f.mu.Unlock()
		if n <= f.failCancels {
			return nil, errors.New("worker.turn.cancel to worker of env_1: connection lost")
		}
		if f.lostRun {
			return json.RawMessage(`{"canceled":false}`), nil
		}
		return endCanceled(ctx, f.st, p)
	}
	return nil, errors.New("unexpected " + method)
}

// endCanceled ends the run of start as the real worker does when it is cancelled: a lifecycle
// error event, then the cancel's answer.
func endCanceled(ctx context.Context, st *sessions.Store, start protocol.TurnStartParams) (json.RawMessage, error) {
	if _, err := st.PublishLive(ctx, sessions.LiveParams{SessionID: start.SessionID, OwnerEpoch: start.OwnerEpoch,
		RunEpoch: start.RunEpoch, RunID: start.RunID, Seq: 1,
		Event: protocol.LiveEvent{Type: protocol.LiveLifecycleError, Error: "run: " + context.Canceled.Error()}}); err != nil {
		return nil, err
	}
	return json.RawMessage(`{"canceled":true}`), nil
}

func (f *fakeWorker) cancelsSeen() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.cancels
}

// TestWorkerTurnCancelIsNotLost: a cancel of a worker turn reaches the worker and ends the turn
// canceled when it comes while the worker has not yet acknowledged the start, and when the first
// attempts to deliver it fail because the worker's connection is being replaced.
func TestWorkerTurnCancelIsNotLost(t *testing.T) {
	for _, tc := range []struct {
		name          string
		duringStart   bool
		abandonStart  bool // the sender's context ends while the start is in flight
		failCancels   int
		wantCancelled int
	}{
		{name: "during-start", duringStart: true, wantCancelled: 1},
		{name: "connection-replaced", failCancels: 2, wantCancelled: 3},
		{name: "start-abandoned", abandonStart: true, wantCancelled: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testenv.Context(t, 60*time.Second)
			db, st, ps, cat := testDeps(t)
			w := &fakeWorker{st: st, started: make(chan struct{}), gotStart: make(chan struct{}), failCancels: tc.failCancels}
			svc := startService(ctx, t, Config{DB: db, Sessions: st, Catalog: cat, DataDir: t.TempDir(), Placements: ps, Workers: w})
			sess, err := st.Create(ctx, sessions.CreateParams{Workspace: t.TempDir()})
			if err != nil {
				t.Fatal(err)
			}
			env := "env_1"
			if _, err := st.Attach(ctx, sess.ID, env); err != nil {
				t.Fatal(err)
			}
			activate(ctx, t, ps, sess.ID, env)
			type sent struct {
				turn Turn
				err  error
			}
			res := make(chan sent, 1)
			sendCtx, abandon := context.WithCancel(ctx)
			defer abandon()
			go func() {
				turn, err := svc.Send(sendCtx, sess.ID, "take long", "")
				res <- sent{turn, err}
			}()
			<-w.gotStart
			switch {
			case tc.duringStart:
				if !svc.Cancel(sess.ID) {
					t.Fatal("Cancel of a turn whose start is in flight found no turn")
				}
				close(w.started)
			case tc.abandonStart:
				abandon()
			default:
				close(w.started)
			}
			r := <-res
			runID := r.turn.RunID
			switch {
			case tc.abandonStart:
				if r.err == nil {
					t.Fatal("a send whose context ended during the start reported success")
				}
				w.mu.Lock()
				runID = w.start.RunID
				w.mu.Unlock()
			case r.err != nil || r.turn.Placement != "worker":
				t.Fatalf("send: %+v, %v; want a worker turn", r.turn, r.err)
			case !tc.duringStart && !svc.Cancel(sess.ID):
				t.Fatal("Cancel of a running worker turn found no turn")
			}
			var last Turn
			testenv.Eventually(t, "the turn to end and its cancel to reach the worker", func() bool {
				last, err = svc.Get(ctx, runID)
				return err == nil && last.Status.Terminal() && w.cancelsSeen() >= tc.wantCancelled
			})
			if last.Status != TurnCanceled {
				t.Fatalf("turn %s (%s), want canceled", last.Status, last.Error)
			}
			if got := w.cancelsSeen(); got != tc.wantCancelled {
				t.Fatalf("the worker saw %d cancel requests, want %d", got, tc.wantCancelled)
			}
			if svc.Busy(sess.ID) {
				t.Fatal("the session is still busy after its turn ended")
			}
		})
	}
}

// A worker turn that ends with a lifecycle error records the worker's words printable and
// bounded: they go to the turn's row, its event and the gateway's log.
// workerTurn starts a turn on a session active on env_1, whose fakeWorker acknowledges at once.
func workerTurn(ctx context.Context, t *testing.T, mod func(*Config)) (*Service, *sessions.Store, *fakeWorker, sessions.Session, Turn) {
	t.Helper()
	db, st, ps, cat := testDeps(t)
	w := &fakeWorker{st: st, started: make(chan struct{}), gotStart: make(chan struct{})}
	close(w.started)
	cfg := Config{DB: db, Sessions: st, Catalog: cat, DataDir: t.TempDir(), Placements: ps, Workers: w}
	if mod != nil {
		mod(&cfg)
	}
	svc := startService(ctx, t, cfg)
	sess := workerSession(ctx, t, st, ps)
	turn, err := svc.Send(ctx, sess.ID, "go", "")
	if err != nil || turn.Placement != "worker" {
		t.Fatalf("send: %+v, %v; want a worker turn", turn, err)
	}
	return svc, st, w, sess, turn
}

func TestAWorkersErrorIsRecordedPrintableAndBounded(t *testing.T) {
	ctx := testenv.Context(t, 60*time.Second)
	svc, st, w, sess, turn := workerTurn(ctx, t, nil)
	hostile := "\x1b]0;owned\x07\x1b[2J" + strings.Repeat("B", 60<<10)
	w.mu.Lock()
	start := w.start
	w.mu.Unlock()
	if _, err := st.PublishLive(ctx, sessions.LiveParams{SessionID: sess.ID, OwnerEpoch: start.OwnerEpoch,
		RunEpoch: start.RunEpoch, RunID: turn.RunID, Seq: 1,
		Event: protocol.LiveEvent{Type: protocol.LiveLifecycleError, Error: hostile}}); err != nil {
		t.Fatal(err)
	}
	var last Turn
	var err error
	testenv.Eventually(t, "the turn to end", func() bool {
		last, err = svc.Get(ctx, turn.RunID)
		return err == nil && last.Status.Terminal()
	})
	if last.Status != TurnFailed || strings.ContainsAny(last.Error, "\x1b\x07") || len(last.Error) > 1024 || !strings.HasPrefix(last.Error, "]0;owned") {
		t.Fatalf("turn %s with error of %d bytes %.60q, want failed with the worker's words printable and bounded", last.Status, len(last.Error), last.Error)
	}
}

// A worker turn whose worker leaves and stays gone past the grace fails with the reason, noticed
// from the hub's admission changes (not a poll), also after a blip of the same worker before.
func TestWorkerTurnFailsWhenItsWorkerStaysGone(t *testing.T) {
	ctx := testenv.Context(t, 60*time.Second)
	svc, _, w, _, turn := workerTurn(ctx, t, func(c *Config) { c.WorkerGoneGrace = 200 * time.Millisecond })
	w.setDown(true)
	w.setDown(false) // a blip: back at once
	w.setDown(true)  // and gone for good
	var last Turn
	var err error
	testenv.Eventually(t, "the turn to fail once its worker stayed gone", func() bool {
		last, err = svc.Get(ctx, turn.RunID)
		return err == nil && last.Status.Terminal()
	})
	if last.Status != TurnFailed || !strings.Contains(last.Error, "disconnected during the turn") {
		t.Fatalf("turn %s (%s), want failed: its worker disconnected", last.Status, last.Error)
	}
}

// A worker that ends its run with lifecycle_yield when no live move asked for it cannot park the
// turn as moving (nothing would go on with it): the turn fails, saying so, and the session takes
// the next message.
func TestAYieldNobodyAskedForFailsTheTurn(t *testing.T) {
	ctx := testenv.Context(t, 60*time.Second)
	svc, st, w, sess, turn := workerTurn(ctx, t, nil)
	w.mu.Lock()
	start := w.start
	w.mu.Unlock()
	if _, err := st.PublishLive(ctx, sessions.LiveParams{SessionID: sess.ID, OwnerEpoch: start.OwnerEpoch,
		RunEpoch: start.RunEpoch, RunID: turn.RunID, Seq: 1, Event: protocol.LiveEvent{Type: protocol.LiveLifecycleYield}}); err != nil {
		t.Fatal(err)
	}
	var last Turn
	testenv.Eventually(t, "the turn to end", func() bool {
		var err error
		last, err = svc.Get(ctx, turn.RunID)
		return err == nil && last.Status != TurnRunning
	})
	if last.Status != TurnFailed || !strings.Contains(last.Error, "nobody asked for") {
		t.Fatalf("turn %s (%s), want failed: a yield nobody asked for", last.Status, last.Error)
	}
	testenv.Eventually(t, "the session to be free", func() bool { return !svc.Busy(sess.ID) })
}

// A cancel of a worker turn whose worker no longer has the run (it answers canceled:false and no
// end event ever comes) ends the turn canceled once the end has had its wait, instead of leaving it
// running for good.
func TestCancelOfARunTheWorkerLostEndsTheTurn(t *testing.T) {
	ctx := testenv.Context(t, 60*time.Second)
	clk := clock.NewManual(time.Date(2026, 12, 7, 0, 0, 0, 0, time.UTC))
	svc, _, w, sess, turn := workerTurn(ctx, t, func(c *Config) { c.Clock = clk })
	w.mu.Lock()
	w.lostRun = true
	w.mu.Unlock()
	if !svc.Cancel(sess.ID) {
		t.Fatal("cancel found no turn")
	}
	testenv.Eventually(t, "the cancel to reach the worker", func() bool { return w.cancelsSeen() == 1 })
	var last Turn
	testenv.Eventually(t, "the turn to end", func() bool {
		clk.Advance(time.Second) // past lostEndWait, a second at a time
		var err error
		last, err = svc.Get(ctx, turn.RunID)
		return err == nil && last.Status.Terminal()
	})
	if last.Status != TurnCanceled || !strings.Contains(last.Error, "no longer ran it") {
		t.Fatalf("turn %s (%s), want canceled: its worker no longer ran it", last.Status, last.Error)
	}
}

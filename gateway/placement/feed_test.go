package placement

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/openclaw/cloudworkers/gateway/sessions"
	"github.com/openclaw/cloudworkers/internal/testrig/testenv"
)

// TestPlacementChangesAreOnTheFeed: every committed change of a placement (a transition, a turn
// claimed and let go, a step noted) is one placement.updated change of the session on the
// gateway-wide feed, which the Control UI follows instead of polling; a refused move (a stale
// generation) and a release of a claim the session does not hold are not.
func TestPlacementChangesAreOnTheFeed(t *testing.T) {
	ctx := testenv.Context(t, 10*time.Second)
	ps := openPlacements(t)
	st := openSessions(t, ps)
	ps.Notify = st.Notify
	sub := st.SubscribeChanges(0)
	defer sub.Close()
	next := func(what string) *sessions.Change {
		t.Helper()
		select {
		case c := <-sub.C():
			return c
		case <-ctx.Done():
			t.Fatalf("%s: nothing on the feed", what)
			return nil
		}
	}
	const id = "ses_feed"
	if _, err := ps.Transition(ctx, id, 1, Change{To: Requested}); !errors.Is(err, ErrStale) {
		t.Fatalf("stale move: %v, want ErrStale", err)
	}
	if err := ps.ReleaseTurn(ctx, id, "run_nobody"); err != nil {
		t.Fatal(err)
	}
	if err := ps.ClaimTurn(ctx, id, 0, false, "run_1"); err != nil {
		t.Fatal(err)
	}
	if c := next("claim"); c.Kind != ChangePlacementUpdated || c.ID != id {
		t.Fatalf("first change on the feed %s %s, want %s %s (the refused move and the empty release are not changes)", c.Kind, c.ID, ChangePlacementUpdated, id)
	}
	if err := ps.ReleaseTurn(ctx, id, "run_1"); err != nil {
		t.Fatal(err)
	}
	if c := next("release"); c.Kind != ChangePlacementUpdated || c.ID != id {
		t.Fatalf("after release: %s %s", c.Kind, c.ID)
	}
	if _, err := ps.Transition(ctx, id, 0, Change{To: Requested, Reason: "dispatch"}); err != nil {
		t.Fatal(err)
	}
	if c := next("transition"); c.Kind != ChangePlacementUpdated || c.ID != id {
		t.Fatalf("after a transition: %s %s", c.Kind, c.ID)
	}
	ps.Note(ctx, id, "a step")
	if c := next("note"); c.Kind != ChangePlacementUpdated || c.ID != id {
		t.Fatalf("after a note: %s %s", c.Kind, c.ID)
	}
}

// TestCloseIsBoundedByItsContext: a placement step that does not stop when cancelled cannot hold
// the gateway's shutdown past its deadline; Close names what still runs, and once the step has
// ended it returns nil.
func TestCloseIsBoundedByItsContext(t *testing.T) {
	d := NewDispatcher(DispatchConfig{Placements: openPlacements(t)})
	d.wg.Add(1) // a step that ignores its cancellation
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := d.Close(ctx); err == nil || !strings.Contains(err.Error(), "placement steps still running") {
		t.Fatalf("Close past its deadline with a step running: %v, want an error naming the placement steps", err)
	}
	d.wg.Done()
	if err := d.Close(testenv.Context(t, 10*time.Second)); err != nil {
		t.Fatalf("Close once every step ended: %v", err)
	}
}

// TestAwait: Await returns once done holds, asking again at each committed change of the
// placement (with no poll); done's error ends it; a context that ends first is its error.
func TestAwait(t *testing.T) {
	ctx := testenv.Context(t, 10*time.Second)
	ps := openPlacements(t)
	const id = "ses_await"
	calls := 0
	asked := make(chan struct{})
	got := make(chan error, 1)
	go func() {
		got <- ps.Await(ctx, id, 0, func() (bool, error) {
			calls++
			if calls == 1 {
				defer close(asked)
			}
			p, err := ps.Get(ctx, id)
			return err == nil && p.State == Requested, err
		})
	}()
	<-asked // asked once, before the change
	if _, err := ps.Transition(ctx, id, 0, Change{To: Requested}); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil || calls != 2 {
		t.Fatalf("Await: %v after %d calls of done, want nil after 2 (now and after the change)", err, calls)
	}
	boom := errors.New("boom")
	if err := ps.Await(ctx, id, 0, func() (bool, error) { return false, boom }); !errors.Is(err, boom) {
		t.Fatalf("Await with a failing done: %v", err)
	}
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	polls := 0
	if err := ps.Await(short, id, time.Millisecond, func() (bool, error) { polls++; return false, nil }); !errors.Is(err, context.DeadlineExceeded) || polls < 2 {
		t.Fatalf("Await past its context: %v after %d polls, want the deadline after several", err, polls)
	}
}

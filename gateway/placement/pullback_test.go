package placement

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// TestPullBackRetriesOnlyAFailedReconciliation: a second pull-back retries the reconciliation of a
// session whose reconciliation failed (with the confirmation when forced), but not a later
// dispatch that failed before any reconciliation, even after an earlier full cycle left the
// barrier at its last step.
func TestPullBackRetriesOnlyAFailedReconciliation(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name      string
		secondRun bool // a second dispatch that fails while provisioning
		wantRetry bool
	}{{"failed reconciliation", false, true}, {"failed later dispatch", true, false}} {
		t.Run(tc.name, func(t *testing.T) {
			ps := openPlacements(t)
			s := "ses_1"
			env, anchor, base := "env_1", "/anchors/ses_1/workspace", "/anchors/ses_1/base-3.json"
			step := func(n int) *int { return &n }
			var gen uint64
			mv := func(c Change) {
				t.Helper()
				p, err := ps.Transition(ctx, s, gen, c)
				if err != nil {
					t.Fatal(err)
				}
				gen = p.Generation
			}
			mv(Change{To: Requested})
			mv(Change{To: Provisioning, EnvironmentID: &env})
			mv(Change{To: Syncing})
			mv(Change{To: Starting, AnchorDir: &anchor, BaseManifestID: &base})
			mv(Change{To: Active, OwnerEpoch: 2})
			mv(Change{To: Draining, BarrierStep: step(1)})
			mv(Change{To: Reconciling, OwnerEpoch: 3, BarrierStep: step(6)})
			if tc.secondRun {
				mv(Change{To: Local, BarrierStep: step(8)})
				env2 := "env_2"
				mv(Change{To: Requested})
				mv(Change{To: Provisioning, EnvironmentID: &env2})
				mv(Change{To: Failed, Error: "environment env_2 is failed"})
			} else {
				mv(Change{To: Failed, Error: "the box deleted 3 of 4 files"})
			}
			ps.Note(ctx, s, "a note after the failure keeps the state")

			dctx, cancel := context.WithCancel(ctx)
			cancel() // the kicked step stops at once
			d := &Dispatcher{cfg: DispatchConfig{Placements: ps}, log: slog.New(slog.DiscardHandler), ctx: dctx, cancel: cancel, active: map[string]bool{}}
			p, err := d.PullBack(ctx, s, true)
			d.wg.Wait()
			if tc.wantRetry {
				if err != nil || p.State != Reconciling || !d.takeForce(s) {
					t.Fatalf("retry: state %s, forced %v, err %v; want reconciling with the confirmation", p.State, d.force[s], err)
				}
				return
			}
			if err == nil || p.State == Reconciling || d.force[s] {
				t.Fatalf("a dispatch that failed while provisioning went to %s (forced %v, err %v)", p.State, d.force[s], err)
			}
		})
	}
}

// activeWithACheckpoint makes session s active on a worker with a checkpoint holding its turn,
// and a dispatcher whose kicked steps stop at once; it returns the placement's generation.
func activeWithACheckpoint(t *testing.T, s string) (*Placements, *Dispatcher, uint64) {
	t.Helper()
	ctx := context.Background()
	ps := openPlacements(t)
	env, anchor, base := "env_1", "/anchors/"+s+"/workspace", "/anchors/"+s+"/base-3.json"
	var gen uint64
	for _, c := range []Change{{To: Requested}, {To: Provisioning, EnvironmentID: &env}, {To: Syncing},
		{To: Starting, AnchorDir: &anchor, BaseManifestID: &base}, {To: Active, OwnerEpoch: 2}} {
		p, err := ps.Transition(ctx, s, gen, c)
		if err != nil {
			t.Fatal(err)
		}
		gen = p.Generation
	}
	if err := ps.ClaimTurn(ctx, s, gen, true, checkpointRun); err != nil {
		t.Fatal(err)
	}
	dctx, cancel := context.WithCancel(ctx)
	cancel() // the kicked step stops at once
	return ps, &Dispatcher{cfg: DispatchConfig{Placements: ps}, log: slog.New(slog.DiscardHandler), ctx: dctx, cancel: cancel, active: map[string]bool{}}, gen
}

// TestPullBackWaitsForACheckpoint: a pull-back asked for while a checkpoint holds the session (it
// is bringing the box's work into the anchor) leaves active only once the checkpoint recorded its
// base and let go. Leaving at once made the checkpoint's record stale (refused), and the
// reconciliation then found the anchor "drifted" from the old base by exactly the worker's work.
func TestPullBackWaitsForACheckpoint(t *testing.T) {
	ctx := context.Background()
	s := "ses_1"
	ps, d, gen := activeWithACheckpoint(t, s)
	type result struct {
		p   Placement
		err error
	}
	done := make(chan result, 1)
	go func() {
		p, err := d.PullBack(ctx, s, false)
		done <- result{p, err}
	}()
	select {
	case r := <-done:
		t.Fatalf("pull-back went ahead while a checkpoint held the session: %s, %v", r.p.State, r.err)
	case <-time.After(300 * time.Millisecond):
	}
	// The checkpoint ends as it would: its base recorded at the generation it claimed.
	next := "/anchors/ses_1/base-5-cp1.json"
	if err := ps.RecordBase(ctx, s, checkpointRun, gen, next, "checkpoint 1: 2 files"); err != nil {
		t.Fatalf("the checkpoint's base: %v", err)
	}
	if err := ps.ReleaseTurn(ctx, s, checkpointRun); err != nil {
		t.Fatal(err)
	}
	var r result
	select {
	case r = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("pull-back still waiting after the checkpoint let go")
	}
	d.wg.Wait()
	if r.err != nil || r.p.State != Draining || r.p.BaseManifestID != next {
		t.Fatalf("pull-back: %s with base %q, %v; want draining from the checkpoint's base", r.p.State, r.p.BaseManifestID, r.err)
	}
}

// TestPullBackGivesUpOnALongCheckpoint: a checkpoint that holds the session longer than
// DispatchConfig.CheckpointWait gets the pull-back a busy answer that says why, and the session
// stays active.
func TestPullBackGivesUpOnALongCheckpoint(t *testing.T) {
	ctx := context.Background()
	s := "ses_1"
	ps, d, _ := activeWithACheckpoint(t, s)
	d.cfg.CheckpointWait = 300 * time.Millisecond
	_, err := d.PullBack(ctx, s, true)
	if !errors.Is(err, ErrBusy) || !strings.Contains(err.Error(), "checkpoint") {
		t.Fatalf("err = %v, want busy with a checkpoint", err)
	}
	if p, err := ps.Get(ctx, s); err != nil || p.State != Active || d.force[s] {
		t.Fatalf("after giving up: %s (forced %v, %v), want still active, no confirmation left", p.State, d.force[s], err)
	}
}

package placement

import (
	"context"
	"log/slog"
	"testing"
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

package placement

import (
	"context"
	"errors"
	"strings"
	"testing"
)

// walk records the transitions of states on a session, from local.
func walk(t *testing.T, ps *Placements, id string, states ...State) Placement {
	t.Helper()
	ctx := context.Background()
	var p Placement
	for _, st := range states {
		var err error
		c := Change{To: st, Reason: "to " + string(st)}
		if st == Failed {
			c.Error = "it broke"
		}
		if st == Starting {
			a := "/anchors/" + id + "/workspace"
			c.AnchorDir = &a
		}
		if p, err = ps.Transition(ctx, id, p.Generation, c); err != nil {
			t.Fatal(err)
		}
	}
	return p
}

// TestFailedPlacementRefusesTurns: no turn is admitted on a failed placement (the gateway would run
// it in the user's own checkout), and the refusal names the failure and the recovery for each step
// that can fail.
func TestFailedPlacementRefusesTurns(t *testing.T) {
	ctx := context.Background()
	cases := []struct {
		name  string
		walk  []State
		ws    string
		wants []string
	}{
		{"dispatch", []State{Requested, Provisioning, Failed}, "/home/me/src",
			[]string{"dispatch to a worker of profile P failed: it broke", "session dispatch ses_1 --profile P", "session move ses_1 --local", "/home/me/src"}},
		{"pull-back", []State{Requested, Provisioning, Syncing, Starting, Active, Draining, Reconciling, Failed}, "/home/me/src",
			[]string{"pull-back from the worker failed: it broke", "move ses_1 --local --force", "abandons the worker's results", "/anchors/ses_1/workspace"}},
		{"redispatch after reclaim", []State{Requested, Provisioning, Syncing, Starting, Active, Reclaimed, Requested, Provisioning, Failed}, "/home/me/src",
			[]string{"dispatch to a worker of profile P failed", "session move ses_1 --local", "/anchors/ses_1/workspace"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ps := openPlacements(t)
			p := walk(t, ps, "ses_1", c.walk...)
			err := ps.ClaimTurn(ctx, "ses_1", p.Generation, false, "run_1")
			if !errors.Is(err, ErrPlacementFailed) {
				t.Fatalf("local turn on a failed placement: %v, want ErrPlacementFailed", err)
			}
			if got, _ := ps.Get(ctx, "ses_1"); got.TurnRunID != "" {
				t.Fatalf("the refused turn holds the claim: %q", got.TurnRunID)
			}
			msg := ps.FailedError(ctx, p, c.ws).Error()
			for _, w := range c.wants {
				if !strings.Contains(msg, w) {
					t.Errorf("refusal %q does not say %q", msg, w)
				}
			}
		})
	}
}

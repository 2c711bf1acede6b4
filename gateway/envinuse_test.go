package gateway

import (
	"context"
	"testing"
	"time"

	"github.com/openclaw/cloudworkers/gateway/placement"
	"github.com/openclaw/cloudworkers/gateway/store"
)

// An environment a session is still moving onto (ready, not yet attached: the sync runs on its
// box) is in use: the idle policy must not stop it under the dispatch. Found when an idleTimeout
// of 1s stopped the environment of a session whose sync took longer than that.
func TestEnvironmentInUseWhileASessionMoves(t *testing.T) {
	now, hold := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC), 40*time.Minute
	for _, tc := range []struct {
		state placement.State
		turn  string
		busy  bool
		want  bool
	}{
		{placement.Provisioning, "", false, true},
		{placement.Syncing, "", false, true},
		{placement.Starting, "", false, true},
		{placement.Draining, "", false, true},
		{placement.Reconciling, "", false, true},
		{placement.Active, "", false, false},
		{placement.Active, "run_1", false, true},
		{placement.Active, "", true, true},
	} {
		served := func(context.Context, string) ([]placement.Placement, error) {
			return []placement.Placement{{SessionID: "ses_1", State: tc.state, TurnRunID: tc.turn, UpdatedAt: store.FormatTime(now.Add(-time.Minute))}}, nil
		}
		if got := envInUse(served, func(string) bool { return tc.busy }, "env_1", now, hold); got != tc.want {
			t.Errorf("a session %s (turn %q, busy %v): in use %v, want %v", tc.state, tc.turn, tc.busy, got, tc.want)
		}
	}
	none := func(context.Context, string) ([]placement.Placement, error) { return nil, nil }
	if envInUse(none, func(string) bool { return true }, "env_1", now, hold) {
		t.Error("an environment no session is on is in use")
	}
	// a move stuck past its longest step no longer holds a paid machine
	stuck := func(context.Context, string) ([]placement.Placement, error) {
		return []placement.Placement{{SessionID: "ses_1", State: placement.Syncing, UpdatedAt: store.FormatTime(now.Add(-hold - time.Second))}}, nil
	}
	if envInUse(stuck, func(string) bool { return false }, "env_1", now, hold) {
		t.Error("a move stuck for longer than the hold keeps its environment in use")
	}
}

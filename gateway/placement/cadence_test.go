package placement

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/openclaw/cloudworkers/gateway/envs"
	"github.com/openclaw/cloudworkers/gateway/profiles"
	"github.com/openclaw/cloudworkers/internal/clock"
	"github.com/openclaw/cloudworkers/internal/testrig/testenv"
	"github.com/openclaw/cloudworkers/providers"
	"github.com/openclaw/cloudworkers/providers/fake"
)

// TestCheckpointCadenceIsProfilePolicy: with checkpoint.every "turn" (the default) every worker
// turn is followed by a checkpoint; with "10m" a turn is followed by one only once the last is
// ten minutes old.
func TestCheckpointCadenceIsProfilePolicy(t *testing.T) {
	ctx := testenv.Context(t, 20*time.Second)
	ps := openPlacements(t)
	clk := clock.NewManual(time.Now())
	ps.Clock = clk
	reg := providers.Registry{"fake": fake.New()}
	prof := profiles.New(ps.db, reg, nil)
	for id, every := range map[string]string{"turn": "", "slow": "10m"} {
		if _, err := prof.Put(ctx, &providers.Profile{ID: id, Provider: "fake", Checkpoint: providers.Checkpoint{Every: every}}); err != nil {
			t.Fatal(err)
		}
	}
	mgr := envs.New(envs.Config{DB: ps.db, Profiles: prof, Providers: reg, GatewayID: "gw", SweepInterval: -1, LifecycleInterval: -1, Clock: clk})
	if err := mgr.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = mgr.Close(context.Background()) })
	d := &Dispatcher{cfg: DispatchConfig{Placements: ps, Envs: mgr, Clock: clk}, log: slog.New(slog.DiscardHandler), active: map[string]bool{}}
	session := func(profile string) string {
		e, _, err := mgr.Create(ctx, profile, "")
		if err != nil {
			t.Fatal(err)
		}
		sid := "ses_" + profile
		env := e.ID
		if _, err := ps.Transition(ctx, sid, 0, Change{To: Requested}); err != nil {
			t.Fatal(err)
		}
		if _, err := ps.Transition(ctx, sid, 1, Change{To: Provisioning, EnvironmentID: &env}); err != nil {
			t.Fatal(err)
		}
		return sid
	}
	every, slow := session("turn"), session("slow")
	for _, sid := range []string{every, slow} {
		if !d.checkpointDue(ctx, sid) {
			t.Fatalf("%s: the first turn is not followed by a checkpoint", sid)
		}
		ps.Note(ctx, sid, "checkpoint 1: 3 files")
	}
	clk.Advance(4 * time.Minute)
	if !d.checkpointDue(ctx, every) {
		t.Fatal(`checkpoint.every "turn": a turn 4 minutes after the last checkpoint is not followed by one`)
	}
	if d.checkpointDue(ctx, slow) {
		t.Fatal(`checkpoint.every "10m": a turn 4 minutes after the last checkpoint is followed by one`)
	}
	clk.Advance(7 * time.Minute)
	if !d.checkpointDue(ctx, slow) {
		t.Fatal(`checkpoint.every "10m": a turn 11 minutes after the last checkpoint is not followed by one`)
	}
}

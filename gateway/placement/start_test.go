package placement

import (
	"context"
	"log/slog"
	"strings"
	"testing"

	"github.com/openclaw/cloudworkers/gateway/envs"
	"github.com/openclaw/cloudworkers/gateway/sessions"
)

// TestStartBindsOnlyWithTheTransition: the start step binds the session, attaches the environment
// and makes the placement active in one transaction. When the attach fails (here the environment
// is gone), the placement fails and the session is not left bound to the environment (nor its
// owner epoch advanced) as if a worker owned it.
func TestStartBindsOnlyWithTheTransition(t *testing.T) {
	ctx := context.Background()
	ps := openPlacements(t)
	st := openSessions(t, ps)
	ses, err := st.Create(ctx, sessions.CreateParams{Title: "start", Workspace: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	env := "env_gone"
	var gen uint64
	for _, c := range []Change{{To: Requested}, {To: Provisioning, EnvironmentID: &env}, {To: Syncing}, {To: Starting}} {
		p, err := ps.Transition(ctx, ses.ID, gen, c)
		if err != nil {
			t.Fatal(err)
		}
		gen = p.Generation
	}
	d := &Dispatcher{cfg: DispatchConfig{Placements: ps, Sessions: st, Envs: envs.New(envs.Config{DB: ps.db}),
		Admitted: func(string) bool { return true }}, log: slog.New(slog.DiscardHandler), active: map[string]bool{}}
	if err := d.advance(ctx, ses.ID); err != nil {
		t.Fatal(err)
	}
	p, err := ps.Get(ctx, ses.ID)
	if err != nil {
		t.Fatal(err)
	}
	if p.State != Failed || !strings.Contains(p.Error, env) {
		t.Fatalf("placement %s (%q), want failed naming %s", p.State, p.Error, env)
	}
	got, err := st.Get(ctx, ses.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.EnvironmentID != "" || got.Placement != sessions.PlacementLocal || got.OwnerEpoch != ses.OwnerEpoch {
		t.Fatalf("session after a failed start: bound to %q (%s), owner epoch %d; want unbound at epoch %d",
			got.EnvironmentID, got.Placement, got.OwnerEpoch, ses.OwnerEpoch)
	}
}

// TestThePlacementShowsTheSessionsOwnerEpoch: the owner epoch is stored once, in the session's
// row. A fence that is not a placement transition (a discard advances the epoch on its own) shows
// in the placement at once, as does the epoch a transition's binding advanced to.
func TestThePlacementShowsTheSessionsOwnerEpoch(t *testing.T) {
	ctx := context.Background()
	ps := openPlacements(t)
	st := openSessions(t, ps)
	ses, err := st.Create(ctx, sessions.CreateParams{Title: "epoch", Workspace: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	check := func(when string, want uint64) {
		t.Helper()
		p, err := ps.Get(ctx, ses.ID)
		if err != nil {
			t.Fatal(err)
		}
		s, err := st.Get(ctx, ses.ID)
		if err != nil {
			t.Fatal(err)
		}
		if p.OwnerEpoch != want || s.OwnerEpoch != want {
			t.Fatalf("%s: placement epoch %d, session epoch %d; want both %d", when, p.OwnerEpoch, s.OwnerEpoch, want)
		}
	}
	check("never dispatched", ses.OwnerEpoch)
	if _, err := st.AdvanceOwnerEpoch(ctx, ses.ID); err != nil {
		t.Fatal(err)
	}
	check("fenced before any placement row", ses.OwnerEpoch+1)
	env := "env_1"
	d := &Dispatcher{cfg: DispatchConfig{Placements: ps, Sessions: st}}
	var gen uint64
	for _, c := range []Change{{To: Requested}, {To: Provisioning, EnvironmentID: &env}, {To: Syncing}, {To: Starting},
		{To: Active, Also: d.unbind(ses.ID, "bound at %d")}} {
		p, err := ps.Transition(ctx, ses.ID, gen, c)
		if err != nil {
			t.Fatal(err)
		}
		gen = p.Generation
	}
	check("after a binding transition", ses.OwnerEpoch+2)
	if _, err := st.AdvanceOwnerEpoch(ctx, ses.ID); err != nil { // a discard's fence
		t.Fatal(err)
	}
	check("after a discard's fence", ses.OwnerEpoch+3)
}

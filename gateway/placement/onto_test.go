package placement

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/openclaw/cloudworkers/gateway/envs"
	"github.com/openclaw/cloudworkers/gateway/profiles"
	"github.com/openclaw/cloudworkers/gateway/sessions"
	"github.com/openclaw/cloudworkers/gateway/store"
)

// openSessions is the session store on the placements' database.
func openSessions(t *testing.T, ps *Placements) *sessions.Store {
	t.Helper()
	st, err := sessions.New(sessions.Config{DB: ps.db})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close(context.Background()) })
	return st
}

// putEnv records an environment row in state (what the environment manager would have written).
func putEnv(t *testing.T, ps *Placements, id, key string, state envs.State) {
	t.Helper()
	now := ps.now()
	var k any
	if key != "" {
		k = key
	}
	_, err := ps.db.W.Exec(`INSERT INTO environments(id, profile_id, provider_id, idempotency_key, operation_id, state, profile_snapshot,
		created_at, updated_at, last_activity_at) VALUES(?,?,?,?,?,?,?,?,?,?)`, id, "local", "local", k, "op-"+id, string(state),
		`{"id":"local","provider":"local"}`, now, now, now)
	if err != nil {
		t.Fatal(err)
	}
}

// TestDispatchToEnvironmentRefusesBeforeAnyMove: a dispatch onto an environment that is unknown,
// not ready, whose worker is not admitted, or that serves another session — or of a session with
// no workspace — is refused naming why, and the placement is not moved.
func TestDispatchToEnvironmentRefusesBeforeAnyMove(t *testing.T) {
	ctx := context.Background()
	ps := openPlacements(t)
	st := openSessions(t, ps)
	ses, err := st.Create(ctx, sessions.CreateParams{Title: "onto", Workspace: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	bare, err := st.Create(ctx, sessions.CreateParams{Title: "no workspace"})
	if err != nil {
		t.Fatal(err)
	}
	other, err := st.Create(ctx, sessions.CreateParams{Title: "other", Workspace: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	putEnv(t, ps, "env_ready", "", envs.Ready)
	putEnv(t, ps, "env_boot", "", envs.Bootstrapping)
	putEnv(t, ps, "env_away", "", envs.Ready)
	putEnv(t, ps, "env_taken", "", envs.Attached)
	taken := "env_taken"
	var gen uint64
	for _, c := range []Change{{To: Requested}, {To: Provisioning, EnvironmentID: &taken}, {To: Syncing}, {To: Starting}, {To: Active}} {
		p, err := ps.Transition(ctx, other.ID, gen, c)
		if err != nil {
			t.Fatal(err)
		}
		gen = p.Generation
	}
	d := &Dispatcher{cfg: DispatchConfig{Placements: ps, Sessions: st, Envs: envs.New(envs.Config{DB: ps.db}),
		Admitted: func(id string) bool { return id != "env_away" }}, log: slog.New(slog.DiscardHandler), active: map[string]bool{}}
	for _, tc := range []struct {
		name, session, env, want string
		is                       error
	}{
		{"unknown environment", ses.ID, "env_nope", "env_nope", store.ErrNotFound},
		{"not ready", ses.ID, "env_boot", "env_boot is bootstrapping, not ready", ErrEnvironmentUnusable},
		{"worker not admitted", ses.ID, "env_away", "worker of environment env_away is not admitted", ErrEnvironmentUnusable},
		{"serves another session", ses.ID, "env_taken", "env_taken serves session " + other.ID, ErrEnvironmentUnusable},
		{"no workspace", bare.ID, "env_ready", "has no workspace", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := d.DispatchToEnvironment(ctx, tc.session, tc.env)
			if err == nil || !strings.Contains(err.Error(), tc.want) || tc.is != nil && !errors.Is(err, tc.is) {
				t.Fatalf("DispatchToEnvironment(%s) = %v, want %q", tc.env, err, tc.want)
			}
			if p, err := ps.Get(ctx, tc.session); err != nil || p.State != Local || p.Generation != 0 {
				t.Fatalf("placement after the refusal: %+v %v, want untouched", p, err)
			}
		})
	}
}

// TestProvisionTakesTheNamedEnvironmentAndSkipsReserved: the provision step of a dispatch onto an
// environment takes exactly that one (attached for the session's owner); a profile dispatch never
// takes a reserved environment as its warm lease, even a ready one of its profile.
func TestProvisionTakesTheNamedEnvironmentAndSkipsReserved(t *testing.T) {
	ctx := context.Background()
	ps := openPlacements(t)
	putEnv(t, ps, "env_reserved", "occ:ns:rev:1", envs.Ready)
	putEnv(t, ps, "env_mine", "occ:ns:rev2:1", envs.Attached)
	mgr := envs.New(envs.Config{DB: ps.db, Profiles: profiles.New(ps.db, nil, nil)})
	d := &Dispatcher{cfg: DispatchConfig{Placements: ps, Envs: mgr, Admitted: func(string) bool { return true },
		Reserved: func(e envs.Environment) bool { return strings.HasPrefix(e.IdempotencyKey, "occ:") }},
		log: slog.New(slog.DiscardHandler), active: map[string]bool{}}
	mine := "env_mine"
	ch, err := d.provision(ctx, Placement{SessionID: "ses_1", State: Requested, ProfileID: "local", EnvironmentID: mine})
	if err != nil || ch.To != Provisioning || ch.EnvironmentID == nil || *ch.EnvironmentID != mine {
		t.Fatalf("provision onto %s = %+v, %v", mine, ch, err)
	}
	ch, err = d.provision(ctx, Placement{SessionID: "ses_2", State: Requested, ProfileID: "local"})
	if err == nil && ch.EnvironmentID != nil && *ch.EnvironmentID == "env_reserved" {
		t.Fatalf("a profile dispatch took the reserved environment as a warm lease: %+v", ch)
	}
}

// TestAMoveAndAMessageGetOneAnswer: a dispatch and a message that arrive together are decided in
// one place, the placement row: either the message's turn is admitted and the dispatch is refused
// busy, or the dispatch starts and the message is refused as the placement moves; never both, which
// would sync the workspace out while the gateway's own turn edits it.
func TestAMoveAndAMessageGetOneAnswer(t *testing.T) {
	ctx := context.Background()
	ps := openPlacements(t)
	st := openSessions(t, ps)
	d := &Dispatcher{cfg: DispatchConfig{Placements: ps, Sessions: st, Envs: envs.New(envs.Config{DB: ps.db}),
		Admitted: func(string) bool { return true }}, log: slog.New(slog.DiscardHandler), active: map[string]bool{}}
	var moved, admitted int
	for round := range 40 {
		ses, err := st.Create(ctx, sessions.CreateParams{Title: "race", Workspace: t.TempDir()})
		if err != nil {
			t.Fatal(err)
		}
		env := fmt.Sprintf("env_%d", round)
		putEnv(t, ps, env, "", envs.Ready)
		d.active[ses.ID] = true // the dispatch's steps are not under test: kick starts none
		start := make(chan struct{})
		var claimErr, moveErr error
		var wg sync.WaitGroup
		wg.Add(2)
		go func() {
			defer wg.Done()
			<-start
			claimErr = ps.ClaimTurn(ctx, ses.ID, 0, false, "run_msg") // turn admission of the message
		}()
		go func() {
			defer wg.Done()
			<-start
			_, moveErr = d.DispatchToEnvironment(ctx, ses.ID, env)
		}()
		close(start)
		wg.Wait()
		p, err := ps.Get(ctx, ses.ID)
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case claimErr == nil && moveErr == nil:
			t.Fatalf("round %d: both the message's turn and the dispatch were admitted (placement %s, turn %q)", round, p.State, p.TurnRunID)
		case claimErr == nil:
			if !errors.Is(moveErr, ErrBusy) || p.State != Local || p.TurnRunID != "run_msg" {
				t.Fatalf("round %d: message first: dispatch %v, placement %s turn %q; want busy, local, run_msg", round, moveErr, p.State, p.TurnRunID)
			}
			admitted++
		case moveErr == nil:
			if !errors.Is(claimErr, ErrStale) || p.State != Requested || p.TurnRunID != "" {
				t.Fatalf("round %d: dispatch first: message %v, placement %s turn %q; want stale, requested, none", round, claimErr, p.State, p.TurnRunID)
			}
			moved++
		default:
			t.Fatalf("round %d: neither won: message %v, dispatch %v", round, claimErr, moveErr)
		}
	}
	t.Logf("message first %d times, dispatch first %d times", admitted, moved)
}

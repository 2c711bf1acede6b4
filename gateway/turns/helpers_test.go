package turns

import (
	"context"
	"testing"

	"github.com/openclaw/cloudworkers/gateway/inference"
	"github.com/openclaw/cloudworkers/gateway/inference/builtin"
	"github.com/openclaw/cloudworkers/gateway/placement"
	"github.com/openclaw/cloudworkers/gateway/sessions"
	"github.com/openclaw/cloudworkers/gateway/store"
	"github.com/openclaw/cloudworkers/gateway/store/storetest"
)

// testDeps are a fresh database, its session store (closed when t ends) and placements, and a
// catalog whose one model resolves but whose turns fail at once (nothing listens on its port).
func testDeps(t *testing.T) (*store.DB, *sessions.Store, *placement.Placements, *inference.Catalog) {
	t.Helper()
	db := storetest.Open(t)
	st, err := sessions.New(sessions.Config{DB: db})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close(context.Background()) })
	cat, err := inference.NewCatalog(inference.CatalogConfig{Default: "local/m1", Providers: map[string]inference.ProviderConfig{
		"local": {API: inference.APIOpenAICompletions, BaseURL: "http://127.0.0.1:1", Models: []inference.ModelConfig{{ID: "m1"}}},
	}}, nil, builtin.Adapters())
	if err != nil {
		t.Fatal(err)
	}
	return db, st, placement.NewPlacements(db), cat
}

// startService starts the turn service of cfg, closed when t ends.
func startService(ctx context.Context, t *testing.T, cfg Config) *Service {
	t.Helper()
	svc, err := New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = svc.Close(context.Background()) })
	return svc
}

// activate moves session id's placement through a dispatch onto env up to active, as the placement
// package does when a worker takes the session.
func activate(ctx context.Context, t *testing.T, ps *placement.Placements, id, env string) {
	t.Helper()
	var gen uint64
	for _, c := range []placement.Change{{To: placement.Requested}, {To: placement.Provisioning, EnvironmentID: &env},
		{To: placement.Syncing}, {To: placement.Starting}, {To: placement.Active}} {
		p, err := ps.Transition(ctx, id, gen, c)
		if err != nil {
			t.Fatal(err)
		}
		gen = p.Generation
	}
}

// workerSession creates a session bound to env_1 with its placement active there.
func workerSession(ctx context.Context, t *testing.T, st *sessions.Store, ps *placement.Placements) sessions.Session {
	t.Helper()
	sess, err := st.Create(ctx, sessions.CreateParams{Workspace: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Attach(ctx, sess.ID, "env_1"); err != nil {
		t.Fatal(err)
	}
	activate(ctx, t, ps, sess.ID, "env_1")
	return sess
}

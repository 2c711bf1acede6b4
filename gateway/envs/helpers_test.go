package envs_test

import (
	"context"
	"testing"

	"github.com/openclaw/cloudworkers/gateway/envs"
	"github.com/openclaw/cloudworkers/gateway/profiles"
	"github.com/openclaw/cloudworkers/gateway/store"
	"github.com/openclaw/cloudworkers/gateway/store/storetest"
	"github.com/openclaw/cloudworkers/providers"
)

// openStore opens a gateway database in t's temp dir (closed when t ends) and a profile store
// over reg holding ps.
func openStore(ctx context.Context, t *testing.T, reg providers.Registry, ps ...providers.Profile) (*store.DB, *profiles.Store) {
	t.Helper()
	db := storetest.Open(t)
	prof := profiles.New(db, reg, nil)
	for i := range ps {
		if _, err := prof.Put(ctx, &ps[i]); err != nil {
			t.Fatal(err)
		}
	}
	return db, prof
}

// startManager starts a manager of cfg, closed when t ends.
func startManager(ctx context.Context, t *testing.T, cfg envs.Config) *envs.Manager {
	t.Helper()
	mgr := envs.New(cfg)
	if err := mgr.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = mgr.Close(context.Background()) })
	return mgr
}

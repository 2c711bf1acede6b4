package turns

import (
	"errors"
	"testing"
	"time"

	"github.com/openclaw/cloudworkers/gateway/sessions"
	"github.com/openclaw/cloudworkers/internal/testrig/testenv"
)

// TestAdmissionReadsThePlacementRow: where a turn runs is the placement's, its one copy. A session
// bound to an environment without a placement (the old attach primitive) runs on the gateway; a
// session whose placement is active on a worker is refused while that worker is not connected.
func TestAdmissionReadsThePlacementRow(t *testing.T) {
	ctx := testenv.Context(t, 30*time.Second)
	// a model that resolves; the turn it runs fails at once (nothing listens on the port)
	db, st, ps, cat := testDeps(t)
	svc := startService(ctx, t, Config{DB: db, Sessions: st, Catalog: cat, DataDir: t.TempDir(), Placements: ps})

	bound, err := st.Create(ctx, sessions.CreateParams{Workspace: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Attach(ctx, bound.ID, "env_1"); err != nil {
		t.Fatal(err)
	}
	turn, err := svc.Send(ctx, bound.ID, "hello", "")
	if err != nil || turn.Placement != "local" {
		t.Fatalf("bound session with a local placement: %+v, %v; want a local turn", turn, err)
	}

	active, err := st.Create(ctx, sessions.CreateParams{Workspace: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	activate(ctx, t, ps, active.ID, "env_2")
	if _, err := svc.Send(ctx, active.ID, "hello", ""); !errors.Is(err, ErrWorkerUnavailable) {
		t.Fatalf("session active on a worker that is not connected: %v, want ErrWorkerUnavailable", err)
	}
}

package main_test

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/openclaw/cloudworkers/gateway/envs"
	"github.com/openclaw/cloudworkers/gateway/placement"
)

// TestRefusedRenewalReclaims: a lease CLI whose leases expire (12s here) and that refuses to renew
// them takes the box from an active session: the environment fails with the provider's reason and
// the session is reclaimed quoting it.
func TestRefusedRenewalReclaims(t *testing.T) {
	root := t.TempDir()
	leaseDir := filepath.Join(root, "leases")
	cfg := fastWorkerConfig + "lifecycleInterval: 200ms\n" + dispatchModels(t, root) + "profiles:\n" +
		leaseDirProfile("refuses", leaseDir, map[string]string{"LEASE_DIR_HEARTBEAT_FAIL": "quota: lease extension denied", "LEASE_DIR_TTL": "12s"})
	g := startGateway(t, filepath.Join(root, "data"), cfg)
	t.Cleanup(func() { destroyAll(g) })
	ws := filepath.Join(root, "user")
	userWorkspace(t, ws, false)
	id, envID := g.activeSession(ws, "", "refuses")
	// the lease runs out: the environment fails, then the reclaim loop takes the session back
	g.waitEnv(envID, func(e envs.Environment) bool {
		return e.State.Dead() || e.State == envs.Destroying || e.State == envs.Destroyed
	})
	v := g.placement(id)
	for deadline := time.Now().Add(30 * time.Second); v.Placement.State == placement.Active && time.Now().Before(deadline); v = g.placement(id) {
		time.Sleep(50 * time.Millisecond) // polling the API
	}
	if v.Placement.State != placement.Reclaimed {
		t.Fatalf("session after its lease was refused renewal:\n%s", v)
	}
	if !strings.Contains(v.Placement.Error, "provider refused to renew lease") || !strings.Contains(v.Placement.Error, "quota: lease extension denied") {
		t.Fatalf("reclaimed session's error %q: want the provider's refusal", v.Placement.Error)
	}
	e := g.waitEnv(envID, func(e envs.Environment) bool { return e.State == envs.Destroyed })
	if !strings.Contains(e.Error, "quota: lease extension denied") {
		t.Fatalf("environment %s %q", e.State, e.Error)
	}
	if n := g.countNotes(envID, "renew lease: "); n != 1 {
		t.Fatalf("%d renewal refusal notes, want one (not one per pass)", n)
	}
}

package main_test

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openclaw/cloudworkers/gateway/envs"
	"github.com/openclaw/cloudworkers/gateway/placement"
)

// poolReady returns the environments of profile that are ready, serve no session and whose
// worker is admitted: the prepared pool.
func (g *gw) poolReady(profile string) []string {
	g.t.Helper()
	var out []string
	for _, e := range must(g.client.Environments(g.ctx(), false))(g.t) {
		if e.ProfileID == profile && (e.State == envs.Ready || e.State == envs.Idle) && len(e.AttachedSessionIDs) == 0 {
			if wi, err := g.client.EnvironmentWorker(g.ctx(), e.ID); err == nil && wi.Admitted {
				out = append(out, e.ID)
			}
		}
	}
	return out
}

// TestPreparedPool: a profile with pool.minReady 3 gets three machines ready (leased,
// bootstrapped, worker admitted) before any session asks. Eight dispatches at once each get a
// machine of their own: three claim the pool's (the timeline says so), none shares one. The pool
// then refills to three; a gateway SIGKILLed and restarted adopts its machines and leases none
// twice.
func TestPreparedPool(t *testing.T) {
	root := t.TempDir()
	g := startGateway(t, filepath.Join(root, "data"), fastWorkerConfig+
		"profiles:\n  - id: pooled\n    provider: local\n    hygiene: {metadataRoute: warn, dockerSocket: warn}\n    maxEnvironments: 20\n    pool: {minReady: 3}\n")
	t.Cleanup(func() { destroyAll(g) })
	var pool []string
	waitUntil(t, 60*time.Second, func() string { return fmt.Sprintf("the pool holds %v", pool) }, func() bool {
		pool = g.poolReady("pooled")
		return len(pool) == 3
	})
	const n = 8
	ids := make([]string, n)
	for i := range ids {
		ws := filepath.Join(root, fmt.Sprintf("ws%d", i))
		userWorkspace(t, ws, false)
		ids[i] = g.newSession(ws, "")
	}
	var wg sync.WaitGroup
	for _, id := range ids {
		wg.Go(func() {
			if _, err := g.client.Dispatch(g.ctx(), id, placement.DispatchRequest{ProfileID: "pooled"}); err != nil {
				t.Errorf("dispatch %s: %v", id, err)
			}
		})
	}
	wg.Wait()
	used := map[string]string{}
	claimed := 0
	for _, id := range ids {
		v := g.mustRest(id, placement.Active)
		if other, ok := used[v.Placement.EnvironmentID]; ok {
			t.Fatalf("sessions %s and %s were both given environment %s", other, id, v.Placement.EnvironmentID)
		}
		used[v.Placement.EnvironmentID] = id
		for _, ev := range v.Events {
			if strings.Contains(ev.Reason, "claimed ready environment") {
				claimed++
				if !slices.Contains(pool, v.Placement.EnvironmentID) {
					t.Fatalf("session %s claimed %s, which was not in the pool %v", id, v.Placement.EnvironmentID, pool)
				}
			}
		}
	}
	if claimed != 3 {
		t.Fatalf("%d dispatches claimed a pool machine, want the pool's 3", claimed)
	}
	var refilled []string
	waitUntil(t, 60*time.Second, func() string { return fmt.Sprintf("the pool refilled to %v", refilled) }, func() bool {
		refilled = g.poolReady("pooled")
		return len(refilled) == 3
	})
	live := func() int {
		k := 0
		for _, e := range must(g.client.Environments(g.ctx(), false))(t) {
			if e.ProfileID == "pooled" {
				k++
			}
		}
		return k
	}
	if got := live(); got != n+3 {
		t.Fatalf("%d live environments of the profile, want %d sessions' and 3 in the pool", got, n+3)
	}
	g.kill()
	g.restart(t)
	waitUntil(t, 60*time.Second, func() string { return fmt.Sprintf("after the restart the pool is %v", g.poolReady("pooled")) }, func() bool {
		return len(g.poolReady("pooled")) == 3
	})
	time.Sleep(3 * time.Second) // a few refill rounds of the restarted gateway (2 s each): none may lease more
	if got := live(); got != n+3 {
		t.Fatalf("after the restart %d live environments of the profile, want %d: the pool leased again", got, n+3)
	}
}

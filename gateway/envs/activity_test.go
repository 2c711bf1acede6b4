package envs_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/openclaw/cloudworkers/gateway/envs"
	"github.com/openclaw/cloudworkers/internal/clock"
	"github.com/openclaw/cloudworkers/internal/testrig/testenv"
	"github.com/openclaw/cloudworkers/providers"
	"github.com/openclaw/cloudworkers/providers/fake"
)

// idleReaper is a provider with its own idle timer, as Crabbox has: a lease not heartbeaten
// (renewed) for the profile's idleTimeout is reaped, on the test's clock.
type idleReaper struct {
	*fake.Provider
	clock *clock.Manual
	mu    sync.Mutex
	beat  map[string]time.Time
	idle  time.Duration
}

func newIdleReaper(c *clock.Manual, idle time.Duration) *idleReaper {
	r := &idleReaper{Provider: fake.New(), clock: c, beat: map[string]time.Time{}, idle: idle}
	r.RenewFunc = func(_ context.Context, _ providers.Profile, l providers.Lease) error {
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.reapedLocked(l.ID) {
			return fmt.Errorf("lease %s: %w", l.ID, providers.ErrLeaseGone)
		}
		r.beat[l.ID] = r.clock.Now()
		return nil
	}
	return r
}

func (r *idleReaper) reapedLocked(id string) bool {
	b, ok := r.beat[id]
	if !ok {
		r.beat[id] = r.clock.Now() // first seen: the provider's timer starts
		return false
	}
	return r.clock.Now().Sub(b) > r.idle
}

// reaped reports whether the provider's idle timer fired on the lease.
func (r *idleReaper) reaped(id string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.reapedLocked(id)
}

// TestLongExecKeepsItsBox: a session running a 3-minute exec (a turn in flight, no model call,
// nothing passing through the gateway) on a profile with a 1-minute idle timeout keeps its box:
// the gateway heartbeats the provider while the environment is busy. One that only talks to a
// model (worker calls seen) is kept too; one with nothing going on is let go by the provider.
func TestLongExecKeepsItsBox(t *testing.T) {
	ctx := testenv.Context(t, 30*time.Second)
	clk := clock.NewManual(time.Now())
	prov := newIdleReaper(clk, time.Minute)
	reg := providers.Registry{"fake": prov}
	db, ps := openStore(ctx, t, reg, providers.Profile{ID: "p", Provider: "fake", Lifetime: providers.Lifetime{IdleTimeout: providers.Duration(time.Minute)}})
	var mu sync.Mutex
	busy := map[string]bool{}
	mgr := startManager(ctx, t, envs.Config{DB: db, Profiles: ps, Providers: reg, GatewayID: gwID, SweepInterval: -1, LifecycleInterval: -1,
		Bootstrapper: readyBoot{}, Clock: clk, Busy: func(id string) bool { mu.Lock(); defer mu.Unlock(); return busy[id] }})
	ready := func() envs.Environment {
		e, _, err := mgr.Create(ctx, "p", "")
		if err != nil {
			t.Fatal(err)
		}
		e, err = mgr.WaitFor(ctx, e.ID, func(e envs.Environment) bool { return e.State == envs.Ready })
		if err != nil {
			t.Fatal(err)
		}
		if err := mgr.Attach(ctx, e.ID, "ses_"+e.ID); err != nil {
			t.Fatal(err)
		}
		prov.reaped(e.LeaseID) // the provider's idle timer starts with the lease
		return e
	}
	exec, chat, quiet := ready(), ready(), ready()
	mu.Lock()
	busy[exec.ID] = true // the exec runs for the whole 3 minutes
	mu.Unlock()
	for step := 0; step < 18; step++ { // 3 minutes in 10 s steps
		clk.Advance(10 * time.Second)
		if step%2 == 0 {
			mgr.Seen(chat.ID) // a model call every 20 s passes through the gateway
		}
		mgr.ApplyLifecycle(ctx)
		if prov.reaped(exec.LeaseID) {
			t.Fatalf("after %s of exec with a 1m idle timeout the provider reaped the box (renewed %d times)", time.Duration(step+1)*10*time.Second, prov.Calls(fake.MethodRenew))
		}
		if prov.reaped(chat.LeaseID) {
			t.Fatalf("after %s of model calls the provider reaped the box", time.Duration(step+1)*10*time.Second)
		}
	}
	if !prov.reaped(quiet.LeaseID) {
		t.Fatal("a box with nothing going on was heartbeaten: activity does not decide the heartbeat")
	}
	for _, e := range []envs.Environment{exec, chat} {
		got, err := mgr.Get(ctx, e.ID)
		if err != nil || got.State != envs.Attached {
			t.Fatalf("environment %s after 3 minutes: %s (%v)", e.ID, got.State, err)
		}
	}
}

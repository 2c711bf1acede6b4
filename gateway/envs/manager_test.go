package envs_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openclaw/cloudworkers/gateway/envs"
	"github.com/openclaw/cloudworkers/gateway/profiles"
	"github.com/openclaw/cloudworkers/gateway/store"
	"github.com/openclaw/cloudworkers/internal/clock"
	"github.com/openclaw/cloudworkers/internal/testrig/testenv"
	"github.com/openclaw/cloudworkers/providers"
	"github.com/openclaw/cloudworkers/providers/fake"
)

const gwID = "gw_test"

type harness struct {
	db   *store.DB
	prov *fake.Provider
	prof *profiles.Store
	mgr  *envs.Manager
	// clock paces destroy retries (1s doubling to 4s): a test that needs one advances it.
	clock *clock.Manual
}

func newHarness(t *testing.T, prov *fake.Provider) *harness {
	t.Helper()
	ctx := testenv.Context(t, 20*time.Second)
	db, ps := openStore(ctx, t, providers.Registry{"fake": prov}, providers.Profile{ID: "p1", Provider: "fake", MaxEnvironments: 2})
	h := &harness{db: db, prov: prov, prof: ps, clock: clock.NewManual(time.Now())}
	h.start(t)
	return h
}

func (h *harness) start(t *testing.T) {
	t.Helper()
	h.mgr = startManager(testenv.Context(t, 20*time.Second), t, envs.Config{DB: h.db, Profiles: h.prof, Providers: providers.Registry{"fake": h.prov},
		GatewayID: gwID, RetryMin: time.Second, RetryMax: 4 * time.Second, SweepInterval: -1, LifecycleInterval: -1, Clock: h.clock})
}

func (h *harness) waitState(t *testing.T, id string, want envs.State) envs.Environment {
	t.Helper()
	e, err := h.mgr.WaitFor(testenv.Context(t, 20*time.Second), id, func(e envs.Environment) bool { return e.State == want })
	if err != nil {
		t.Fatalf("waiting for %s to reach %s: %v (state %s, error %q)", id, want, err, e.State, e.Error)
	}
	return e
}

func states(t *testing.T, h *harness, id string) string {
	t.Helper()
	evs, err := h.mgr.Events(testenv.Context(t, 20*time.Second), id)
	if err != nil {
		t.Fatal(err)
	}
	var s []string
	for _, ev := range evs {
		s = append(s, string(ev.To))
	}
	return strings.Join(s, ">")
}

func TestCreateRecordsLeaseAndStopsAtBootstrapping(t *testing.T) {
	h := newHarness(t, fake.New())
	ctx := testenv.Context(t, 20*time.Second)
	e, created, err := h.mgr.Create(ctx, "p1", "k1")
	if err != nil || !created {
		t.Fatalf("create: %v created=%v", err, created)
	}
	e = h.waitState(t, e.ID, envs.Bootstrapping)
	if e.LeaseID != fake.LeaseIDFor(e.OperationID) || e.Lease.SSHHost == "" || len(e.Lease.HostKeys) != 1 {
		t.Fatalf("lease not recorded: %+v", e)
	}
	if e.Lease.Labels[providers.LabelGateway] != gwID || e.Lease.Labels[providers.LabelEnvironment] != e.ID {
		t.Fatalf("labels: %v", e.Lease.Labels)
	}
	if got := states(t, h, e.ID); got != "requested>provisioning>bootstrapping" {
		t.Fatalf("events %s", got)
	}
	again, created, err := h.mgr.Create(ctx, "p1", "k1")
	if err != nil || created || again.ID != e.ID {
		t.Fatalf("repeated key: %v created=%v id=%s want %s", err, created, again.ID, e.ID)
	}
	if n := h.prov.Calls(fake.MethodProvision); n != 1 {
		t.Fatalf("provision called %d times", n)
	}
	// no readiness is faked without a bootstrapper
	if got, _ := h.mgr.Get(ctx, e.ID); got.State != envs.Bootstrapping {
		t.Fatalf("state %s", got.State)
	}
}

func TestCapacityLimit(t *testing.T) {
	h := newHarness(t, fake.New())
	ctx := testenv.Context(t, 20*time.Second)
	for i := 0; i < 2; i++ {
		if _, _, err := h.mgr.Create(ctx, "p1", ""); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := h.mgr.Create(ctx, "p1", ""); !errors.Is(err, envs.ErrCapacity) {
		t.Fatalf("third create: %v, want ErrCapacity", err)
	}
	if _, _, err := h.mgr.Create(ctx, "nope", ""); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("unknown profile: %v", err)
	}
}

func TestProvisionFailureIsBoundedAndReleasesLease(t *testing.T) {
	prov := fake.New()
	prov.ProvisionFunc = func(ctx context.Context, p providers.Profile, opID string, req providers.ProvisionRequest) (providers.Lease, error) {
		return providers.Lease{}, errors.New("capacity exhausted\x1b[31m in region\n" + strings.Repeat("x", 5000))
	}
	h := newHarness(t, prov)
	e, _, err := h.mgr.Create(testenv.Context(t, 20*time.Second), "p1", "")
	if err != nil {
		t.Fatal(err)
	}
	e = h.waitState(t, e.ID, envs.Failed)
	if !strings.Contains(e.Error, "capacity exhausted") || len(e.Error) > 600 || strings.ContainsAny(e.Error, "\x1b\n") {
		t.Fatalf("error not bounded/sanitized: %q", e.Error)
	}
	if prov.Calls(fake.MethodDestroy) != 1 {
		t.Fatalf("lease of failed provisioning not released: destroy calls %d", prov.Calls(fake.MethodDestroy))
	}
}

func TestLeaseWithoutHostKeyRefused(t *testing.T) {
	prov := fake.New()
	prov.ProvisionFunc = func(ctx context.Context, p providers.Profile, opID string, req providers.ProvisionRequest) (providers.Lease, error) {
		return providers.Lease{ID: req.LeaseID, SSHHost: "198.18.0.2", SSHPort: 22, SSHUser: "u"}, nil
	}
	h := newHarness(t, prov)
	e, _, _ := h.mgr.Create(testenv.Context(t, 20*time.Second), "p1", "")
	e = h.waitState(t, e.ID, envs.Failed)
	if !strings.Contains(e.Error, "unpinned") {
		t.Fatalf("error %q", e.Error)
	}
	if e.Lease.SSHHost != "" {
		t.Fatalf("half-recorded lease: %+v", e.Lease)
	}
}

func TestDestroyRetriesUntilInspectProvesGone(t *testing.T) {
	prov := fake.New()
	var inspects atomic.Int32
	h := newHarness(t, prov)
	prov.InspectFunc = func(ctx context.Context, p providers.Profile, l providers.Lease) (providers.LeaseStatus, error) {
		switch inspects.Add(1) {
		case 1:
			return providers.LeaseStatus{}, errors.New("api unavailable") // not proof
		case 2:
			return providers.LeaseStatus{LeaseID: l.ID, State: "stopping"}, nil // not gone yet
		}
		return providers.LeaseStatus{LeaseID: l.ID, State: "released", Gone: true}, nil
	}
	ctx := testenv.Context(t, 20*time.Second)
	e, _, _ := h.mgr.Create(ctx, "p1", "")
	h.waitState(t, e.ID, envs.Bootstrapping)
	type result struct {
		e   envs.Environment
		err error
	}
	destroyed := make(chan result, 1)
	go func() {
		e, err := h.mgr.Destroy(ctx, e.ID, false)
		destroyed <- result{e, err}
	}()
	// Two attempts fail to prove the lease gone; each retry waits its backoff on the clock.
	for retry, wait := range []time.Duration{time.Second, 2 * time.Second} {
		if err := h.clock.WaitTimers(ctx, 1); err != nil {
			t.Fatalf("retry %d never waited on the clock: %v", retry+1, err)
		}
		if d, _ := h.clock.Next(); d < wait/2 || d > wait {
			t.Fatalf("retry %d waits %v, want within [%v, %v]", retry+1, d, wait/2, wait)
		}
		if n := inspects.Load(); n != int32(retry+1) {
			t.Fatalf("before retry %d: %d inspect calls, want %d", retry+1, n, retry+1)
		}
		h.clock.Advance(wait)
	}
	r := <-destroyed
	got, err := r.e, r.err
	if err != nil || got.State != envs.Destroyed {
		t.Fatalf("destroy: %v %s", err, got.State)
	}
	if n := inspects.Load(); n != 3 {
		t.Fatalf("inspect calls %d, want 3", n)
	}
	if prov.Calls(fake.MethodDestroy) != 3 {
		t.Fatalf("destroy calls %d, want 3", prov.Calls(fake.MethodDestroy))
	}
	if s := states(t, h, e.ID); s != "requested>provisioning>bootstrapping>draining>destroying>destroyed" {
		t.Fatalf("events %s", s)
	}
	if got.Error != "" {
		t.Fatalf("retry message left behind: %q", got.Error)
	}
	// idempotent
	again, err := h.mgr.Destroy(ctx, e.ID, false)
	if err != nil || again.State != envs.Destroyed || prov.Calls(fake.MethodDestroy) != 3 {
		t.Fatalf("second destroy: %v %s calls=%d", err, again.State, prov.Calls(fake.MethodDestroy))
	}
}

func TestForceDestroyOfAttachedAndFailed(t *testing.T) {
	prov := fake.New()
	prov.ProvisionFunc = func(ctx context.Context, p providers.Profile, opID string, req providers.ProvisionRequest) (providers.Lease, error) {
		return providers.Lease{}, errors.New("quota")
	}
	h := newHarness(t, prov)
	ctx := testenv.Context(t, 20*time.Second)
	e, _, _ := h.mgr.Create(ctx, "p1", "")
	h.waitState(t, e.ID, envs.Failed)
	got, err := h.mgr.Destroy(ctx, e.ID, false)
	if err != nil || got.State != envs.Destroyed || !strings.Contains(got.Error, "quota") {
		t.Fatalf("destroy failed env: %v %s %q", err, got.State, got.Error)
	}
}

func TestSweepDestroysOnlyOurUnownedLeases(t *testing.T) {
	prov := fake.New()
	h := newHarness(t, prov)
	ctx := testenv.Context(t, 20*time.Second)
	live, _, _ := h.mgr.Create(ctx, "p1", "")
	live = h.waitState(t, live.ID, envs.Bootstrapping)
	prov.Put(providers.Lease{ID: "fk_orphan", SSHHost: "h", SSHPort: 22, HostKeys: []string{fake.HostKey},
		Labels: map[string]string{providers.LabelGateway: gwID, providers.LabelEnvironment: "env_gone"}})
	prov.Put(providers.Lease{ID: "fk_foreign", SSHHost: "h", SSHPort: 22, HostKeys: []string{fake.HostKey},
		Labels: map[string]string{providers.LabelGateway: "gw_other"}})
	prov.Put(providers.Lease{ID: "fk_unlabelled", SSHHost: "h", SSHPort: 22, HostKeys: []string{fake.HostKey}})
	rep, err := h.mgr.Sweep(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Destroyed) != 1 || rep.Destroyed[0].LeaseID != "fk_orphan" {
		t.Fatalf("sweep destroyed %+v", rep.Destroyed)
	}
	var left []string
	for _, l := range prov.Leases() {
		left = append(left, l.ID)
	}
	want := []string{"fk_foreign", live.LeaseID, "fk_unlabelled"}
	if strings.Join(left, ",") != strings.Join(sorted(want), ",") {
		t.Fatalf("leases left %v, want %v", left, sorted(want))
	}
	audit, _ := h.db.ListAudit(ctx, "", 100)
	found := false
	for _, a := range audit {
		if a.Kind == "sweep.destroy" && strings.Contains(a.Detail, "fk_orphan") {
			found = true
		}
	}
	if !found {
		t.Fatalf("sweep not audited: %+v", audit)
	}
}

func sorted(s []string) []string {
	out := append([]string(nil), s...)
	for i := range out {
		for j := i + 1; j < len(out); j++ {
			if out[j] < out[i] {
				out[i], out[j] = out[j], out[i]
			}
		}
	}
	return out
}

func TestReconcileOrphansVanishedLeaseAndResumesProvisioning(t *testing.T) {
	prov := fake.New()
	block := make(chan struct{})
	var mu sync.Mutex
	var ops []string
	var calls atomic.Int32
	prov.ProvisionFunc = func(ctx context.Context, p providers.Profile, opID string, req providers.ProvisionRequest) (providers.Lease, error) {
		mu.Lock()
		ops = append(ops, opID)
		mu.Unlock()
		if calls.Add(1) == 1 {
			select { // the first gateway "dies" mid-call
			case <-block:
			case <-ctx.Done():
				return providers.Lease{}, ctx.Err()
			}
		}
		l := providers.Lease{ID: req.LeaseID, SSHHost: "127.0.0.1", SSHPort: 22, SSHUser: "u", HostKeys: []string{fake.HostKey},
			Labels: map[string]string{providers.LabelGateway: req.GatewayID}}
		return l, nil
	}
	h := newHarness(t, prov)
	ctx := testenv.Context(t, 20*time.Second)
	a, _, _ := h.mgr.Create(ctx, "p1", "")
	h.waitState(t, a.ID, envs.Provisioning)
	// stop the manager mid-provision: the row stays in provisioning
	if err := h.mgr.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if got, _ := h.mgr.Get(ctx, a.ID); got.State != envs.Provisioning {
		t.Fatalf("after stop: %s", got.State)
	}
	h.start(t)
	a2 := h.waitState(t, a.ID, envs.Bootstrapping)
	mu.Lock()
	defer mu.Unlock()
	if len(ops) != 2 || ops[0] != ops[1] || ops[0] != a.OperationID {
		t.Fatalf("operation ids %v, want twice %s", ops, a.OperationID)
	}
	// now the provider loses the lease behind our back; a restart orphans the environment
	prov.InspectFunc = func(ctx context.Context, p providers.Profile, l providers.Lease) (providers.LeaseStatus, error) {
		return providers.LeaseStatus{LeaseID: l.ID, State: "gone", Gone: true}, nil
	}
	_ = h.mgr.Close(ctx)
	h.start(t)
	o := h.waitState(t, a2.ID, envs.Orphaned)
	if !strings.Contains(o.Error, a2.LeaseID) {
		t.Fatalf("orphan reason %q", o.Error)
	}
}

func TestLifecycleStopsIdleButNeverAttached(t *testing.T) {
	ctx := testenv.Context(t, 20*time.Second)
	prov := fake.New()
	reg := providers.Registry{"fake": prov}
	db, ps := openStore(ctx, t, reg, providers.Profile{ID: "p", Provider: "fake", Lifetime: providers.Lifetime{IdleTimeout: providers.Duration(time.Hour)}})
	clk := clock.NewManual(time.Now())
	mgr := startManager(ctx, t, envs.Config{DB: db, Profiles: ps, Providers: reg, GatewayID: gwID, SweepInterval: -1, LifecycleInterval: -1,
		RetryMin: time.Millisecond, RetryMax: time.Millisecond, Bootstrapper: readyBoot{},
		Clock: clk})
	wait := func(id string, s envs.State) {
		t.Helper()
		if _, err := mgr.WaitFor(ctx, id, func(e envs.Environment) bool { return e.State == s }); err != nil {
			t.Fatalf("%s never %s: %v", id, s, err)
		}
	}
	idle, _, _ := mgr.Create(ctx, "p", "")
	busy, _, _ := mgr.Create(ctx, "p", "")
	wait(idle.ID, envs.Ready)
	wait(busy.ID, envs.Ready)
	if err := mgr.Attach(ctx, busy.ID, "ses_1"); err != nil {
		t.Fatal(err)
	}
	if got := mgr.ApplyLifecycle(ctx); len(got) != 0 {
		t.Fatalf("stopped %v before any idle time", got)
	}
	clk.Advance(2 * time.Hour) // two hours pass
	got := mgr.ApplyLifecycle(ctx)
	if len(got) != 1 || got[0] != idle.ID {
		t.Fatalf("lifecycle stopped %v, want only the idle %s", got, idle.ID)
	}
	wait(idle.ID, envs.Destroyed)
	if e, _ := mgr.Get(ctx, busy.ID); e.State != envs.Attached {
		t.Fatalf("attached environment is %s", e.State)
	}
	// once detached, idle time counts from the detach
	if err := mgr.Detach(ctx, busy.ID, "ses_1"); err != nil {
		t.Fatal(err)
	}
	if got := mgr.ApplyLifecycle(ctx); len(got) != 0 {
		t.Fatalf("stopped %v right after detach", got)
	}
	clk.Advance(2 * time.Hour)
	if got := mgr.ApplyLifecycle(ctx); len(got) != 1 || got[0] != busy.ID {
		t.Fatalf("idle after detach not stopped: %v", got)
	}
}

// funcBootstrapper bootstraps with fn.
type funcBootstrapper func(context.Context, envs.Environment) error

func (f funcBootstrapper) Bootstrap(ctx context.Context, e envs.Environment) error { return f(ctx, e) }

func bootHarness(t *testing.T, boot envs.Bootstrapper) (*envs.Manager, *fake.Provider) {
	t.Helper()
	ctx := testenv.Context(t, 20*time.Second)
	prov := fake.New()
	reg := providers.Registry{"fake": prov}
	db, ps := openStore(ctx, t, reg, providers.Profile{ID: "p", Provider: "fake"})
	mgr := startManager(ctx, t, envs.Config{DB: db, Profiles: ps, Providers: reg, GatewayID: gwID, SweepInterval: -1, LifecycleInterval: -1,
		Bootstrapper: boot, Clock: clock.NewManual(time.Now())})
	return mgr, prov
}

// TestBootstrapFailureFailsTheEnvironment: a bootstrap that fails on its own moves the
// environment to failed with its error (it is not mistaken for one stopped by a destroy).
func TestBootstrapFailureFailsTheEnvironment(t *testing.T) {
	ctx := testenv.Context(t, 20*time.Second)
	mgr, _ := bootHarness(t, funcBootstrapper(func(context.Context, envs.Environment) error { return errors.New("hygiene: docker socket") }))
	e, _, err := mgr.Create(ctx, "p", "")
	if err != nil {
		t.Fatal(err)
	}
	e, err = mgr.WaitFor(ctx, e.ID, func(e envs.Environment) bool { return e.State.Dead() })
	if err != nil || e.State != envs.Failed || !strings.Contains(e.Error, "hygiene: docker socket") {
		t.Fatalf("state %s error %q (%v), want failed naming the bootstrap error", e.State, e.Error, err)
	}
}

// TestDestroyStopsAHangingBootstrap: a bootstrap stuck on a box that never answers does not hold
// a destroy: the destroy cancels it, and the provider's destroy proves the lease gone.
func TestDestroyStopsAHangingBootstrap(t *testing.T) {
	ctx := testenv.Context(t, 20*time.Second)
	started := make(chan struct{})
	mgr, prov := bootHarness(t, funcBootstrapper(func(ctx context.Context, _ envs.Environment) error {
		close(started)
		<-ctx.Done() // a box that never answers, bounded only by its context
		return ctx.Err()
	}))
	e, _, err := mgr.Create(ctx, "p", "")
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-started:
	case <-ctx.Done():
		t.Fatal("bootstrap never started")
	}
	d, err := mgr.Destroy(ctx, e.ID, false)
	if err != nil || d.State != envs.Destroyed {
		t.Fatalf("destroy during a hanging bootstrap: %v, state %s", err, d.State)
	}
	if len(prov.Leases()) != 0 {
		t.Fatalf("leases left: %v", prov.Leases())
	}
}

// A gateway holding MaxEnvironments live environments (capacity.maxWorkers) refuses a new one,
// whatever its profile, with a *CapacityError and before anything is recorded or leased; a
// repeated idempotency key still returns the environment it created.
func TestGatewayCapacityRefusesNewEnvironmentBeforeAnySideEffect(t *testing.T) {
	h := newHarness(t, fake.New())
	ctx := testenv.Context(t, 20*time.Second)
	if _, err := h.prof.Put(ctx, &providers.Profile{ID: "p2", Provider: "fake", MaxEnvironments: 5}); err != nil {
		t.Fatal(err)
	}
	var refused []string
	mgr := envs.New(envs.Config{DB: h.db, Profiles: h.prof, Providers: providers.Registry{"fake": h.prov},
		GatewayID: gwID, SweepInterval: -1, Clock: h.clock, MaxEnvironments: 1,
		OnRefused: func(reason string) { refused = append(refused, reason) }})
	if err := mgr.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = mgr.Close(context.Background()) })
	_ = h.mgr.Close(ctx) // the harness's own manager stays out of the way
	first, _, err := mgr.Create(ctx, "p1", "k1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := mgr.WaitFor(ctx, first.ID, func(e envs.Environment) bool { return e.State == envs.Bootstrapping }); err != nil {
		t.Fatal(err)
	}
	_, _, err = mgr.Create(ctx, "p2", "k2")
	var ce *envs.CapacityError
	if !errors.As(err, &ce) || !errors.Is(err, envs.ErrCapacityExceeded) || ce.RetryAfter <= 0 ||
		ce.Reason != envs.EnvironmentsReason || !strings.Contains(ce.Message, "capacity.maxWorkers") {
		t.Fatalf("create beyond the gateway's capacity: %v, want a CapacityError naming capacity.maxWorkers with a retry hint", err)
	}
	list, err := mgr.List(ctx, true)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 1 || h.prov.Calls(fake.MethodProvision) != 1 || len(refused) != 1 || refused[0] != envs.EnvironmentsReason {
		t.Fatalf("after the refusal: %d environments (want 1), %d provisions (want 1), refusals %v",
			len(list), h.prov.Calls(fake.MethodProvision), refused)
	}
	again, created, err := mgr.Create(ctx, "p1", "k1")
	if err != nil || created || again.ID != first.ID {
		t.Fatalf("repeated key at capacity: %v created=%v id=%s, want %s", err, created, again.ID, first.ID)
	}
}

package envs_test

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openclaw/cloudworkers/gateway/envs"
	"github.com/openclaw/cloudworkers/gateway/profiles"
	"github.com/openclaw/cloudworkers/gateway/store"
	"github.com/openclaw/cloudworkers/internal/clock"
	"github.com/openclaw/cloudworkers/internal/testrig/testenv"
	"github.com/openclaw/cloudworkers/providers"
	"github.com/openclaw/cloudworkers/providers/command"
)

var (
	leaseDirOnce sync.Once
	leaseDirPath string
	leaseDirErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if leaseDirPath != "" {
		_ = os.RemoveAll(filepath.Dir(leaseDirPath))
	}
	os.Exit(code)
}

// leaseDirBin builds examples/lease-dir once for the tests of this package; TestMain removes it.
func leaseDirBin(t *testing.T) string {
	t.Helper()
	leaseDirOnce.Do(func() {
		dir, err := os.MkdirTemp("", "envs-lease-dir")
		if err != nil {
			leaseDirErr = err
			return
		}
		leaseDirPath = filepath.Join(dir, "lease-dir")
		out, err := exec.Command("go", "build", "-o", leaseDirPath, "../../examples/lease-dir").CombinedOutput()
		if err != nil {
			leaseDirErr = err
			t.Logf("go build lease-dir: %s", out)
		}
	})
	if leaseDirErr != nil {
		t.Fatalf("build lease-dir: %v", leaseDirErr)
	}
	return leaseDirPath
}

// readyBoot makes a leased environment ready at once (these tests have no box).
type readyBoot struct{}

func (readyBoot) Bootstrap(context.Context, envs.Environment) error { return nil }

// cliHarness is an environment manager whose profiles drive examples/lease-dir through the
// command provider, on a manual clock (lifecycle passes are run by the test).
type cliHarness struct {
	t     *testing.T
	bin   string
	db    *store.DB
	prof  *profiles.Store
	mgr   *envs.Manager
	clock *clock.Manual
}

func newCLIHarness(t *testing.T) *cliHarness {
	t.Helper()
	ctx := testenv.Context(t, 30*time.Second)
	bin := leaseDirBin(t)
	reg := providers.Registry{"command": command.New(command.Config{WorkRoot: t.TempDir()})}
	db, ps := openStore(ctx, t, reg)
	h := &cliHarness{t: t, bin: bin, db: db, prof: ps, clock: clock.NewManual(time.Now())}
	h.mgr = startManager(ctx, t, envs.Config{DB: db, Profiles: ps, Providers: reg, GatewayID: gwID, SweepInterval: -1, LifecycleInterval: -1,
		RetryMin: time.Second, RetryMax: 4 * time.Second, Bootstrapper: readyBoot{}, Clock: h.clock})
	return h
}

// profile stores a lease-dir profile on dir with the extra lease-dir environment and warmup flags.
func (h *cliHarness) profile(id, dir string, env map[string]string, warmup []string, edit func(*providers.Profile)) {
	h.t.Helper()
	all := map[string]string{"LEASE_DIR": dir}
	for k, v := range env {
		all[k] = v
	}
	provision := append([]string{h.bin, "warmup", "--lease-id", "{leaseId}", "--label", "openclaw.gateway={gatewayId}",
		"--label", "openclaw.environment={envId}"}, warmup...)
	settings, _ := json.Marshal(map[string]any{
		"provision": provision,
		"inspect":   []string{h.bin, "inspect", "--id", "{leaseId}", "--json"},
		"destroy":   []string{h.bin, "stop", "{leaseId}"},
		"renew":     []string{h.bin, "heartbeat", "--id", "{leaseId}"},
		"list":      []string{h.bin, "list", "--json"},
		"timeout":   "10s", "pollInterval": "20ms", "env": all,
	})
	p := providers.Profile{ID: id, Provider: "command", Settings: settings}
	if edit != nil {
		edit(&p)
	}
	if _, err := h.prof.Put(testenv.Context(h.t, 10*time.Second), &p); err != nil {
		h.t.Fatalf("profile %s: %v", id, err)
	}
}

func (h *cliHarness) create(profile string) envs.Environment {
	h.t.Helper()
	e, _, err := h.mgr.Create(testenv.Context(h.t, 10*time.Second), profile, "")
	if err != nil {
		h.t.Fatal(err)
	}
	got, err := h.mgr.WaitFor(testenv.Context(h.t, 30*time.Second), e.ID, func(e envs.Environment) bool { return e.State == envs.Ready || e.State.Dead() })
	if err != nil {
		h.t.Fatalf("environment %s: %v (state %s)", e.ID, err, got.State)
	}
	return got
}

// leases are the lease-dir leases in dir that are not released.
func (h *cliHarness) leases(dir string) map[string]map[string]string {
	h.t.Helper()
	cmd := exec.Command(h.bin, "list", "--json")
	cmd.Env = append(os.Environ(), "LEASE_DIR="+dir)
	out, err := cmd.Output()
	if err != nil {
		h.t.Fatalf("lease-dir list: %v", err)
	}
	var list []struct {
		ID     string            `json:"id"`
		State  string            `json:"state"`
		Labels map[string]string `json:"labels"`
	}
	if err := json.Unmarshal(out, &list); err != nil {
		h.t.Fatal(err)
	}
	live := map[string]map[string]string{}
	for _, l := range list {
		if l.State == "ready" {
			live[l.ID] = l.Labels
		}
	}
	return live
}

// warmup leases id in dir directly through lease-dir (a lease the gateway did not make now).
func (h *cliHarness) warmup(dir, id string, labels ...string) {
	h.t.Helper()
	args := []string{"warmup", "--lease-id", id}
	for _, l := range labels {
		args = append(args, "--label", l)
	}
	cmd := exec.Command(h.bin, args...)
	cmd.Env = append(os.Environ(), "LEASE_DIR="+dir)
	if out, err := cmd.CombinedOutput(); err != nil {
		h.t.Fatalf("lease-dir warmup: %v: %s", err, out)
	}
}

// heartbeats counts the heartbeat calls lease-dir logged in dir for a lease.
func heartbeats(t *testing.T, dir, leaseID string) int {
	t.Helper()
	f, err := os.Open(filepath.Join(dir, "calls.log"))
	if os.IsNotExist(err) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	n := 0
	for sc := bufio.NewScanner(f); sc.Scan(); {
		if strings.Contains(sc.Text(), `"command":"heartbeat"`) && strings.Contains(sc.Text(), `"leaseId":"`+leaseID+`"`) {
			n++
		}
	}
	return n
}

func provisionSteps(t *testing.T, m *envs.Manager, id string) []envs.Step {
	t.Helper()
	all, err := m.Timeline(testenv.Context(t, 10*time.Second), id)
	if err != nil {
		t.Fatal(err)
	}
	var out []envs.Step
	for _, s := range all {
		if s.Kind == envs.StepProvision {
			out = append(out, s)
		}
	}
	return out
}

// TestFallbackOnCapacity: a lease CLI that reports "capacity exhausted" (or an exit code the
// profile's capacityPattern names) makes the environment come from the fallback profile, each
// attempt on the timeline with its reason; "permission denied" does not fall back.
func TestFallbackOnCapacity(t *testing.T) {
	h := newCLIHarness(t)
	dirA, dirB, dirC := t.TempDir(), t.TempDir(), t.TempDir()
	h.profile("b", dirB, nil, nil, nil)
	h.profile("a", dirA, map[string]string{"LEASE_DIR_WARMUP_FAIL": "capacity exhausted in zone 1"}, nil,
		func(p *providers.Profile) { p.Fallback = []string{"b"} })
	h.profile("denied", dirC, map[string]string{"LEASE_DIR_WARMUP_FAIL": "permission denied (token lacks scope)"}, nil,
		func(p *providers.Profile) { p.Fallback = []string{"b"} })
	h.profile("code", dirC, map[string]string{"LEASE_DIR_WARMUP_FAIL": "try again later"}, nil,
		func(p *providers.Profile) { p.Fallback = []string{"b"}; p.CapacityPattern = `exited 3\b` })

	t.Run("capacity falls back", func(t *testing.T) {
		e := h.create("a")
		if e.State != envs.Ready || e.ProfileID != "a" || e.LeasedProfileID != "b" {
			t.Fatalf("environment %s %s (%s): profile %s leased from %q, want ready on a, leased from b", e.ID, e.State, e.Error, e.ProfileID, e.LeasedProfileID)
		}
		if _, ok := h.leases(dirB)[e.LeaseID]; !ok || len(h.leases(dirA)) != 0 {
			t.Fatalf("lease %s: b has %v, a has %v", e.LeaseID, h.leases(dirB), h.leases(dirA))
		}
		steps := provisionSteps(t, h.mgr, e.ID)
		if len(steps) != 2 || steps[0].Name != "a" || steps[0].Result != envs.ResultFailed ||
			!strings.Contains(steps[0].Detail, "capacity exhausted in zone 1") || !strings.Contains(steps[0].Detail, "falling back to profile b") ||
			steps[1].Name != "b" || steps[1].Result != envs.ResultOK {
			t.Fatalf("provision timeline %+v: want a failed (capacity, falling back to b), then b ok", steps)
		}
		if len(e.Attempts) != 1 || e.Attempts[0].ProfileID != "a" || e.Attempts[0].LeaseID == e.LeaseID {
			t.Fatalf("attempts %+v", e.Attempts)
		}
	})
	t.Run("permission denied does not", func(t *testing.T) {
		before := len(h.leases(dirB))
		e := h.create("denied")
		if e.State != envs.Failed || !strings.Contains(e.Error, "permission denied") || e.LeasedProfileID != "denied" {
			t.Fatalf("environment %s %q leased from %q: want failed with the CLI's message, no fallback", e.State, e.Error, e.LeasedProfileID)
		}
		if n := len(h.leases(dirB)); n != before {
			t.Fatalf("profile b has %d leases, had %d: a non-capacity error fell back", n, before)
		}
		steps := provisionSteps(t, h.mgr, e.ID)
		if len(steps) != 1 || !strings.Contains(steps[0].Detail, "not a capacity error") {
			t.Fatalf("provision timeline %+v", steps)
		}
	})
	t.Run("exit code pattern falls back", func(t *testing.T) {
		e := h.create("code")
		if e.State != envs.Ready || e.LeasedProfileID != "b" {
			t.Fatalf("environment %s %q leased from %q: want ready from b (exit 3 matched)", e.State, e.Error, e.LeasedProfileID)
		}
	})
}

// TestSweepFindsOrphansOfEitherProfile: after a fallback, a lease left on the first profile by
// the abandoned attempt (labelled or not) and a lease of the fallback profile whose environment
// is gone are destroyed by the sweep; the environment's own lease is kept.
func TestSweepFindsOrphansOfEitherProfile(t *testing.T) {
	h := newCLIHarness(t)
	ctx := testenv.Context(t, 60*time.Second)
	dirA, dirB := t.TempDir(), t.TempDir()
	h.profile("b", dirB, nil, nil, nil)
	h.profile("a", dirA, map[string]string{"LEASE_DIR_WARMUP_FAIL": "insufficient capacity"}, nil,
		func(p *providers.Profile) { p.Fallback = []string{"b"} })
	live := h.create("a")
	gone := h.create("a")
	if live.LeasedProfileID != "b" || gone.LeasedProfileID != "b" {
		t.Fatalf("leased from %q and %q, want b", live.LeasedProfileID, gone.LeasedProfileID)
	}
	if _, err := h.mgr.Destroy(ctx, gone.ID, false); err != nil {
		t.Fatal(err)
	}
	// what a CLI that half-created before reporting no capacity would leave on a
	h.warmup(dirA, live.Attempts[0].LeaseID)
	h.warmup(dirA, gone.Attempts[0].LeaseID, "openclaw.gateway="+gwID, "openclaw.environment="+gone.ID)
	// and a fallback lease that outlived its environment
	h.warmup(dirB, gone.LeaseID, "openclaw.gateway="+gwID, "openclaw.environment="+gone.ID)
	rep, err := h.mgr.Sweep(ctx)
	if err != nil {
		t.Fatal(err)
	}
	destroyed := map[string]string{}
	for _, d := range rep.Destroyed {
		destroyed[d.LeaseID] = d.ProfileID + ": " + d.Reason
	}
	for _, id := range []string{live.Attempts[0].LeaseID, gone.Attempts[0].LeaseID, gone.LeaseID} {
		if _, ok := destroyed[id]; !ok {
			t.Errorf("the sweep left lease %s (destroyed: %v, errors %v)", id, destroyed, rep.Errors)
		}
	}
	if r := destroyed[live.Attempts[0].LeaseID]; !strings.Contains(r, "fell back") {
		t.Errorf("the abandoned attempt's lease was destroyed for %q, want the fallback named", r)
	}
	if _, ok := destroyed[live.LeaseID]; ok {
		t.Fatalf("the sweep destroyed the live environment's lease %s", live.LeaseID)
	}
	if _, ok := h.leases(dirB)[live.LeaseID]; !ok || len(h.leases(dirA)) != 0 {
		t.Fatalf("after the sweep: a has %v, b has %v", h.leases(dirA), h.leases(dirB))
	}
}

// TestLeaseLifetime: a short-expiry lease is renewed before it lapses while a session is
// attached; past its ttl an unattached environment is destroyed and an attached one is renewed,
// never destroyed; a provider that refuses renewal as the lease runs out fails the environment
// with the reason (its session's reclaim quotes it).
func TestLeaseLifetime(t *testing.T) {
	h := newCLIHarness(t)
	ctx := testenv.Context(t, 60*time.Second)
	dir, refusing := t.TempDir(), t.TempDir()
	lifetime := func(p *providers.Profile) {
		p.Lifetime = providers.Lifetime{IdleTimeout: providers.Duration(48 * time.Hour), TTL: providers.Duration(time.Hour)}
	}
	h.profile("short", dir, nil, []string{"--ttl", "2m"}, lifetime)
	h.profile("refuses", refusing, map[string]string{"LEASE_DIR_HEARTBEAT_FAIL": "quota: lease extension denied"}, []string{"--ttl", "1m"}, lifetime)

	attached, idle := h.create("short"), h.create("short")
	if err := h.mgr.Attach(ctx, attached.ID, "ses_1"); err != nil {
		t.Fatal(err)
	}
	h.mgr.ApplyLifecycle(ctx)
	if n := heartbeats(t, dir, attached.LeaseID); n != 1 {
		t.Fatalf("a 2m lease was renewed %d times in the first pass, want 1", n)
	}
	got, _ := h.mgr.Get(ctx, attached.ID)
	if !got.Lease.ExpiresAt.After(h.clock.Now()) {
		t.Fatalf("lease expires %s, before now %s: renewed too late", got.Lease.ExpiresAt, h.clock.Now())
	}

	h.clock.Advance(61 * time.Minute) // past the ttl
	stopped := h.mgr.ApplyLifecycle(ctx)
	if len(stopped) != 1 || stopped[0] != idle.ID {
		t.Fatalf("past the ttl the pass destroyed %v, want only the unattached %s", stopped, idle.ID)
	}
	if e, err := h.mgr.WaitFor(ctx, idle.ID, func(e envs.Environment) bool { return e.State == envs.Destroyed }); err != nil {
		t.Fatalf("unattached environment past its ttl: %v (%s)", err, e.State)
	}
	if _, ok := h.leases(dir)[idle.LeaseID]; ok {
		t.Fatal("the destroyed environment's lease is still there")
	}
	got, _ = h.mgr.Get(ctx, attached.ID)
	if got.State != envs.Attached || heartbeats(t, dir, attached.LeaseID) != 2 {
		t.Fatalf("attached environment past its ttl: %s, renewed %d times; want attached and renewed again", got.State, heartbeats(t, dir, attached.LeaseID))
	}

	refused := h.create("refuses")
	if err := h.mgr.Attach(ctx, refused.ID, "ses_2"); err != nil {
		t.Fatal(err)
	}
	h.clock.Advance(30 * time.Second) // the 1m lease runs out before the next pass could renew it
	h.mgr.ApplyLifecycle(ctx)
	e, err := h.mgr.WaitFor(ctx, refused.ID, func(e envs.Environment) bool { return e.State.Dead() || e.State == envs.Destroying })
	if err != nil || !strings.Contains(e.Error, "provider refused to renew lease "+refused.LeaseID) || !strings.Contains(e.Error, "quota: lease extension denied") {
		t.Fatalf("refused renewal: environment %s %q (%v), want failed with the provider's reason", e.State, e.Error, err)
	}
	if heartbeats(t, refusing, refused.LeaseID) == 0 {
		t.Fatal("the refusing provider was never asked to renew")
	}
}

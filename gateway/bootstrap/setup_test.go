package bootstrap_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/openclaw/cloudworkers/gateway/bootstrap"
	"github.com/openclaw/cloudworkers/gateway/envs"
	"github.com/openclaw/cloudworkers/gateway/profiles"
	"github.com/openclaw/cloudworkers/gateway/store/storetest"
	"github.com/openclaw/cloudworkers/internal/testrig/testenv"
	"github.com/openclaw/cloudworkers/providers"
	"github.com/openclaw/cloudworkers/providers/fake"
	"github.com/openclaw/cloudworkers/providers/local/localtest"
)

// setupHarness is an environment manager whose fake leases all point at one in-process local box,
// and a bootstrapper that runs setup phases on it.
type setupHarness struct {
	mgr  *envs.Manager
	prof *profiles.Store
	boot *bootstrap.Bootstrapper
	box  localtest.Box
}

func newSetupHarness(t *testing.T) *setupHarness {
	t.Helper()
	ctx := testenv.Context(t, 30*time.Second)
	box := localtest.Start(t)
	db := storetest.Open(t)
	prov := fake.New()
	prov.ProvisionFunc = func(_ context.Context, _ providers.Profile, opID string, req providers.ProvisionRequest) (providers.Lease, error) {
		l := providers.Lease{ID: req.LeaseID, SSHHost: box.Host, SSHPort: box.Port, SSHUser: box.User, SSHKeyPath: box.ClientKeyPath,
			HostKeys: []string{box.HostKey}}
		prov.Put(l)
		return l, nil
	}
	reg := providers.Registry{"fake": prov}
	ps := profiles.New(db, reg, nil)
	mgr := envs.New(envs.Config{DB: db, Profiles: ps, Providers: reg, GatewayID: "gw_setup", SweepInterval: -1, LifecycleInterval: -1})
	if err := mgr.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = mgr.Close(context.Background()) })
	boot := bootstrap.New(bootstrap.Config{Envs: mgr, CommandTimeout: 10 * time.Second})
	return &setupHarness{mgr: mgr, prof: ps, boot: boot, box: box}
}

// env leases an environment of a profile with the given setup, on the harness's box.
func (h *setupHarness) env(t *testing.T, id string, setup *providers.Setup) envs.Environment {
	t.Helper()
	ctx := testenv.Context(t, 30*time.Second)
	if _, err := h.prof.Put(ctx, &providers.Profile{ID: id, Provider: "fake", Setup: setup}); err != nil {
		t.Fatal(err)
	}
	e, _, err := h.mgr.Create(ctx, id, "")
	if err != nil {
		t.Fatal(err)
	}
	e, err = h.mgr.WaitFor(ctx, e.ID, func(e envs.Environment) bool { return e.State == envs.Bootstrapping || e.State.Dead() })
	if err != nil || e.State != envs.Bootstrapping {
		t.Fatalf("environment %s: %v (state %s, %s)", e.ID, err, e.State, e.Error)
	}
	return e
}

func (h *setupHarness) timeline(t *testing.T, id, kind string) []envs.Step {
	t.Helper()
	all, err := h.mgr.Timeline(testenv.Context(t, 10*time.Second), id)
	if err != nil {
		t.Fatal(err)
	}
	var out []envs.Step
	for _, s := range all {
		if s.Kind == kind {
			out = append(out, s)
		}
	}
	return out
}

// TestSetupRunsStepsCleanAndSkipsThemOnAWarmBox: the steps run in the workspace with a clean
// environment, their output is stored stripped of control characters with exit status and
// duration, closeNetwork runs on the gateway afterwards, and a second session on the same box
// skips setup (same cache key) and says so.
func TestSetupRunsStepsCleanAndSkipsThemOnAWarmBox(t *testing.T) {
	h := newSetupHarness(t)
	ctx := testenv.Context(t, 60*time.Second)
	t.Setenv("OPENCLAW_GATEWAY_SECRET", "must-not-reach-the-box")
	e := h.env(t, "withsetup", &providers.Setup{
		Steps: []providers.SetupStep{
			{Name: "toolchain", Run: `printf 'installing \033[31mred\033[0m\a\n'; touch toolchain.done; pwd`},
			{Name: "env", Run: `env | sort`, Timeout: providers.Duration(20 * time.Second)},
		},
		CloseNetwork: []string{"sh", "-c", `echo "egress dropped for {leaseId} of {envId}"; echo "secret=${OPENCLAW_GATEWAY_SECRET:-none}"`},
	})
	if err := h.boot.Setup(ctx, e, h.box.Dir); err != nil {
		t.Fatalf("setup: %v", err)
	}
	steps := h.timeline(t, e.ID, envs.StepSetup)
	if len(steps) != 2 || steps[0].Name != "toolchain" || steps[1].Name != "env" {
		t.Fatalf("setup timeline %+v, want toolchain then env", steps)
	}
	tool := steps[0]
	if tool.Result != envs.ResultOK || tool.StartedAt.IsZero() || !strings.Contains(tool.Output, "installing red") ||
		strings.ContainsAny(tool.Output, "\x1b\a") || !strings.Contains(tool.Output, h.box.Dir) {
		t.Fatalf("toolchain step %+v: want ok, its output (in the workspace %s) without control characters", tool, h.box.Dir)
	}
	// what the login session had (the box's USER and SHELL) and anything of the gateway's is gone
	for _, leak := range []string{"\nUSER=", "\nSHELL=", "SSH_CONNECTION", "SSH_AUTH_SOCK", "OPENCLAW", "must-not-reach"} {
		if strings.Contains("\n"+steps[1].Output, leak) {
			t.Errorf("a setup step's environment holds %s:\n%s", leak, steps[1].Output)
		}
	}
	if !strings.Contains(steps[1].Output, "PATH=") {
		t.Errorf("env step output %q has no PATH: did it run?", steps[1].Output)
	}
	cn := h.timeline(t, e.ID, envs.StepCloseNetwork)
	if len(cn) != 1 || cn[0].Result != envs.ResultOK || !strings.Contains(cn[0].Output, "egress dropped for "+e.LeaseID+" of "+e.ID) ||
		!strings.Contains(cn[0].Output, "secret=none") {
		t.Fatalf("closeNetwork timeline %+v: want ok with the lease expanded and a clean environment", cn)
	}

	warm, err := h.mgr.Get(ctx, e.ID)
	if err != nil || warm.SetupKey == "" {
		t.Fatalf("after setup the environment records no setup key: %v %+v", err, warm)
	}
	if err := h.boot.Setup(ctx, warm, h.box.Dir); err != nil {
		t.Fatalf("setup on the warm box: %v", err)
	}
	steps = h.timeline(t, e.ID, envs.StepSetup)
	if len(steps) != 3 || steps[2].Result != envs.ResultSkipped || !strings.Contains(steps[2].Detail, warm.SetupKey) {
		t.Fatalf("warm box timeline %+v: want one more entry, skipped (cache) naming the key", steps)
	}
	if n := len(h.timeline(t, e.ID, envs.StepCloseNetwork)); n != 1 {
		t.Fatalf("closeNetwork ran %d times, want once (the warm box's setup was skipped)", n)
	}
}

// TestSetupFailureFailsTheEnvironment: a failing step (exit status, timeout, endless output)
// fails the environment with the step's name and output tail, and the steps after it do not run.
func TestSetupFailureFailsTheEnvironment(t *testing.T) {
	h := newSetupHarness(t)
	cases := []struct {
		name      string
		steps     []providers.SetupStep
		wantInErr []string
		wantTail  string
	}{
		{"exit status", []providers.SetupStep{{Name: "deps", Run: `echo fetching; echo "E404 no such package" >&2; exit 3`}, {Name: "after", Run: "touch after.ran"}},
			[]string{`"deps"`, "exit status 3", "E404 no such package"}, "E404 no such package"},
		{"timeout", []providers.SetupStep{{Name: "slow", Run: `echo started; sleep 30`, Timeout: providers.Duration(time.Second)}},
			[]string{`"slow"`, "timed out after 1s"}, "started"},
		{"flood", []providers.SetupStep{{Name: "flood", Run: `head -c 2000000 /dev/zero | tr '\0' 'x'; echo; echo LAST LINE; exit 1`}},
			[]string{`"flood"`, "LAST LINE"}, "LAST LINE"},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctx := testenv.Context(t, 60*time.Second)
			e := h.env(t, "fail"+string(rune('a'+i)), &providers.Setup{Steps: c.steps})
			err := h.boot.Setup(ctx, e, h.box.Dir)
			var se *bootstrap.SetupError
			if !errors.As(err, &se) {
				t.Fatalf("setup error %v, want a *SetupError", err)
			}
			got, werr := h.mgr.WaitFor(ctx, e.ID, func(e envs.Environment) bool { return e.State.Dead() || e.State == envs.Destroying })
			if werr != nil {
				t.Fatal(werr)
			}
			for _, w := range c.wantInErr {
				if !strings.Contains(got.Error, w) {
					t.Errorf("environment error %q does not name %q", got.Error, w)
				}
			}
			steps := h.timeline(t, e.ID, envs.StepSetup)
			if len(steps) != 1 || steps[0].Result != envs.ResultFailed || !strings.Contains(steps[0].Output, c.wantTail) {
				t.Fatalf("timeline %+v: want the one failed step with its tail", steps)
			}
			if len(steps[0].Output) > envs.MaxOutputTail {
				t.Fatalf("stored output is %d bytes, more than the %d tail", len(steps[0].Output), envs.MaxOutputTail)
			}
			if got.SetupKey != "" {
				t.Fatalf("a failed setup recorded cache key %q", got.SetupKey)
			}
		})
	}
}

// TestCloseNetworkFailureFailsTheEnvironment: when the provider's command to close the box's
// network fails, the agent must not run with the network open: the environment fails.
func TestCloseNetworkFailureFailsTheEnvironment(t *testing.T) {
	h := newSetupHarness(t)
	ctx := testenv.Context(t, 30*time.Second)
	e := h.env(t, "closefail", &providers.Setup{Steps: []providers.SetupStep{{Name: "ok", Run: "true"}},
		CloseNetwork: []string{"sh", "-c", "echo 'egress API refused' >&2; exit 5"}})
	if err := h.boot.Setup(ctx, e, h.box.Dir); err == nil {
		t.Fatal("setup succeeded although closeNetwork failed")
	}
	got, err := h.mgr.WaitFor(ctx, e.ID, func(e envs.Environment) bool { return e.State.Dead() || e.State == envs.Destroying })
	if err != nil || !strings.Contains(got.Error, "closeNetwork") || !strings.Contains(got.Error, "egress API refused") {
		t.Fatalf("environment %s %q (%v): want it failed naming closeNetwork and its output", got.State, got.Error, err)
	}
	cn := h.timeline(t, e.ID, envs.StepCloseNetwork)
	if len(cn) != 1 || cn[0].Result != envs.ResultFailed || cn[0].ExitCode != 5 {
		t.Fatalf("closeNetwork timeline %+v", cn)
	}
}

package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/openclaw/cloudworkers/internal/testrig/testenv"
	"github.com/openclaw/cloudworkers/providers"
	"github.com/openclaw/cloudworkers/providers/command"
)

// With LEASE_DIR_AS_MAIN=1 the test binary is lease-dir itself, so the Crabbox preset can drive it.
func TestMain(m *testing.M) {
	if os.Getenv("LEASE_DIR_AS_MAIN") == "1" {
		os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

func leaseDirProvider(t *testing.T) *command.Provider {
	return command.New(command.Config{WorkRoot: t.TempDir()})
}

// crabboxProfile is a Crabbox-shaped profile whose binary is this test binary acting as lease-dir.
func crabboxProfile(t *testing.T, dir string, env map[string]string) providers.Profile {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	e := map[string]string{"LEASE_DIR_AS_MAIN": "1", "LEASE_DIR": dir, "GORACE": "atexit_sleep_ms=0"}
	for k, v := range env {
		e[k] = v
	}
	// lease-dir speaks what we once assumed Crabbox does (labels on warmup): the generic command
	// provider drives it; the Crabbox preset is tested against examples/lease-crabbox.
	b, _ := json.Marshal(map[string]any{
		"provision": []string{exe, "warmup", "--provider", "dir", "--class", "{class}", "--ttl", "{ttl}", "--idle-timeout", "{idleTimeout}",
			"--lease-id", "{leaseId}", "--label", "openclaw.gateway={gatewayId}", "--label", "openclaw.environment={envId}"},
		"inspect": []string{exe, "inspect", "--id", "{leaseId}", "--json"},
		"renew":   []string{exe, "heartbeat", "--id", "{leaseId}"},
		"destroy": []string{exe, "stop", "{leaseId}"},
		"list":    []string{exe, "list", "--json"},
		"class":   "small", "leaseIdPrefix": "cbx_", "pollInterval": "10ms", "env": e,
	})
	if err := leaseDirProvider(t).ValidateSettings(b); err != nil {
		t.Fatal(err)
	}
	p := providers.Profile{ID: "demo", Provider: "command", Settings: b}
	p.SetDefaults()
	return p
}

func TestCrabboxPresetDrivesLeaseDir(t *testing.T) {
	ctx, dir := testenv.Context(t, 30*time.Second), t.TempDir()
	prof := crabboxProfile(t, dir, nil)
	p := leaseDirProvider(t)
	req := providers.ProvisionRequest{EnvironmentID: "env_1", GatewayID: "gw_1"}

	lease, err := p.Provision(ctx, prof, "op-1", req)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, _, _, err := ssh.ParseAuthorizedKey([]byte(lease.HostKeys[0])); err != nil {
		t.Fatalf("host key: %v", err)
	}
	key, err := os.ReadFile(lease.SSHKeyPath)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ssh.ParsePrivateKey(key); err != nil {
		t.Fatalf("private key: %v", err)
	}
	if fi, _ := os.Stat(lease.SSHKeyPath); fi.Mode().Perm() != 0o600 {
		t.Fatalf("key mode %v", fi.Mode())
	}
	if lease.SSHUser != "box" || lease.Labels[providers.LabelEnvironment] != "env_1" || lease.ExpiresAt.IsZero() {
		t.Fatalf("lease = %+v", lease)
	}

	// A restarted gateway re-sends the same lease id and adopts the same machine.
	again, err := p.Provision(ctx, prof, "op-1", req)
	if err != nil || again.ID != lease.ID || again.HostKeys[0] != lease.HostKeys[0] {
		t.Fatalf("second provision %+v, %v", again, err)
	}
	calls, _ := os.ReadFile(filepath.Join(dir, "calls.log"))
	if n := strings.Count(string(calls), `"leaseId":"`+lease.ID+`"`); n != 2 {
		t.Fatalf("calls.log has %d warmups of %s:\n%s", n, lease.ID, calls)
	}

	if err := p.Renew(ctx, prof, lease); err != nil {
		t.Fatal(err)
	}
	list, err := p.List(ctx, prof)
	if err != nil || len(list) != 1 || !list[0].Ready || list[0].Labels[providers.LabelGateway] != "gw_1" {
		t.Fatalf("list = %+v, %v", list, err)
	}

	if err := p.Destroy(ctx, prof, lease); err != nil {
		t.Fatal(err)
	}
	st, err := p.Inspect(ctx, prof, lease)
	if err != nil || !st.Gone || st.State != "released" {
		t.Fatalf("inspect after stop = %+v, %v", st, err)
	}
	if _, err := os.Stat(lease.SSHKeyPath); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("key survived stop: %v", err)
	}
	if err := p.Renew(ctx, prof, lease); !errors.Is(err, providers.ErrLeaseGone) {
		t.Fatalf("renew after stop: %v", err)
	}
	st, err = p.Inspect(ctx, prof, providers.Lease{ID: "cbx_never"})
	if err != nil || !st.Gone {
		t.Fatalf("inspect of an unknown lease = %+v, %v", st, err)
	}
	if err := p.Destroy(ctx, prof, providers.Lease{ID: "cbx_never"}); err != nil {
		t.Fatalf("stop of an unknown lease: %v", err)
	}
}

func TestFaultInjection(t *testing.T) {
	ctx := testenv.Context(t, 30*time.Second)
	p := leaseDirProvider(t)
	req := providers.ProvisionRequest{EnvironmentID: "e", GatewayID: "g"}
	for _, tc := range []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"LEASE_DIR_INSPECT_GARBAGE": "1"}, "malformed JSON"},
		{map[string]string{"LEASE_DIR_NO_HOSTKEY": "1"}, "refusing to connect unpinned"},
	} {
		_, err := p.Provision(ctx, crabboxProfile(t, t.TempDir(), tc.env), "op", req)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: err = %v, want %q", tc.env, err, tc.want)
		}
	}

	// Destroy retries: the first two stops fail, the third succeeds.
	dir := t.TempDir()
	prof := crabboxProfile(t, dir, map[string]string{"LEASE_DIR_STOP_FAILS": "2"})
	lease, err := p.Provision(ctx, prof, "op", req)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if err := p.Destroy(ctx, prof, lease); err == nil || !strings.Contains(err.Error(), "exited 1: temporary error") {
			t.Fatalf("stop %d: %v", i, err)
		}
	}
	if err := p.Destroy(ctx, prof, lease); err != nil {
		t.Fatal(err)
	}
}

func TestWarmupFailAndUsage(t *testing.T) {
	t.Setenv("LEASE_DIR", t.TempDir())
	var out, errOut bytes.Buffer
	if code := run([]string{"warmup", "--lease-id", "x1", "--fail", "capacity exhausted"}, &out, &errOut); code != 3 ||
		strings.TrimSpace(errOut.String()) != "capacity exhausted" {
		t.Fatalf("exit %d, stderr %q", code, errOut.String())
	}
	errOut.Reset()
	if code := run([]string{"inspect", "--id", "x1", "--json"}, &out, &errOut); code != 1 || !strings.Contains(errOut.String(), "no such lease x1") {
		t.Fatalf("exit %d, stderr %q: a failed warmup must not create a lease", code, errOut.String())
	}
	for _, args := range [][]string{nil, {"frobnicate"}, {"warmup"}, {"warmup", "--lease-id", "../escape"}} {
		errOut.Reset()
		if code := run(args, &out, &errOut); code != 2 || !strings.Contains(errOut.String(), "usage: lease-dir") {
			t.Errorf("%q: exit %d, stderr %q", args, code, errOut.String())
		}
	}
}

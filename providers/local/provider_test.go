package local

import (
	"errors"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/openclaw/cloudworkers/internal/testrig/testenv"
	"github.com/openclaw/cloudworkers/providers"
)

var testProfile = providers.Profile{ID: "dev", Provider: "local"}

// newTestProvider returns a provider whose boxes are this test binary re-executed in box mode.
func newTestProvider(t *testing.T, boxes string) *Provider {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	p, err := New(Config{BoxesDir: boxes, Command: []string{exe, "localbox"}})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// killBoxOnCleanup makes sure the detached box of leaseID dies with the test, even on failure.
func killBoxOnCleanup(t *testing.T, p *Provider, leaseID string) {
	t.Helper()
	dir := p.BoxDir(leaseID)
	t.Cleanup(func() {
		if pid, alive, _ := probeBox(dir); alive && pid > 1 {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		if st, err := ReadState(dir); err == nil && st.PID > 1 && st.PID != os.Getpid() {
			_ = syscall.Kill(st.PID, syscall.SIGKILL)
		}
	})
}

func provision(t *testing.T, p *Provider, opID string) providers.Lease {
	t.Helper()
	killBoxOnCleanup(t, p, LeaseIDFor(opID))
	lease, err := p.Provision(testenv.Context(t, 20*time.Second), testProfile, opID, providers.ProvisionRequest{GatewayID: "gw1", EnvironmentID: "env1"})
	if err != nil {
		t.Fatalf("Provision: %v", err)
	}
	return lease
}

func boxPID(t *testing.T, p *Provider, leaseID string) int {
	t.Helper()
	st, err := ReadState(p.BoxDir(leaseID))
	if err != nil {
		t.Fatal(err)
	}
	return st.PID
}

func TestProviderLifecycle(t *testing.T) {
	t.Setenv(canaryEnv, "leaked")
	boxes := filepath.Join(t.TempDir(), "boxes")
	p := newTestProvider(t, boxes)
	ctx := testenv.Context(t, 20*time.Second)

	lease := provision(t, p, "op-1")
	if err := lease.Validate(); err != nil {
		t.Fatal(err)
	}
	dir := p.BoxDir(lease.ID)
	if lease.ID != LeaseIDFor("op-1") || !strings.HasPrefix(lease.ID, "lb_") || len(lease.ID) != 15 {
		t.Errorf("lease id = %q", lease.ID)
	}
	if lease.SSHHost != "127.0.0.1" || lease.SSHKeyPath != filepath.Join(dir, ".localbox", "client_ed25519") {
		t.Errorf("lease = %+v", lease)
	}
	if lease.Labels[providers.LabelGateway] != "gw1" || lease.Labels[providers.LabelEnvironment] != "env1" {
		t.Errorf("labels = %v", lease.Labels)
	}
	pid := boxPID(t, p, lease.ID)
	if pid == os.Getpid() {
		t.Fatal("box runs in the test process, want a detached process")
	}
	if pgid, err := syscall.Getpgid(pid); err != nil || pgid != pid {
		t.Errorf("box process group = %d, %v; want its own (setsid) group %d", pgid, err, pid)
	}

	c, err := dialBox(t, lease.SSHHost, lease.SSHPort, lease.SSHUser, lease.SSHKeyPath, lease.HostKeys[0])
	if err != nil {
		t.Fatalf("dial lease: %v", err)
	}
	out, _, err := run(t, c, `echo "$HOME"; env`)
	if err != nil {
		t.Fatal(err)
	}
	if first, _, _ := strings.Cut(out, "\n"); first != dir {
		t.Errorf("HOME = %q, want %q", first, dir)
	}
	if strings.Contains(out, canaryEnv) {
		t.Errorf("gateway environment leaked into the box: %s", out)
	}

	// Same operation id: same lease, same process, also when asked concurrently.
	var wg sync.WaitGroup
	leases := make([]providers.Lease, 3)
	errs := make([]error, 3)
	for i := range leases {
		wg.Go(func() {
			leases[i], errs[i] = p.Provision(ctx, testProfile, "op-1", providers.ProvisionRequest{GatewayID: "gw1", EnvironmentID: "env1"})
		})
	}
	wg.Wait()
	for i := range leases {
		if errs[i] != nil || leases[i].SSHPort != lease.SSHPort || leases[i].HostKeys[0] != lease.HostKeys[0] {
			t.Errorf("re-provision %d = %+v, %v; want %+v", i, leases[i], errs[i], lease)
		}
	}
	if got := boxPID(t, p, lease.ID); got != pid {
		t.Errorf("re-provision started another process: pid %d, was %d", got, pid)
	}

	// The box is detached: a new provider (a restarted gateway) finds it running.
	p = newTestProvider(t, boxes)
	ls, err := p.Inspect(ctx, testProfile, providers.Lease{ID: lease.ID})
	if err != nil || !ls.Ready || ls.Gone || ls.State != StateRunning || ls.Lease.SSHPort != lease.SSHPort {
		t.Fatalf("Inspect after provider restart = %+v, %v", ls, err)
	}
	list, err := p.List(ctx, testProfile)
	if err != nil || len(list) != 1 || list[0].LeaseID != lease.ID || list[0].Labels[providers.LabelGateway] != "gw1" {
		t.Fatalf("List = %+v, %v", list, err)
	}
	if again, err := p.Provision(ctx, testProfile, "op-1", providers.ProvisionRequest{}); err != nil || again.SSHPort != lease.SSHPort {
		t.Fatalf("adopt after provider restart = %+v, %v", again, err)
	}

	// Destroy stops the process and removes the box; it is idempotent and proven by Inspect.
	if err := p.Destroy(ctx, testProfile, lease); err != nil {
		t.Fatalf("Destroy: %v", err)
	}
	testenv.Eventually(t, "box process to exit", func() bool { return !testenv.Alive(pid) })
	if _, err := os.Stat(dir); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("box dir after Destroy: %v", err)
	}
	if err := p.Destroy(ctx, testProfile, lease); err != nil {
		t.Errorf("second Destroy: %v", err)
	}
	ls, err = p.Inspect(ctx, testProfile, lease)
	if err != nil || !ls.Gone || ls.Ready || ls.State != StateGone {
		t.Errorf("Inspect after Destroy = %+v, %v", ls, err)
	}
	if conn, err := net.Dial("tcp", net.JoinHostPort(lease.SSHHost, strconv.Itoa(lease.SSHPort))); err == nil {
		conn.Close()
		t.Error("destroyed box still listens")
	}
}

func TestProviderDeadBoxIsGone(t *testing.T) {
	p := newTestProvider(t, filepath.Join(t.TempDir(), "boxes"))
	ctx := testenv.Context(t, 20*time.Second)
	lease := provision(t, p, "op-dead")
	dir := p.BoxDir(lease.ID)
	pid := boxPID(t, p, lease.ID)

	// SIGTERM is a clean shutdown: the box closes its listener and exits.
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "box to report gone", func() bool {
		ls, err := p.Inspect(ctx, testProfile, lease)
		return err == nil && ls.Gone
	})
	ls, err := p.Inspect(ctx, testProfile, lease)
	if err != nil || ls.State != StateStopped || ls.Ready || ls.Labels[providers.LabelEnvironment] != "env1" {
		t.Errorf("Inspect of a dead box = %+v, %v", ls, err)
	}
	logged, _ := os.ReadFile(filepath.Join(dir, ".localbox", "box.log"))
	if !strings.Contains(string(logged), "box stopped") {
		t.Errorf("box log does not show a clean shutdown:\n%s", logged)
	}
	list, err := p.List(ctx, testProfile)
	if err != nil || len(list) != 1 || !list[0].Gone || list[0].Labels[providers.LabelGateway] != "gw1" {
		t.Errorf("List with a dead box = %+v, %v", list, err)
	}

	// Provisioning the same operation again restarts the box with the same pinned host key.
	again := provision(t, p, "op-dead")
	if again.HostKeys[0] != lease.HostKeys[0] {
		t.Errorf("host key changed across restart: %s vs %s", again.HostKeys[0], lease.HostKeys[0])
	}
	if newPID := boxPID(t, p, lease.ID); newPID == pid {
		t.Errorf("box was not restarted (pid %d)", newPID)
	}
	if err := p.Destroy(ctx, testProfile, again); err != nil {
		t.Fatal(err)
	}
}

func TestProviderBoxExitsWhenDirRemoved(t *testing.T) {
	p := newTestProvider(t, filepath.Join(t.TempDir(), "boxes"))
	lease := provision(t, p, "op-rm")
	pid := boxPID(t, p, lease.ID)
	if err := os.RemoveAll(p.BoxDir(lease.ID)); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "box process to exit after its directory was removed", func() bool { return !testenv.Alive(pid) })
}

func TestProviderStartFailure(t *testing.T) {
	p, err := New(Config{BoxesDir: filepath.Join(t.TempDir(), "boxes"), Command: []string{"/bin/sh", "-c", "echo no box here >&2; exit 7", "sh"}})
	if err != nil {
		t.Fatal(err)
	}
	_, err = p.Provision(testenv.Context(t, 20*time.Second), testProfile, "op-fail", providers.ProvisionRequest{})
	if err == nil || !strings.Contains(err.Error(), "no box here") {
		t.Fatalf("Provision with a failing box command: %v; want an error quoting the box log", err)
	}
}

func TestProviderRejectsBadIDsAndSettings(t *testing.T) {
	p := newTestProvider(t, t.TempDir())
	ctx := testenv.Context(t, 20*time.Second)
	for _, id := range []string{"../escape", "a/b", "", ".hidden"} {
		if _, err := p.Inspect(ctx, testProfile, providers.Lease{ID: id}); err == nil {
			t.Errorf("Inspect(%q) accepted", id)
		}
		if err := p.Destroy(ctx, testProfile, providers.Lease{ID: id}); err == nil {
			t.Errorf("Destroy(%q) accepted", id)
		}
	}
	if _, err := p.Provision(ctx, testProfile, "op", providers.ProvisionRequest{LeaseID: "../x"}); err == nil {
		t.Error("Provision with a path lease id accepted")
	}
	for settings, ok := range map[string]bool{"": true, "{}": true, "null": true, `{"image":"x"}`: false} {
		err := p.ValidateSettings([]byte(settings))
		var fe *providers.FieldError
		if ok != (err == nil) || (!ok && !errors.As(err, &fe)) {
			t.Errorf("ValidateSettings(%q) = %v", settings, err)
		}
	}
}

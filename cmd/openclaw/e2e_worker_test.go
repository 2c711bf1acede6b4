package main_test

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/openclaw/cloudworkers/gateway/envs"
	"github.com/openclaw/cloudworkers/internal/testrig/testenv"
	"github.com/openclaw/cloudworkers/providers/local"
)

// fastWorkerConfig makes dead links and dead workers visible within a second or two.
const fastWorkerConfig = `tunnel: {keepaliveInterval: 200ms, keepaliveTimeout: 1s, backoffMax: 500ms}
worker: {heartbeatTimeout: 1500ms, relaunchGrace: 1s, admitTimeout: 30s}
`

func (g *gw) events(id string) []envs.Event {
	g.t.Helper()
	return must(g.client.EnvironmentEvents(g.ctx(), id))(g.t)
}

// countNotes counts progress notes of an environment that contain s.
func (g *gw) countNotes(id, s string) int {
	n := 0
	for _, ev := range g.events(id) {
		if ev.From == ev.To && strings.Contains(ev.Reason, s) {
			n++
		}
	}
	return n
}

func (g *gw) waitNotes(id, s string, n int) {
	g.t.Helper()
	waitUntil(g.t, 45*time.Second, func() string {
		var lines []string
		for _, ev := range g.events(id) {
			lines = append(lines, string(ev.To)+": "+ev.Reason)
		}
		return fmt.Sprintf("environment %s: fewer than %d notes %q:\n%s", id, n, s, strings.Join(lines, "\n"))
	}, func() bool { return g.countNotes(id, s) >= n })
}

func (g *gw) waitReady(id string) envs.Environment {
	g.t.Helper()
	e := g.waitEnv(id, func(e envs.Environment) bool { return e.State == envs.Ready || e.State.Dead() })
	if e.State != envs.Ready {
		var lines []string
		for _, ev := range g.events(id) {
			lines = append(lines, string(ev.To)+": "+ev.Reason)
		}
		g.t.Fatalf("environment %s %s: %s\n%s", id, e.State, e.Error, strings.Join(lines, "\n"))
	}
	return e
}

// workerPID reads the worker's pidfile on a box whose HOME is on this machine.
func workerPID(t *testing.T, e envs.Environment) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(e.WorkerHome, ".openclaw-worker/state", e.ID, "worker.pid"))
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

func waitGone(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for testenv.Alive(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("process %d still alive", pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestLocalBoxWorkerLifecycle: cold box → ready with an admitted worker; a killed worker is
// relaunched and re-admitted; a SIGKILLed gateway re-dials and the same worker is re-admitted;
// destroy stops the worker and removes the box.
func TestLocalBoxWorkerLifecycle(t *testing.T) {
	root := t.TempDir()
	g := startGateway(t, filepath.Join(root, "data"), fastWorkerConfig)
	e := g.createEnv("local")
	e = g.waitReady(e.ID)
	if e.TunnelStatus != "connected" || e.BundleHash == "" {
		t.Fatalf("ready but tunnel %s bundle %q", e.TunnelStatus, e.BundleHash)
	}
	for _, check := range []string{"check sshAgent: pass", "check cleanEnv: pass", "worker: admitted", "bytes uploaded", "host key pinned"} {
		if check == "bytes uploaded" {
			check = "uploaded,"
		}
		if g.countNotes(e.ID, check) == 0 {
			t.Errorf("no note %q", check)
		}
	}
	pid := workerPID(t, e)
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })

	// the worker dies: it is relaunched and re-admitted
	pid2 := g.killWorker(e, pid)
	t.Cleanup(func() { _ = syscall.Kill(pid2, syscall.SIGKILL) })

	// the gateway dies: the box and the worker live on; a new gateway re-dials and re-admits it
	g.kill()
	g.start()
	g.waitNotes(e.ID, "tunnel: re-opened after gateway restart", 1)
	g.waitNotes(e.ID, "worker: re-admitted", 2)
	got := g.waitEnv(e.ID, func(e envs.Environment) bool { return e.TunnelStatus == "connected" })
	if got.State != envs.Ready || workerPID(t, e) != pid2 || g.countNotes(e.ID, "worker: launched") != 2 {
		t.Fatalf("after restart: state %s, worker pid %d (want %d), launches %d", got.State, workerPID(t, e), pid2, g.countNotes(e.ID, "worker: launched"))
	}

	if d, err := g.destroy(e.ID, false, 30*time.Second); err != nil || d.State != envs.Destroyed {
		t.Fatalf("destroy: %v %s", err, d.State)
	}
	waitGone(t, pid2)
	if _, err := os.Stat(e.WorkerHome); !os.IsNotExist(err) {
		t.Fatalf("box dir left behind: %v", err)
	}
	g.stop()
}

func staticProfile(id string, st local.State, hostKey string) string {
	hosts, _ := json.Marshal([]map[string]any{{"host": st.Host, "port": st.Port, "user": st.User, "keyPath": st.ClientKeyPath, "hostKey": hostKey}})
	return fmt.Sprintf("  - id: %s\n    provider: static\n    hygiene: {metadataRoute: warn, dockerSocket: warn}\n    settings: {hosts: %s}\n", id, hosts)
}

// TestWarmBoxAndHostKeyPinning: a second environment on the same (warm) box uploads zero bundle
// bytes; a box that presents a different host key is refused, audited, and nothing is uploaded.
func TestWarmBoxAndHostKeyPinning(t *testing.T) {
	root := t.TempDir()
	_, warm := startLocalbox(t, filepath.Join(root, "warm"))
	_, other := startLocalbox(t, filepath.Join(root, "other"))
	cfg := fastWorkerConfig + "profiles:\n" + staticProfile("warm", warm, warm.HostKey) +
		staticProfile("liar", other, warm.HostKey) // pins warm's key, but the box presents its own
	g := startGateway(t, filepath.Join(root, "data"), cfg)

	e1 := g.createEnv("warm")
	e1 = g.waitReady(e1.ID)
	if g.countNotes(e1.ID, "uploaded,") != 1 {
		t.Fatalf("cold box: no upload note")
	}
	if _, err := g.destroy(e1.ID, false, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	e2 := g.createEnv("warm")
	e2 = g.waitReady(e2.ID)
	if g.countNotes(e2.ID, "already installed (0 bytes uploaded)") != 1 || g.countNotes(e2.ID, "uploaded,") != 0 {
		t.Fatalf("warm box uploaded the bundle again")
	}

	bad := g.createEnv("liar")
	bad = g.waitEnv(bad.ID, func(e envs.Environment) bool { return e.State.Dead() })
	if bad.State != envs.Failed || !strings.Contains(bad.Error, "host key mismatch") ||
		!strings.Contains(bad.Error, "SHA256:") {
		t.Fatalf("mismatch: state %s error %q", bad.State, bad.Error)
	}
	audit, err := g.client.Audit(g.ctx(), bad.ID)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, a := range audit {
		found = found || a.Kind == "ssh.hostkey-mismatch"
	}
	if !found {
		t.Fatalf("no hostkey-mismatch audit row: %+v", audit)
	}
	if _, err := os.Stat(filepath.Join(root, "other", ".openclaw-worker")); !os.IsNotExist(err) {
		t.Fatalf("something was uploaded to the box with the wrong host key: %v", err)
	}
	g.stop()
}

// netnsProfile is the command profile "netns" leasing boxes with real OpenSSH sshd through
// lease-netns, and lease-netns's state dir.
func netnsProfile(t *testing.T) (cfg, state string) {
	t.Helper()
	testenv.RequireRoot(t)
	testenv.RequireCommands(t, "ip", "sshd", "useradd", "setsid", "sha256sum")
	state = testenv.PublicDir(t, "ocw-e2e-")
	// Registered before any gateway of the test starts, so it runs after the gateway is killed
	// (cleanups run last-in first-out) and before the state dir goes: every lease the gateway
	// made, including one it made while the test's own cleanups ran, is stopped, and no box
	// (network namespace, sshd) outlives the test.
	t.Cleanup(func() { stopNetnsLeases(state) })
	l := leaseNetnsBin
	return fmt.Sprintf(`profiles:
  - id: netns
    provider: command
    settings:
      provision: [%[1]s, --state-dir, %[2]s, warmup, --lease-id, "{leaseId}", --label, "openclaw.gateway={gatewayId}", --label, "openclaw.environment={envId}"]
      inspect: [%[1]s, --state-dir, %[2]s, inspect, --id, "{leaseId}", --json]
      destroy: [%[1]s, --state-dir, %[2]s, stop, "{leaseId}"]
      list: [%[1]s, --state-dir, %[2]s, list, --json]
      timeout: 1m
      pollInterval: 100ms
`, l, state), state
}

// netnsEnv starts a gateway on cfg plus the netns profile and waits for an environment on that
// profile to be ready; its lease is stopped at cleanup even when the test fails (netnsProfile). It also returns
// lease-netns's state dir.
func netnsEnv(t *testing.T, cfg string) (*gw, envs.Environment, string) {
	t.Helper()
	profiles, state := netnsProfile(t)
	g := startGateway(t, filepath.Join(t.TempDir(), "data"), cfg+profiles)
	e := g.createEnv("netns")
	return g, g.waitReady(e.ID), state
}

// killWorker SIGKILLs pid, e's first worker, and returns the pid of the worker the gateway
// relaunched and re-admitted in its place.
func (g *gw) killWorker(e envs.Environment, pid int) int {
	g.t.Helper()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		g.t.Fatal(err)
	}
	g.waitNotes(e.ID, "worker: launched", 2)
	g.waitNotes(e.ID, "worker: re-admitted", 1)
	pid2 := workerPID(g.t, e)
	if pid2 == pid || !testenv.Alive(pid2) {
		g.t.Fatalf("worker not relaunched: old %d new %d alive=%v", pid, pid2, testenv.Alive(pid2))
	}
	return pid2
}

// TestNetnsPartitionAndRestart: against real OpenSSH sshd in a network namespace: a cold box
// becomes ready; a link down longer than the keepalive deadline shows reconnecting, link up
// shows connected and the same worker is re-admitted without a restart; a SIGKILLed gateway
// re-dials and re-admits it too.
func TestNetnsPartitionAndRestart(t *testing.T) {
	g, e, state := netnsEnv(t, fastWorkerConfig)
	for _, check := range []string{"check metadataRoute: pass", "check dockerSocket: pass", "check sshAgent: pass", "check cleanEnv: pass"} {
		if g.countNotes(e.ID, check) == 0 {
			t.Errorf("no note %q", check)
		}
	}
	pid := workerPID(t, e)
	link := func(dir string) {
		if out, err := exec.Command(leaseNetnsBin, "--state-dir", state, "link", "--id", e.LeaseID, dir).CombinedOutput(); err != nil {
			t.Fatalf("link %s: %v %s", dir, err, out)
		}
	}
	link("down")
	g.waitEnv(e.ID, func(e envs.Environment) bool { return e.TunnelStatus == "reconnecting" })
	link("up")
	g.waitEnv(e.ID, func(e envs.Environment) bool { return e.TunnelStatus == "connected" })
	// the same worker process comes back through the new forward
	waitUntil(t, 30*time.Second, func() string { return "worker not re-admitted after link up" }, func() bool {
		info, _ := g.client.EnvironmentWorker(g.ctx(), e.ID)
		return info.Admitted
	})
	if workerPID(t, e) != pid || !testenv.Alive(pid) || g.countNotes(e.ID, "worker: launched") != 1 {
		t.Fatalf("worker was restarted (pid %d → %d, launches %d)", pid, workerPID(t, e), g.countNotes(e.ID, "worker: launched"))
	}

	g.kill()
	g.start()
	g.waitNotes(e.ID, "worker: re-admitted", 1)
	if workerPID(t, e) != pid || g.countNotes(e.ID, "worker: launched") != 1 {
		t.Fatalf("worker restarted across gateway restart")
	}
	if d, err := g.destroy(e.ID, false, 60*time.Second); err != nil || d.State != envs.Destroyed {
		t.Fatalf("destroy: %v %s", err, d.State)
	}
	waitGone(t, pid)
	g.stop()
}

// netnsBox leases a box from lease-netns directly (outside the gateway) and returns its inspect view.
func netnsBox(t *testing.T, state, id string) local.State {
	t.Helper()
	run := func(args ...string) []byte {
		out, err := exec.Command(leaseNetnsBin, append([]string{"--state-dir", state}, args...)...).Output()
		if err != nil {
			t.Fatalf("lease-netns %v: %v", args, err)
		}
		return out
	}
	run("warmup", "--lease-id", id)
	var v struct {
		SSHHost, SSHUser, SSHKey, SSHHostKey string
		SSHPort                              int
	}
	if err := json.Unmarshal(run("inspect", "--id", id, "--json"), &v); err != nil {
		t.Fatal(err)
	}
	return local.State{Host: v.SSHHost, Port: v.SSHPort, User: v.SSHUser, ClientKeyPath: v.SSHKey, HostKey: v.SSHHostKey}
}

// TestNetnsWarmBoxPinningAndWorkerDeath: against real OpenSSH sshd: a second environment on a warm
// box uploads zero bundle bytes, a killed worker is relaunched, and a box presenting another host
// key is refused with nothing uploaded.
func TestNetnsWarmBoxPinningAndWorkerDeath(t *testing.T) {
	_, state := netnsProfile(t)
	warm := netnsBox(t, state, "ocl_warmtest01")
	other := netnsBox(t, state, "ocl_othertest1")
	cfg := fastWorkerConfig + "profiles:\n" + staticProfile("warm", warm, warm.HostKey) + staticProfile("liar", other, warm.HostKey)
	g := startGateway(t, filepath.Join(t.TempDir(), "data"), cfg)

	e1 := g.waitReady(g.createEnv("warm").ID)
	if g.countNotes(e1.ID, "uploaded,") != 1 {
		t.Fatal("cold box: no upload")
	}
	pid2 := g.killWorker(e1, workerPID(t, e1))
	if _, err := g.destroy(e1.ID, false, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	waitGone(t, pid2)
	e2 := g.waitReady(g.createEnv("warm").ID)
	if g.countNotes(e2.ID, "already installed (0 bytes uploaded)") != 1 {
		t.Fatal("warm box uploaded the bundle again")
	}

	bad := g.waitEnv(g.createEnv("liar").ID, func(e envs.Environment) bool { return e.State.Dead() })
	if bad.State != envs.Failed || !strings.Contains(bad.Error, "host key mismatch") {
		t.Fatalf("mismatch: %s %q", bad.State, bad.Error)
	}
	var v struct{ Home string }
	out, _ := exec.Command(leaseNetnsBin, "--state-dir", state, "inspect", "--id", "ocl_othertest1", "--json").Output()
	_ = json.Unmarshal(out, &v)
	if v.Home == "" {
		t.Fatal("lease-netns inspect has no home")
	}
	if _, err := os.Stat(filepath.Join(v.Home, ".openclaw-worker")); !os.IsNotExist(err) {
		t.Fatalf("something was uploaded to the box with the wrong host key: %v", err)
	}
	if _, err := g.destroy(e2.ID, false, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	g.stop()
}

// TestDoctor: every link of the chain is reported for a working profile, and a broken one names the
// failing link and a fix.
func TestDoctor(t *testing.T) {
	root := t.TempDir()
	cfg := fastWorkerConfig + `profiles:
  - id: broken
    provider: static
    settings: {hosts: [{host: 127.0.0.1, port: 1, user: x, keyPath: /nonexistent/key, hostKey: "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBce48quDS/+tr2Hvg38tWASAm84+L03gfwWbiXyQsK3"}]}
`
	g := startGateway(t, filepath.Join(root, "data"), cfg)
	doctor := func(profile string) ([]map[string]any, error) {
		out, err := exec.Command(openclawBin, "doctor", "--profile", profile, "-o", "json", "--gateway", g.addr, "--data-dir", g.dataDir).Output()
		var steps []map[string]any
		if jerr := json.Unmarshal(out, &steps); jerr != nil {
			t.Fatalf("doctor output %q: %v", out, jerr)
		}
		return steps, err
	}
	steps, err := doctor("local")
	if err != nil {
		t.Fatalf("doctor on a working profile failed: %v %v", err, steps)
	}
	var names []string
	for _, s := range steps {
		names = append(names, s["name"].(string))
		if s["ok"] != true {
			t.Errorf("step %v failed", s)
		}
	}
	for _, want := range []string{"gateway", "profile", "provider", "ssh", "bundle", "hygiene", "tunnel", "worker", "sync", "inference", "cleanup"} {
		if !strings.Contains(" "+strings.Join(names, " ")+" ", " "+want+" ") {
			t.Errorf("no %s step in %v", want, names)
		}
	}
	steps, err = doctor("broken")
	if err == nil {
		t.Fatalf("doctor on a broken profile succeeded: %v", steps)
	}
	last := steps[len(steps)-2] // the cleanup step comes last
	if last["name"] != "ssh" || last["ok"] != false || !strings.Contains(fmt.Sprint(last["fix"]), "private key") {
		t.Fatalf("failing step %v", last)
	}
	g.stop()
}

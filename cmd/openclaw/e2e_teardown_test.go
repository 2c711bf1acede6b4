package main_test

import (
	"errors"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/openclaw/cloudworkers/gateway/envs"
	"github.com/openclaw/cloudworkers/gateway/placement"
	"github.com/openclaw/cloudworkers/gateway/tunnel/tunneltest"
	"github.com/openclaw/cloudworkers/internal/testrig/testenv"
	"github.com/openclaw/cloudworkers/providers/local"
)

// cleanupSocketDir removes at the end of the test what a box the test kills leaves in this
// machine's /tmp: the socket directory of e if its HOME is too deep for the socket (a box that
// stops by itself removes it).
func cleanupSocketDir(t *testing.T, e envs.Environment) {
	if d := filepath.Dir(e.WorkerSocket); filepath.Dir(d) == "/tmp" {
		t.Cleanup(func() { _ = os.RemoveAll(d) })
	}
}

// startLocalbox runs `openclaw localbox` outside any provider (a machine that exists on its own)
// and returns its process, so a test can take the box away, and its state.
func startLocalbox(t *testing.T, dir string) (*exec.Cmd, local.State) {
	t.Helper()
	cmd := exec.Command(openclawBin, "localbox", "--dir", dir)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// SIGTERM first: a box that stops by itself removes what it left in /tmp.
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		done := time.AfterFunc(5*time.Second, func() { _ = cmd.Process.Kill() })
		_ = cmd.Wait()
		done.Stop()
	})
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		st, err := local.ReadState(dir)
		if err == nil && st.Port > 0 {
			return cmd, st
		}
		if time.Now().After(deadline) {
			t.Fatalf("localbox did not start: %v", err)
		}
	}
}

// TestDestroyNotHeldBySilentBox: a ready environment's box is replaced by an SSH server that
// completes the handshake (same address, same pinned host key) and never answers a channel open.
// `env destroy` still reaches destroyed: the box-side cleanup gives up after box.releaseTimeout,
// says so in the environment's events, and the provider's destroy is called.
func TestDestroyNotHeldBySilentBox(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "box")
	boxCmd, st := startLocalbox(t, dir)
	cfg := fastWorkerConfig + "box: {releaseTimeout: 2s}\nprofiles:\n" + staticProfile("silent", st, st.HostKey)
	g := startGateway(t, filepath.Join(root, "data"), cfg)
	e := g.waitReady(g.createEnv("silent").ID)
	pid := workerPID(t, e)
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })

	// The box turns hostile: its SSH server and worker go, a silent one takes the address.
	cleanupSocketDir(t, e)
	_ = boxCmd.Process.Kill()
	_ = boxCmd.Wait()
	_ = syscall.Kill(pid, syscall.SIGKILL)
	keyPEM, err := os.ReadFile(filepath.Join(dir, ".localbox", "ssh_host_ed25519_key"))
	if err != nil {
		t.Fatal(err)
	}
	hostKey, err := ssh.ParsePrivateKey(keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	silent := tunneltest.Start(t, net.JoinHostPort(st.Host, strconv.Itoa(st.Port)), hostKey, tunneltest.NoChannels)

	d, err := g.destroy(e.ID, false, 25*time.Second)
	if err != nil || d.State != envs.Destroyed {
		t.Fatalf("destroy of an environment whose box never answers: %v, state %q", err, d.State)
	}
	if silent.Opens.Load() == 0 {
		t.Fatalf("the box-side cleanup never reached the silent box: the test proves nothing")
	}
	if g.countNotes(e.ID, "box.releaseTimeout") == 0 {
		var lines []string
		for _, ev := range g.events(e.ID) {
			lines = append(lines, ev.Reason)
		}
		t.Fatalf("no event says the box-side cleanup gave up:\n%s", strings.Join(lines, "\n"))
	}
	// the static provider's proof: the host's claim is released, so a new environment can take it
	list, err := g.client.Environments(g.ctx(), false)
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range list {
		if x.ID == e.ID && x.State != envs.Destroyed {
			t.Fatalf("environment listed as %s after destroy", x.State)
		}
	}
	g.stop()
}

// TestNetnsHangingBoxCommands: real OpenSSH sshd in a network namespace, a git worker session
// active on it; then the box's sshd is reloaded with `ForceCommand sleep 100000`, so every new
// command (sftp too) hangs while handshakes and keepalives still work. Pull-back fails after
// box.reconcileTimeout with a recovery action instead of hanging, and destroy completes.
func TestNetnsHangingBoxCommands(t *testing.T) {
	testenv.RequireCommands(t, "git")
	profiles, state := netnsProfile(t)
	root := t.TempDir()
	if err := os.Chmod(root, 0o755); err != nil {
		t.Fatal(err)
	}
	cfg := fastWorkerConfig + "box: {releaseTimeout: 2s, reconcileTimeout: 4s}\n" + dispatchModels(t, root) + profiles
	g := startGateway(t, filepath.Join(root, "data"), cfg)
	t.Cleanup(func() { destroyAll(g) })
	ws := filepath.Join(root, "user")
	userWorkspace(t, ws, true)
	out, err := exec.Command(openclawBin, "session", "new", "--workspace", ws, "--worker", "netns", "--model", "fresh/m",
		"--gateway", g.addr, "--data-dir", g.dataDir).Output()
	if err != nil {
		t.Fatalf("session new --worker: %v %s", err, out)
	}
	id := strings.TrimSpace(string(out))
	v := g.mustRest(id, placement.Active)
	env, err := g.getEnv(v.Placement.EnvironmentID)
	if err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(leaseNetnsBin, "--state-dir", state, "hang", "--id", env.LeaseID).CombinedOutput(); err != nil {
		t.Fatalf("hang the box: %v %s", err, out)
	}

	g.pullback(id)
	v = g.mustRest(id, placement.Failed)
	if !strings.Contains(v.Placement.Error, "box.reconcileTimeout") || !strings.Contains(v.Placement.Error, "recovery:") ||
		!strings.Contains(v.Placement.Error, "openclaw session pullback "+id) {
		t.Fatalf("pull-back from a hanging box: want a timeout naming box.reconcileTimeout and a recovery action, got %q", v.Placement.Error)
	}

	// the environment still serves the failed session: a plain destroy is refused, a forced one
	// (no box-side cleanup at all) completes on the provider's proof
	if code, err := g.do("DELETE", "/api/v1/environments/"+env.ID, nil, nil); err == nil {
		t.Fatalf("destroy of an attached environment without force: %d, want refused", code)
	}
	if d, err := g.destroy(env.ID, true, 25*time.Second); err != nil || d.State != envs.Destroyed {
		t.Fatalf("forced destroy of a hanging box: %v, state %q", err, d.State)
	}
	if g.countNotes(env.ID, "box-side cleanup skipped (force)") != 1 {
		t.Fatalf("a forced destroy did not skip the box-side cleanup")
	}
	g.stop()
}

func (g *gw) getEnv(id string) (envs.Environment, error) {
	var e envs.Environment
	code, err := g.do("GET", "/api/v1/environments/"+id, nil, &e)
	if err == nil && code != 200 {
		err = errors.New("status " + strconv.Itoa(code))
	}
	return e, err
}

// TestGatewayHTTPSurface: /metrics needs the token on the API listener and is public only on
// metricsListen; a Host header that is not an IP literal, localhost or an allowed name is refused
// with 421 (DNS rebinding); the database files are 0600 and a data dir others could read is
// tightened to 0700 at start.
func TestGatewayHTTPSurface(t *testing.T) {
	root := t.TempDir()
	data := filepath.Join(root, "data")
	if err := os.MkdirAll(data, 0o755); err != nil {
		t.Fatal(err)
	}
	metricsAddr := freeAddr(t)
	g := startGateway(t, data, "allowedHosts: [gateway.internal]\nmetricsListen: "+metricsAddr+"\n")
	get := func(addr, path, host string, token bool) int {
		t.Helper()
		req, _ := http.NewRequest("GET", "http://"+addr+path, nil)
		if host != "" {
			req.Host = host
		}
		if token {
			tok, _ := os.ReadFile(filepath.Join(data, "gateway.token"))
			req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(tok)))
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	_, port, _ := net.SplitHostPort(g.addr)
	for _, c := range []struct {
		name, addr, path, host string
		token                  bool
		want                   int
	}{
		{"metrics without token", g.addr, "/metrics", "", false, 401},
		{"metrics with token", g.addr, "/metrics", "", true, 200},
		{"metrics on metricsListen", metricsAddr, "/metrics", "", false, 200},
		{"API on metricsListen", metricsAddr, "/api/v1/environments", "", true, 401},
		{"rebinding name", g.addr, "/api/v1/environments", "attacker.example:" + port, true, 421},
		{"rebinding name, metrics", g.addr, "/metrics", "attacker.example", true, 421},
		{"rebinding name, healthz", g.addr, "/healthz", "attacker.example", false, 421},
		{"localhost", g.addr, "/api/v1/environments", "localhost:" + port, true, 200},
		{"allowed name", g.addr, "/api/v1/environments", "gateway.internal:" + port, true, 200},
		{"IPv6 literal", g.addr, "/api/v1/environments", "[::1]:" + port, true, 200},
	} {
		if got := get(c.addr, c.path, c.host, c.token); got != c.want {
			t.Errorf("%s: GET %s (Host %q): %d, want %d", c.name, c.path, c.host, got, c.want)
		}
	}
	for _, name := range []string{"", "gateway.db", "gateway.db-wal", "gateway.db-shm", "gateway.token"} {
		fi, err := os.Stat(filepath.Join(data, name))
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		want := os.FileMode(0o600)
		if name == "" {
			want = 0o700
		}
		if fi.Mode().Perm() != want {
			t.Errorf("data dir %q: mode %#o, want %#o", name, fi.Mode().Perm(), want)
		}
	}
	if !strings.Contains(g.log.String(), "access by other users removed") {
		t.Errorf("no log line says the data dir was tightened")
	}
	g.stop()
}

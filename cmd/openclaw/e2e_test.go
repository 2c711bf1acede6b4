package main_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/openclaw/cloudworkers/gateway/api"
	"github.com/openclaw/cloudworkers/gateway/envs"
	"github.com/openclaw/cloudworkers/internal/testrig/testenv"
)

var (
	openclawBin   string
	leaseDirBin   string
	leaseNetnsBin string
	crabboxBin    string
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "openclaw-e2e-bin")
	if err != nil {
		panic(err)
	}
	openclawBin = filepath.Join(dir, "openclaw")
	leaseDirBin = filepath.Join(dir, "lease-dir")
	leaseNetnsBin = filepath.Join(dir, "lease-netns")
	crabboxBin = filepath.Join(dir, "crabbox")
	if err := os.Chmod(dir, 0o755); err != nil {
		panic(err)
	}
	for _, b := range [][2]string{{openclawBin, "."}, {leaseDirBin, "../../examples/lease-dir"}, {leaseNetnsBin, "../../examples/lease-netns"}, {crabboxBin, "../../examples/lease-crabbox"}} {
		out, err := exec.Command("go", "build", "-o", b[0], b[1]).CombinedOutput()
		if err != nil {
			fmt.Fprintf(os.Stderr, "build %s: %v\n%s", b[1], err, out)
			os.Exit(1)
		}
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// gw is a gateway process under test.
type gw struct {
	t       *testing.T
	dataDir string
	config  string
	addr    string
	cmd     *exec.Cmd
	log     *testenv.Buffer
	client  *api.Client
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// leaseDirProfile is a profile that drives examples/lease-dir with the given extra environment.
func leaseDirProfile(id, leaseDir string, env map[string]string) string {
	all := map[string]string{"LEASE_DIR": leaseDir, "LEASE_DIR_LOCALBOX": openclawBin}
	for k, v := range env {
		all[k] = v
	}
	envJSON, _ := json.Marshal(all)
	l := leaseDirBin
	return fmt.Sprintf(`  - id: %s
    provider: command
    hygiene: {metadataRoute: warn, dockerSocket: warn}
    settings:
      provision: [%[2]s, warmup, --lease-id, "{leaseId}", --label, "openclaw.gateway={gatewayId}", --label, "openclaw.environment={envId}"]
      inspect: [%[2]s, inspect, --id, "{leaseId}", --json]
      destroy: [%[2]s, stop, "{leaseId}"]
      renew: [%[2]s, heartbeat, --id, "{leaseId}"]
      list: [%[2]s, list, --json]
      timeout: 3s
      pollInterval: 50ms
      env: %[3]s
`, id, l, envJSON)
}

func startGateway(t *testing.T, dataDir, config string) *gw {
	t.Helper()
	g := &gw{t: t, dataDir: dataDir, config: config}
	g.start()
	return g
}

func (g *gw) start() {
	t := g.t
	t.Helper()
	g.addr = freeAddr(t)
	cfgPath := filepath.Join(g.dataDir, "..", filepath.Base(g.dataDir)+"-config.yaml")
	cfg := g.config
	if !strings.HasPrefix(cfg, "workspaces:") && !strings.Contains(cfg, "\nworkspaces:") {
		// the tests' workspaces live in temp dirs, outside the default root (the home directory)
		cfg = fmt.Sprintf("workspaces: {roots: [%q]}\n", os.TempDir()) + cfg
	}
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	g.log = &testenv.Buffer{}
	g.cmd = exec.Command(openclawBin, "gateway", "--data-dir", g.dataDir, "--listen", g.addr, "--config", cfgPath, "--log-level", "debug", "--dev-local-box")
	g.cmd.Stdout = g.log
	g.cmd.Stderr = g.log
	if err := g.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	cmd := g.cmd
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
		if t.Failed() {
			t.Logf("gateway log:\n%s", g.log.String())
		}
	})
	deadline := time.Now().Add(15 * time.Second)
	for {
		resp, err := http.Get("http://" + g.addr + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("gateway did not become ready: %v\n%s", err, g.log.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	tok, err := os.ReadFile(filepath.Join(g.dataDir, "gateway.token"))
	if err != nil {
		t.Fatal(err)
	}
	g.client = api.NewClient(g.addr, strings.TrimSpace(string(tok)))
}

func (g *gw) kill() {
	g.t.Helper()
	_ = g.cmd.Process.Signal(syscall.SIGKILL)
	_ = g.cmd.Wait()
}

func (g *gw) stop() {
	g.t.Helper()
	_ = g.cmd.Process.Signal(syscall.SIGTERM)
	if err := g.cmd.Wait(); err != nil {
		g.t.Fatalf("gateway did not stop cleanly: %v\n%s", err, g.log.String())
	}
}

// do sends one raw request, for the tests of the HTTP surface itself (status codes, bodies).
func (g *gw) do(method, path string, in, out any) (int, error) {
	return g.client.Do(g.ctx(), method, path, in, out)
}

// ctx bounds one API call of the test.
func (g *gw) ctx() context.Context { return testenv.Context(g.t, 30*time.Second) }

func (g *gw) createEnv(profile string) envs.Environment {
	g.t.Helper()
	return must(g.client.CreateEnvironment(g.ctx(), profile, ""))(g.t)
}

// destroy destroys an environment (forced if force), waiting up to wait for proof of teardown.
func (g *gw) destroy(id string, force bool, wait time.Duration) (envs.Environment, error) {
	return g.client.DestroyEnvironment(g.ctx(), id, api.DestroyOptions{Force: force, Wait: wait})
}

func (g *gw) waitEnv(id string, cond func(envs.Environment) bool) envs.Environment {
	g.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	var e envs.Environment
	for time.Now().Before(deadline) {
		v, err := g.client.Environment(g.ctx(), id)
		if err != nil {
			g.t.Fatal(err)
		}
		if e = v.Environment; cond(e) {
			return e
		}
		time.Sleep(25 * time.Millisecond)
	}
	g.t.Fatalf("environment %s: condition not reached; state %s error %q", id, e.State, e.Error)
	return e
}

// warmupCalls reads lease-dir's calls.log: one line per warmup call.
func warmupCalls(t *testing.T, leaseDir string) []string {
	t.Helper()
	f, err := os.Open(filepath.Join(leaseDir, "calls.log"))
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if strings.Contains(sc.Text(), "warmup") {
			lines = append(lines, sc.Text())
		}
	}
	return lines
}

func liveLeases(t *testing.T, leaseDir string) []map[string]any {
	t.Helper()
	cmd := exec.Command(leaseDirBin, "list", "--json")
	cmd.Env = append(os.Environ(), "LEASE_DIR="+leaseDir)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("lease-dir list: %v", err)
	}
	var list []map[string]any
	if err := json.Unmarshal(out, &list); err != nil {
		t.Fatalf("lease-dir list output %q: %v", out, err)
	}
	live := list[:0]
	for _, l := range list {
		if l["state"] != "released" {
			live = append(live, l)
		}
	}
	return live
}

func TestGatewayKilledMidProvisionAdoptsLease(t *testing.T) {
	root := t.TempDir()
	leaseDir := filepath.Join(root, "leases")
	cfg := "profiles:\n" + leaseDirProfile("slow", leaseDir, map[string]string{"LEASE_DIR_WARMUP_DELAY": "1500ms"})
	g := startGateway(t, filepath.Join(root, "data"), cfg)
	e := g.createEnv("slow")
	deadline := time.Now().Add(10 * time.Second)
	for len(warmupCalls(t, leaseDir)) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("lease CLI never called")
		}
		time.Sleep(10 * time.Millisecond)
	}
	g.kill() // SIGKILL mid-provision
	g.start()
	got := g.waitReady(e.ID)
	calls := warmupCalls(t, leaseDir)
	if len(calls) < 2 {
		t.Fatalf("warmup calls %v: the restarted gateway did not resume", calls)
	}
	for _, c := range calls {
		if !strings.Contains(c, got.LeaseID) {
			t.Fatalf("warmup call %q does not carry lease id %s (all: %v)", c, got.LeaseID, calls)
		}
	}
	if live := liveLeases(t, leaseDir); len(live) != 1 || live[0]["id"] != got.LeaseID {
		t.Fatalf("live leases %v, want exactly %s", live, got.LeaseID)
	}
	// destroy returns on proof of teardown
	if d, err := g.destroy(e.ID, false, 20*time.Second); err != nil || d.State != envs.Destroyed {
		t.Fatalf("destroy: %v %s", err, d.State)
	}
	if live := liveLeases(t, leaseDir); len(live) != 0 {
		t.Fatalf("leases left after destroy: %v", live)
	}
	g.stop()
}

func TestLeaseCLIFailuresAreReadable(t *testing.T) {
	root := t.TempDir()
	cases := []struct {
		name string
		env  map[string]string
		want string
	}{
		{"garbage", map[string]string{"LEASE_DIR_INSPECT_GARBAGE": "1"}, "JSON"},
		{"nohostkey", map[string]string{"LEASE_DIR_NO_HOSTKEY": "1"}, "unpinned"},
		{"timeout", map[string]string{"LEASE_DIR_WARMUP_DELAY": "10s"}, "timed out"},
		{"exit", map[string]string{"LEASE_DIR_WARMUP_FAIL": "capacity exhausted in fsn1"}, "capacity exhausted in fsn1"},
	}
	cfg := "profiles:\n"
	for _, c := range cases {
		cfg += leaseDirProfile(c.name, filepath.Join(root, c.name), c.env)
	}
	g := startGateway(t, filepath.Join(root, "data"), cfg)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := g.createEnv(c.name)
			e = g.waitEnv(e.ID, func(e envs.Environment) bool { return e.State.Dead() })
			if e.State != envs.Failed {
				t.Fatalf("state %s", e.State)
			}
			if !strings.Contains(strings.ToLower(e.Error), strings.ToLower(c.want)) || len(e.Error) > 600 {
				t.Fatalf("error %q does not say %q (or is unbounded)", e.Error, c.want)
			}
			if e.Lease.SSHHost != "" || len(e.Lease.HostKeys) != 0 {
				t.Fatalf("half-recorded lease: %+v", e.Lease)
			}
		})
	}
	g.stop()
}

func TestAPIAuthAndValidation(t *testing.T) {
	root := t.TempDir()
	g := startGateway(t, filepath.Join(root, "data"), "")
	resp, err := http.Get("http://" + g.addr + "/api/v1/environments")
	if err != nil {
		t.Fatal(err)
	}
	var body struct {
		Error struct{ Code, Message string } `json:"error"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&body)
	resp.Body.Close()
	if resp.StatusCode != 401 || body.Error.Code != "unauthorized" {
		t.Fatalf("no token: %d %+v", resp.StatusCode, body)
	}
	fi, err := os.Stat(filepath.Join(g.dataDir, "gateway.token"))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("token file mode: %v %v", fi.Mode(), err)
	}
	bad := []struct {
		body  string
		field string
	}{
		{`{"id":"Bad ID","provider":"command"}`, "id"},
		{`{"id":"x","provider":"nope"}`, "provider"},
		{`{"id":"x","provider":"command","settings":{"inspect":["a"],"destroy":["b"]}}`, "settings.provision"},
		{`{"id":"x","provider":"command","settings":{"provision":["a","{bogus}"],"inspect":["a"],"destroy":["b"]}}`, "settings.provision[1]"},
		{`{"id":"x","provider":"local","lifetime":{"ttl":"soon"}}`, "ttl"},
		{`{"id":"x","provider":"local","maxEnvironments":-1}`, "maxEnvironments"},
		{`{"id":"x","provider":"local","colour":"red"}`, "colour"},
		{`{"id":"x","provider":"static","settings":{"hosts":[{"host":"h","user":"u","keyPath":"/k","hostKey":"garbage"}]}}`, "settings.hosts[0].hostKey"},
	}
	for _, b := range bad {
		if code, e := g.postRaw("/api/v1/profiles", b.body); code != 400 || !strings.Contains(e.Field+" "+e.Message, b.field) {
			t.Errorf("%s: got %d %+v, want 400 naming %s", b.body, code, e, b.field)
		}
	}
	// a second gateway on the same data dir refuses to start
	out, err := exec.Command(openclawBin, "gateway", "--data-dir", g.dataDir, "--listen", freeAddr(t)).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "in use by another gateway") {
		t.Fatalf("second gateway: %v %s", err, out)
	}
	g.stop()
}

func TestSweepDestroysUnknownLabelledLease(t *testing.T) {
	root := t.TempDir()
	leaseDir := filepath.Join(root, "leases")
	g := startGateway(t, filepath.Join(root, "data"), "profiles:\n"+leaseDirProfile("ld", leaseDir, nil))
	info, err := g.client.Gateway(g.ctx())
	if err != nil {
		t.Fatal(err)
	}
	e := g.createEnv("ld")
	e = g.waitReady(e.ID)
	warm := func(id string, labels ...string) {
		args := []string{"warmup", "--lease-id", id}
		for _, l := range labels {
			args = append(args, "--label", l)
		}
		cmd := exec.Command(leaseDirBin, args...)
		cmd.Env = append(os.Environ(), "LEASE_DIR="+leaseDir, "LEASE_DIR_LOCALBOX="+openclawBin)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("warmup %s: %v %s", id, err, out)
		}
	}
	warm("ocl_orphan", "openclaw.gateway="+info.ID, "openclaw.environment=env_unknown")
	warm("ocl_other", "openclaw.gateway=gw_someoneelse")
	cmd := exec.Command(openclawBin, "env", "sweep", "-o", "json", "--gateway", g.addr, "--data-dir", g.dataDir)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("env sweep: %v %s", err, out)
	}
	var rep envs.SweepReport
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd := exec.Command(leaseDirBin, "stop", "ocl_other")
		cmd.Env = append(os.Environ(), "LEASE_DIR="+leaseDir)
		_ = cmd.Run()
	})
	if len(rep.Destroyed) != 1 || rep.Destroyed[0].LeaseID != "ocl_orphan" {
		t.Fatalf("sweep report %s", out)
	}
	ids := map[string]bool{}
	for _, l := range liveLeases(t, leaseDir) {
		ids[l["id"].(string)] = true
	}
	if !ids[e.LeaseID] || !ids["ocl_other"] || ids["ocl_orphan"] || len(ids) != 2 {
		t.Fatalf("live leases after sweep: %v", ids)
	}
	if _, err := g.destroy(e.ID, false, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	g.stop()
}

// TestNetnsLeaseThroughCommandProvider drives the profile example: the command provider
// against examples/lease-netns (real OpenSSH sshd in a network namespace).
func TestNetnsLeaseThroughCommandProvider(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireCommands(t, "ip", "sshd", "useradd")
	state := testenv.PublicDir(t, "ocw-e2e-netns-")
	l := leaseNetnsBin
	cfg := fmt.Sprintf(`profiles:
  - id: netns
    provider: command
    settings:
      provision: [%[1]s, --state-dir, %[2]s, warmup, --lease-id, "{leaseId}", --label, "openclaw.gateway={gatewayId}", --label, "openclaw.environment={envId}"]
      inspect: [%[1]s, --state-dir, %[2]s, inspect, --id, "{leaseId}", --json]
      destroy: [%[1]s, --state-dir, %[2]s, stop, "{leaseId}"]
      renew: [%[1]s, --state-dir, %[2]s, heartbeat, --id, "{leaseId}"]
      list: [%[1]s, --state-dir, %[2]s, list, --json]
      timeout: 1m
      pollInterval: 100ms
    lifetime: {idleTimeout: 30m, ttl: 24h}
    maxEnvironments: 4
`, l, state)
	g := startGateway(t, filepath.Join(t.TempDir(), "data"), cfg)
	e := g.createEnv("netns")
	t.Cleanup(func() {
		// never leave a namespace behind, even when the test fails
		_ = exec.Command(l, "--state-dir", state, "stop", e.LeaseID).Run()
	})
	e = g.waitEnv(e.ID, func(e envs.Environment) bool { return e.State == envs.Bootstrapping || e.State.Dead() })
	if e.State != envs.Bootstrapping {
		t.Fatalf("state %s: %s", e.State, e.Error)
	}
	if !strings.HasPrefix(e.Lease.SSHHost, "198.18.") && !strings.HasPrefix(e.Lease.SSHHost, "198.19.") {
		t.Fatalf("box address %s outside 198.18.0.0/15", e.Lease.SSHHost)
	}
	if len(e.Lease.HostKeys) != 1 || !strings.HasPrefix(e.Lease.HostKeys[0], "ssh-ed25519 ") {
		t.Fatalf("pinned host keys %v", e.Lease.HostKeys)
	}
	if d, err := g.destroy(e.ID, false, 60*time.Second); err != nil || d.State != envs.Destroyed {
		t.Fatalf("destroy: %v %s %s", err, d.State, d.Error)
	}
	out, _ := exec.Command("ip", "netns", "list").Output()
	var st struct{ Netns string }
	if b, err := exec.Command(l, "--state-dir", state, "inspect", "--id", e.LeaseID, "--json").Output(); err == nil {
		_ = json.Unmarshal(b, &st)
	}
	if st.Netns != "" && strings.Contains(string(out), st.Netns) {
		t.Fatalf("namespace %s still exists after destroy", st.Netns)
	}
	g.stop()
}

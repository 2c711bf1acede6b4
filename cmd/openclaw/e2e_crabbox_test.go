package main_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/openclaw/cloudworkers/gateway/envs"
	"github.com/openclaw/cloudworkers/internal/boxproc"
)

// The Crabbox preset driven through examples/lease-crabbox, the imitation of the real Crabbox CLI:
// coordinator-style leases (--lease-id honoured, sshHostKey given) and direct static leases
// (--lease-id refused, no host key, static_<host> ids, stop that only drops the claim).

// crabboxRig is one imitated Crabbox installation: its state, call log and environment.
type crabboxRig struct {
	t     *testing.T
	state string
	log   string
	env   map[string]string
}

func newCrabboxRig(t *testing.T, root string) *crabboxRig {
	t.Helper()
	r := &crabboxRig{t: t, state: filepath.Join(root, "crabbox-state"), log: filepath.Join(root, "crabbox.log")}
	r.env = map[string]string{"LEASE_CRABBOX_STATE": r.state, "LEASE_CRABBOX_LOCALBOX": openclawBin, "LEASE_CRABBOX_LOG": r.log}
	t.Cleanup(r.stopAll)
	return r
}

// run calls the imitation directly (as an operator would call crabbox), with extra environment.
func (r *crabboxRig) run(extra map[string]string, args ...string) ([]byte, error) {
	cmd := exec.Command(crabboxBin, args...)
	cmd.Env = os.Environ()
	for k, v := range r.env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	for k, v := range extra {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.Env = append(cmd.Env, "LEASE_CRABBOX_LOG=") // the log is of the gateway's calls only
	cmd.Dir = r.t.TempDir()
	return cmd.Output()
}

// coordinatorLeases lists the live coordinator leases of provider, as `list --json` prints them.
func (r *crabboxRig) coordinatorLeases(provider string) []map[string]any {
	r.t.Helper()
	out, err := r.run(nil, "list", "--provider", provider, "--json")
	if err != nil {
		r.t.Fatalf("crabbox list: %v", err)
	}
	var list []map[string]any
	if err := json.Unmarshal(out, &list); err != nil {
		r.t.Fatalf("crabbox list %q: %v", out, err)
	}
	return list
}

// claims returns the local claims of the imitation (one per claimed static lease).
func (r *crabboxRig) claims() []map[string]any {
	r.t.Helper()
	entries, _ := os.ReadDir(filepath.Join(r.state, "claims"))
	var out []map[string]any
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".json") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(r.state, "claims", e.Name()))
		if err != nil {
			r.t.Fatal(err)
		}
		var c map[string]any
		if err := json.Unmarshal(b, &c); err != nil {
			r.t.Fatal(err)
		}
		out = append(out, c)
	}
	return out
}

// calls reads the call log: argv and working directory of every crabbox invocation.
func (r *crabboxRig) calls() []struct {
	Argv []string `json:"argv"`
	Cwd  string   `json:"cwd"`
} {
	r.t.Helper()
	var out []struct {
		Argv []string `json:"argv"`
		Cwd  string   `json:"cwd"`
	}
	f, err := os.Open(r.log)
	if os.IsNotExist(err) {
		return out
	}
	if err != nil {
		r.t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var c struct {
			Argv []string `json:"argv"`
			Cwd  string   `json:"cwd"`
		}
		if err := json.Unmarshal(sc.Bytes(), &c); err != nil {
			r.t.Fatal(err)
		}
		out = append(out, c)
	}
	return out
}

// stopAll stops every coordinator box the imitation started, whatever the test did.
func (r *crabboxRig) stopAll() {
	entries, _ := os.ReadDir(filepath.Join(r.state, "coordinator"))
	for _, e := range entries {
		b, _ := os.ReadFile(filepath.Join(r.state, "coordinator", e.Name()))
		var s struct {
			BoxPID int    `json:"boxPid"`
			BoxDir string `json:"boxDir"`
		}
		if json.Unmarshal(b, &s) == nil {
			boxproc.Stop(s.BoxPID, s.BoxDir) // only while the pid is still that box's
		}
	}
}

// profile is a Crabbox preset profile on the imitation; extra is YAML settings lines.
func (r *crabboxRig) profile(id, provider string, env map[string]string, extra ...string) string {
	all := map[string]string{}
	for k, v := range r.env {
		all[k] = v
	}
	for k, v := range env {
		all[k] = v
	}
	envJSON, _ := json.Marshal(all)
	s := fmt.Sprintf(`  - id: %s
    provider: crabbox
    hygiene: {metadataRoute: warn, dockerSocket: warn}
    settings:
      binary: %s
      provider: %s
      timeout: 20s
      pollInterval: 50ms
      env: %s
`, id, crabboxBin, provider, envJSON)
	for _, e := range extra {
		s += "      " + e + "\n"
	}
	return s
}

// staticBox starts an `openclaw localbox` to stand for a static SSH host and returns the
// Crabbox environment that points the ssh provider at it, and its host key.
func staticBox(t *testing.T) (env map[string]string, hostKey string) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "static-box")
	cmd := exec.Command(openclawBin, "localbox", "--dir", dir, "--lease-id", "static-box")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	var st struct {
		Port          int    `json:"port"`
		User          string `json:"user"`
		HostKey       string `json:"hostKey"`
		ClientKeyPath string `json:"clientKeyPath"`
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		b, err := os.ReadFile(filepath.Join(dir, ".localbox", "state.json"))
		if err == nil && json.Unmarshal(b, &st) == nil && st.Port > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("localbox did not start")
		}
		time.Sleep(20 * time.Millisecond)
	}
	return map[string]string{
		"CRABBOX_STATIC_HOST": "127.0.0.1", "CRABBOX_STATIC_PORT": strconv.Itoa(st.Port),
		"CRABBOX_STATIC_USER": st.User, "CRABBOX_SSH_KEY": st.ClientKeyPath,
	}, st.HostKey
}

func crabboxStaticProfile(r *crabboxRig, id string, env map[string]string, hostKey string) string {
	extra := []string{"idempotentLeaseId: false"}
	if hostKey != "" {
		extra = append(extra, fmt.Sprintf("hostKeys: [%q]", hostKey))
	}
	return r.profile(id, "ssh", env, extra...)
}

func (g *gw) destroyEnv(id string) envs.Environment {
	g.t.Helper()
	d, err := g.destroy(id, false, 25*time.Second)
	if err != nil || d.State != envs.Destroyed {
		g.t.Fatalf("destroy %s: %v, state %s, error %q", id, err, d.State, d.Error)
	}
	return d
}

// assertCwd checks that every crabbox call ran in <data-dir>/providers/<profile>.
func assertCwd(t *testing.T, r *crabboxRig, dataDir, profile string) {
	t.Helper()
	want := filepath.Join(dataDir, "providers", profile)
	n := 0
	for _, c := range r.calls() {
		if c.Cwd == filepath.Dir(want) && len(c.Argv) > 0 && c.Argv[0] == "--version" {
			continue // the version check at profile creation runs in <data-dir>/providers
		}
		if c.Cwd != want {
			t.Fatalf("crabbox %q ran in %s, want %s", c.Argv, c.Cwd, want)
		}
		n++
	}
	if n == 0 {
		t.Fatal("no crabbox call recorded")
	}
}

func TestCrabboxCoordinatorLeaseReadyAndDestroyed(t *testing.T) {
	root := t.TempDir()
	r := newCrabboxRig(t, root)
	data := filepath.Join(root, "data")
	g := startGateway(t, data, "profiles:\n"+r.profile("cbx", "hetzner", nil))
	e := g.waitReady(g.createEnv("cbx").ID)
	if !strings.HasPrefix(e.LeaseID, "cbx_") || len(e.Lease.HostKeys) != 1 || e.Lease.SSHPort == 0 {
		t.Fatalf("lease %s %+v", e.LeaseID, e.Lease)
	}
	var warm []string
	for _, c := range r.calls() {
		if len(c.Argv) > 0 && c.Argv[0] == "warmup" {
			warm = c.Argv
			for _, a := range c.Argv {
				if a == "--label" {
					t.Fatalf("warmup passes --label, which Crabbox does not have: %q", c.Argv)
				}
			}
		}
	}
	if i := slices.Index(warm, "--lease-id"); i < 0 || warm[i+1] != e.LeaseID {
		t.Fatalf("warmup %q does not carry lease id %s", warm, e.LeaseID)
	}
	if got := r.coordinatorLeases("hetzner"); len(got) != 1 || got[0]["id"] != e.LeaseID {
		t.Fatalf("live leases %v", got)
	}
	g.destroyEnv(e.ID)
	if got := r.coordinatorLeases("hetzner"); len(got) != 0 {
		t.Fatalf("leases left after destroy: %v", got)
	}
	assertCwd(t, r, data, "cbx")
	g.stop()
}

func TestCrabboxStaticLeaseReadyAndDestroyed(t *testing.T) {
	root := t.TempDir()
	r := newCrabboxRig(t, root)
	boxEnv, hostKey := staticBox(t)
	data := filepath.Join(root, "data")
	g := startGateway(t, data, "profiles:\n"+crabboxStaticProfile(r, "box", boxEnv, hostKey))
	e := g.waitReady(g.createEnv("box").ID)
	if e.LeaseID != "static_127-0-0-1" || len(e.Lease.HostKeys) != 1 || e.Lease.HostKeys[0] != hostKey {
		t.Fatalf("lease %s %+v", e.LeaseID, e.Lease)
	}
	cl := r.claims()
	if len(cl) != 1 || !strings.HasPrefix(cl[0]["slug"].(string), "ocl-") {
		t.Fatalf("claims %v", cl)
	}
	for _, c := range r.calls() {
		if len(c.Argv) > 0 && c.Argv[0] == "warmup" && slices.Contains(c.Argv, "--lease-id") {
			t.Fatalf("warmup %q passes --lease-id, which Crabbox's ssh provider refuses", c.Argv)
		}
	}
	g.destroyEnv(e.ID)
	if cl := r.claims(); len(cl) != 0 {
		t.Fatalf("claim left after destroy: %v", cl)
	}
	assertCwd(t, r, data, "box")
	g.stop()
}

func TestCrabboxGatewayKilledMidProvision(t *testing.T) {
	for _, mode := range []string{"coordinator", "static"} {
		t.Run(mode, func(t *testing.T) {
			root := t.TempDir()
			r := newCrabboxRig(t, root)
			holdFile := filepath.Join(root, "hold")
			env := map[string]string{"LEASE_CRABBOX_HOLD": holdFile}
			var prof string
			if mode == "static" {
				boxEnv, hostKey := staticBox(t)
				for k, v := range boxEnv {
					env[k] = v
				}
				prof = crabboxStaticProfile(r, "p", env, hostKey)
			} else {
				prof = r.profile("p", "hetzner", env)
			}
			g := startGateway(t, filepath.Join(root, "data"), "profiles:\n"+prof)
			e := g.createEnv("p")
			// The lease exists, its "leased" line is not printed: the worst moment to die.
			deadline := time.Now().Add(20 * time.Second)
			var pid int
			for {
				b, err := os.ReadFile(holdFile)
				if err == nil {
					pid, _ = strconv.Atoi(string(b))
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("crabbox warmup never reached the hold point")
				}
				time.Sleep(10 * time.Millisecond)
			}
			g.kill()
			_ = syscall.Kill(pid, syscall.SIGKILL) // the orphaned warmup dies with the machine it ran on
			g.start()
			got := g.waitReady(e.ID)
			if mode == "static" {
				cl := r.claims()
				if len(cl) != 1 || got.LeaseID != "static_127-0-0-1" {
					t.Fatalf("lease %s, claims %v: want exactly one", got.LeaseID, cl)
				}
				warmups := 0
				for _, c := range r.calls() {
					if len(c.Argv) > 0 && c.Argv[0] == "warmup" {
						warmups++
					}
				}
				if warmups != 1 {
					t.Fatalf("%d warmups: the restarted gateway leased again instead of adopting by slug", warmups)
				}
			} else if live := r.coordinatorLeases("hetzner"); len(live) != 1 || live[0]["id"] != got.LeaseID {
				t.Fatalf("live leases %v, want exactly %s", live, got.LeaseID)
			}
			g.destroyEnv(e.ID)
			if len(r.claims()) != 0 || len(r.coordinatorLeases("hetzner")) != 0 {
				t.Fatalf("leases left after destroy: claims %v, coordinator %v", r.claims(), r.coordinatorLeases("hetzner"))
			}
			g.stop()
		})
	}
}

func TestCrabboxSweepDestroysOnlyRecordedLeases(t *testing.T) {
	root := t.TempDir()
	r := newCrabboxRig(t, root)
	stopFails := filepath.Join(root, "stop-fails")
	cfg := "profiles:\n" + r.profile("cbx", "hetzner", nil) +
		r.profile("dtn", "daytona", map[string]string{"LEASE_CRABBOX_STOP_FAILS": stopFails})
	g := startGateway(t, filepath.Join(root, "data"), cfg)
	ours := g.waitReady(g.createEnv("cbx").ID)

	// Someone else's leases on the same Crabbox account: never ours to destroy.
	if out, err := r.run(nil, "warmup", "--provider", "hetzner"); err != nil {
		t.Fatalf("foreign warmup: %v %s", err, out)
	}
	if out, err := r.run(nil, "warmup", "--provider", "daytona", "--lease-id", "cbx_00000000f00d"); err != nil {
		t.Fatalf("foreign warmup: %v %s", err, out)
	}
	// A daytona lease gives no host key: the environment fails naming settings.hostKeys, and its
	// release fails too, leaving a paid lease of ours behind a failed environment.
	if err := os.WriteFile(stopFails, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	failed := g.waitEnv(g.createEnv("dtn").ID, func(e envs.Environment) bool { return e.State.Dead() })
	if failed.State != envs.Failed || !strings.Contains(failed.Error, "settings.hostKeys") {
		t.Fatalf("daytona environment %s: %q, want failed naming settings.hostKeys", failed.State, failed.Error)
	}
	if err := os.Remove(stopFails); err != nil {
		t.Fatal(err)
	}
	foreign := map[string]bool{}
	for _, l := range append(r.coordinatorLeases("hetzner"), r.coordinatorLeases("daytona")...) {
		if id := l["id"].(string); id != ours.LeaseID && id != failed.LeaseID {
			foreign[id] = true
		}
	}
	if len(foreign) != 2 {
		t.Fatalf("foreign leases %v", foreign)
	}

	out, err := exec.Command(openclawBin, "env", "sweep", "-o", "json", "--gateway", g.addr, "--data-dir", g.dataDir).Output()
	if err != nil {
		t.Fatalf("env sweep: %v %s", err, out)
	}
	var rep envs.SweepReport
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.Destroyed) != 1 || rep.Destroyed[0].LeaseID != failed.LeaseID || rep.Destroyed[0].EnvironmentID != failed.ID {
		t.Fatalf("sweep report %s, want exactly lease %s of %s destroyed", out, failed.LeaseID, failed.ID)
	}
	live := map[string]bool{}
	for _, l := range append(r.coordinatorLeases("hetzner"), r.coordinatorLeases("daytona")...) {
		live[l["id"].(string)] = true
	}
	for id := range foreign {
		if !live[id] {
			t.Fatalf("the sweep destroyed %s, a lease we did not create", id)
		}
	}
	if !live[ours.LeaseID] || live[failed.LeaseID] || len(live) != 3 {
		t.Fatalf("live leases after sweep %v", live)
	}
	g.destroyEnv(ours.ID)
	g.stop()
}

func TestCrabboxStaticLeaseWithoutHostKeysFails(t *testing.T) {
	root := t.TempDir()
	r := newCrabboxRig(t, root)
	boxEnv, _ := staticBox(t)
	g := startGateway(t, filepath.Join(root, "data"), "profiles:\n"+crabboxStaticProfile(r, "nokey", boxEnv, ""))
	e := g.waitEnv(g.createEnv("nokey").ID, func(e envs.Environment) bool { return e.State.Dead() })
	if e.State != envs.Failed || !strings.Contains(e.Error, "settings.hostKeys") || len(e.Lease.HostKeys) != 0 {
		t.Fatalf("state %s error %q hostKeys %v: want failed naming settings.hostKeys", e.State, e.Error, e.Lease.HostKeys)
	}
	if cl := r.claims(); len(cl) != 0 {
		t.Fatalf("the failed environment's claim was not released: %v", cl)
	}
	g.stop()
}

func TestCrabboxVersionIsChecked(t *testing.T) {
	root := t.TempDir()
	r := newCrabboxRig(t, root)
	g := startGateway(t, filepath.Join(root, "data"), "")
	for _, c := range []struct {
		name, binary, version, want string
	}{
		{"old", crabboxBin, "0.41.0", "older than 0.41.1"},
		{"prerelease", crabboxBin, "0.41.1-rc.2", "older than 0.41.1"},
		{"missing", filepath.Join(root, "no-such-crabbox"), "", "not found"},
		{"garbage", crabboxBin, "crabbox, probably", "not a version"},
	} {
		t.Run(c.name, func(t *testing.T) {
			env := map[string]string{"LEASE_CRABBOX_VERSION": c.version}
			for k, v := range r.env {
				env[k] = v
			}
			body, _ := json.Marshal(map[string]any{"id": "cbx-" + c.name, "provider": "crabbox",
				"settings": map[string]any{"binary": c.binary, "provider": "hetzner", "env": env}})
			if code, e := g.postRaw("/api/v1/profiles", string(body)); code != 400 || e.Field != "settings.binary" || !strings.Contains(e.Message, c.want) {
				t.Fatalf("got %d %+v, want 400 on settings.binary saying %q", code, e, c.want)
			}
		})
	}
	// 0.41.1 itself, and a source build ("dev"), are accepted.
	for _, v := range []string{"0.41.1", "dev"} {
		env := map[string]string{"LEASE_CRABBOX_VERSION": v}
		body, _ := json.Marshal(map[string]any{"id": "cbx-ok-" + strings.ReplaceAll(v, ".", "-"), "provider": "crabbox",
			"settings": map[string]any{"binary": crabboxBin, "env": env}})
		if _, err := g.do("POST", "/api/v1/profiles", json.RawMessage(body), nil); err != nil {
			t.Fatalf("crabbox %s refused: %v", v, err)
		}
	}
	g.stop()
}

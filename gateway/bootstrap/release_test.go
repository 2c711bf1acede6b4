package bootstrap

import (
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/openclaw/cloudworkers/gateway/envs"
	"github.com/openclaw/cloudworkers/gateway/hub"
	"github.com/openclaw/cloudworkers/gateway/store/storetest"
	"github.com/openclaw/cloudworkers/gateway/tunnel"
	"github.com/openclaw/cloudworkers/internal/testrig/testenv"
	"github.com/openclaw/cloudworkers/providers/local"
	"github.com/openclaw/cloudworkers/providers/local/localtest"
)

// releaseRig is a bootstrapper with a real tunnel hub and worker hub (no worker is admitted) and
// a local box.
type releaseRig struct {
	boot    *Bootstrapper
	tunnels *tunnel.Mux
	box     localtest.Box
}

// newReleaseRig starts a local box whose HOME is home below a fresh directory ("" for the
// default short one).
func newReleaseRig(t *testing.T, home string) releaseRig {
	t.Helper()
	var cfg local.BoxConfig
	if home != "" {
		cfg.Dir = filepath.Join(testenv.PublicDir(t, "lb"), home)
	}
	box := localtest.StartConfig(t, cfg)
	workers, err := hub.New(hub.Config{DB: storetest.Open(t), ExpectedBundle: func(string) (string, bool) { return "", false }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = workers.Close(testenv.Context(t, 10*time.Second)) })
	tunnels := tunnel.NewMux(tunnel.Config{BackoffMin: 10 * time.Millisecond, BackoffMax: 100 * time.Millisecond, DialTimeout: 15 * time.Second})
	t.Cleanup(func() { _ = tunnels.Close(testenv.Context(t, 10*time.Second)) })
	boot := New(Config{Tunnels: tunnels, Workers: workers, Credentials: workers.Credentials(), CommandTimeout: 10 * time.Second})
	return releaseRig{boot: boot, tunnels: tunnels, box: box}
}

// boxEnv is environment id on the rig's box with the worker home and socket bootstrap records;
// its socket directory under /tmp, if any, is removed at the end of the test.
func (r releaseRig) boxEnv(t *testing.T, id string) envs.Environment {
	t.Helper()
	e := envs.Environment{ID: id, Lease: envs.LeaseInfo{SSHHost: r.box.Host, SSHPort: r.box.Port, SSHUser: r.box.User,
		SSHKeyPath: r.box.ClientKeyPath, HostKeys: []string{r.box.HostKey}}, WorkerHome: r.box.Dir}
	e.WorkerSocket = socketPath(e.WorkerHome, e.ID)
	if dir := tmpSocketDir(e.WorkerHome, e.ID); dir != "" {
		t.Cleanup(func() { os.RemoveAll(dir) })
	}
	return e
}

// env is boxEnv with its tunnel open (which creates the socket's directory) and a stand-in
// worker process under its pidfile; the channel is closed when that process has exited.
func (r releaseRig) env(t *testing.T, id string) (envs.Environment, <-chan struct{}) {
	t.Helper()
	e := r.boxEnv(t, id)
	if err := r.tunnels.Open(testenv.Context(t, 30*time.Second), Target(e)); err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(e.WorkerHome, StateDir(e.ID))
	return e, startPIDFile(t, e, standInWorker(t, "/box/openclaw", "worker", "--descriptor", state+"/launch.json", "--log-file", state+"/worker.log"))
}

// standInWorker is a process with the arguments args (args[0] its name) that ends, with its
// sleep, on SIGTERM: sh running a script named args[1] from a directory of its own.
func standInWorker(t *testing.T, args ...string) *exec.Cmd {
	t.Helper()
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Skip("no sh")
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, args[1]), []byte("trap 'kill $!; exit 0' TERM; sleep 300 & wait\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return &exec.Cmd{Path: sh, Args: args, Dir: dir}
}

// startPIDFile starts cmd and writes its pid to e's worker pidfile; the channel is closed when cmd
// has exited. cmd is killed with its process group at the end of the test.
func startPIDFile(t *testing.T, e envs.Environment, cmd *exec.Cmd) <-chan struct{} {
	t.Helper()
	exited := testenv.StartGroup(t, cmd)
	pidf := WorkerPIDPath(e.WorkerHome, e.ID)
	if err := os.MkdirAll(filepath.Dir(pidf), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(pidf, []byte(strconv.Itoa(cmd.Process.Pid)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return exited
}

// A worker that ended leaves its pid in the pidfile, and on a busy box that pid soon names
// another process. Release does not kill that process, and bootstrap does not take it for a
// running worker (which would skip the launch and wait for an admission that never comes).
func TestAPidfileOfAnotherProcessIsNotTheWorker(t *testing.T) {
	r := newReleaseRig(t, "")
	ctx := testenv.Context(t, 30*time.Second)
	for i, other := range []func(state string) *exec.Cmd{
		func(string) *exec.Cmd { return exec.Command("sleep", "300") },
		// a process that only mentions the worker's arguments in one of its own
		func(state string) *exec.Cmd {
			return exec.Command("sh", "-c", "sleep 300; true # /box/openclaw worker --descriptor "+state+"/launch.json --log-file x", "worker")
		},
	} {
		e := r.boxEnv(t, "env_reused"+strconv.Itoa(i))
		cmd := other(filepath.Join(e.WorkerHome, StateDir(e.ID)))
		exited := startPIDFile(t, e, cmd)
		c, err := r.boot.Dial(ctx, e)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if pid, alive := workerAlive(ctx, c, e.WorkerHome, e.ID); alive {
			t.Fatalf("pid %d of %q taken for the worker", pid, cmd.Args)
		}
		if err := r.boot.Release(ctx, e, true); err != nil {
			t.Fatalf("release: %v", err)
		}
		select {
		case <-exited:
			t.Fatalf("release killed %q, which now has the worker's old pid", cmd.Args)
		case <-time.After(200 * time.Millisecond):
		}
	}
	c, err := r.boot.Dial(ctx, r.boxEnv(t, "env_dial"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// the stand-in with the worker's command line is the worker
	e2, _ := r.env(t, "env_running")
	if _, alive := workerAlive(ctx, c, e2.WorkerHome, e2.ID); !alive {
		t.Fatal("the running worker of the pidfile not found")
	}
}

// release releases e with its box-side part and checks what every release does: the worker
// killed, the tunnel closed.
func (r releaseRig) release(t *testing.T, e envs.Environment, exited <-chan struct{}) {
	t.Helper()
	ctx := testenv.Context(t, 30*time.Second)
	if err := r.boot.Release(ctx, e, true); err != nil {
		t.Fatalf("release: %v", err)
	}
	select {
	case <-exited:
	case <-ctx.Done():
		t.Fatal("the worker of the pidfile was not killed by release")
	}
	if st := r.tunnels.Status(e.ID); st != tunnel.StatusStopped {
		t.Errorf("tunnel %s after release, want stopped", st)
	}
}

// A box whose HOME is too deep for a unix socket path in the state dir gets the worker's socket
// in a private directory under /tmp (mode 0700); release removes that directory, so a box that
// serves many environments does not gather one per environment.
func TestReleaseRemovesTheSocketDirectoryUnderTmp(t *testing.T) {
	r := newReleaseRig(t, strings.Repeat("h", 80))
	e, exited := r.env(t, "env_longhome")
	dir := tmpSocketDir(e.WorkerHome, e.ID)
	if dir == "" || filepath.Dir(e.WorkerSocket) != dir {
		t.Fatalf("socket %s under HOME %s (%d bytes): want it under /tmp", e.WorkerSocket, e.WorkerHome, len(e.WorkerHome))
	}
	fi, err := os.Lstat(dir)
	if err != nil || !fi.IsDir() || fi.Mode().Perm() != 0o700 {
		t.Fatalf("socket directory %s: %v, %v; want a directory of mode 0700", dir, fi, err)
	}
	if fi, err := os.Lstat(e.WorkerSocket); err != nil || fi.Mode()&fs.ModeSocket == 0 {
		t.Fatalf("forwarded socket %s: %v, %v", e.WorkerSocket, fi, err)
	}
	r.release(t, e, exited)
	if _, err := os.Lstat(dir); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("socket directory %s after release: %v, want it gone", dir, err)
	}
}

// With a short HOME the socket lies in the state dir, and release leaves the state dir alone.
func TestReleaseWithTheSocketInTheStateDir(t *testing.T) {
	r := newReleaseRig(t, "")
	e, exited := r.env(t, "env_shorthome")
	if dir := tmpSocketDir(e.WorkerHome, e.ID); dir != "" || filepath.Dir(e.WorkerSocket) != filepath.Join(e.WorkerHome, StateDir(e.ID)) {
		t.Fatalf("socket %s (tmp dir %q) under HOME %s: want it in the state dir", e.WorkerSocket, dir, e.WorkerHome)
	}
	r.release(t, e, exited)
	if _, err := os.Stat(WorkerPIDPath(e.WorkerHome, e.ID)); err != nil {
		t.Fatalf("the state dir's pidfile after release: %v, want it kept", err)
	}
}

// What stands at the socket directory's path on a hostile box is left alone unless it is a
// directory of the box user: a symlink (to the box user's own directory, or anywhere) is not
// followed, and a directory of another user is not emptied.
func TestReleaseLeavesAForeignSocketDirectoryAlone(t *testing.T) {
	r := newReleaseRig(t, strings.Repeat("h", 80))
	victim := t.TempDir()
	victimSock := filepath.Join(victim, "gateway.sock")
	for _, tc := range []struct {
		name  string
		plant func(t *testing.T, dir string)
		kept  string // a path that must survive the release
	}{
		{"symlink", func(t *testing.T, dir string) {
			if err := os.WriteFile(victimSock, []byte("x"), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(victim, dir); err != nil {
				t.Fatal(err)
			}
		}, victimSock},
		{"another user's directory", func(t *testing.T, dir string) {
			if os.Geteuid() != 0 {
				testenv.Integration(t, "needs root to make a directory of another user")
			}
			if err := os.Mkdir(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, "gateway.sock"), []byte("x"), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Chown(dir, 65534, 65534); err != nil {
				t.Fatal(err)
			}
		}, "gateway.sock"},
		{"a file", func(t *testing.T, dir string) {
			if err := os.WriteFile(dir, []byte("x"), 0o600); err != nil {
				t.Fatal(err)
			}
		}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := "env_" + strings.ReplaceAll(tc.name, " ", "_")
			e := r.boxEnv(t, id)
			dir := tmpSocketDir(e.WorkerHome, e.ID)
			tc.plant(t, dir)
			if err := r.boot.Release(testenv.Context(t, 30*time.Second), e, true); err != nil {
				t.Fatalf("release: %v", err)
			}
			if _, err := os.Lstat(dir); err != nil {
				t.Fatalf("%s at %s after release: %v, want it left alone", tc.name, dir, err)
			}
			kept := tc.kept
			if kept != "" && !filepath.IsAbs(kept) {
				kept = filepath.Join(dir, kept)
			}
			if _, err := os.Lstat(kept); kept != "" && err != nil {
				t.Fatalf("%s after release: %v, want it left alone", kept, err)
			}
		})
	}
}

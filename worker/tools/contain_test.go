//go:build linux

package tools

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/openclaw/cloudworkers/internal/testrig/testenv"
)

// TestDetachedProcessesAreStopped: a command that leaves its process group (setsid, a double
// fork) does not outlive the tool set: closing it kills those processes too and counts them,
// through the set's cgroup where the worker may make one and through the environment marker
// otherwise.
func TestDetachedProcessesAreStopped(t *testing.T) {
	testenv.RequireCommands(t, "setsid", "nohup", "sleep")
	for _, mode := range []string{"cgroup v2", "environment marker"} {
		t.Run(mode, func(t *testing.T) {
			s, ws := newTestSet(t, nil)
			if mode == "environment marker" {
				s.procs.contain.cgTried = true // as on a box that allows no cgroup
			} else if dir, fd := makeCgroup("openclaw-tools-probe"); fd < 0 {
				t.Skip("this machine lets the test make no cgroup v2")
			} else {
				s.procs.contain.cgFD, s.procs.contain.cgDir = -1, ""
				_ = os.Remove(dir)
			}
			r := runTool(t, s, "exec", map[string]any{"command": `setsid nohup sh -c 'echo $$ > a.pid; exec sleep 1000' </dev/null >/dev/null 2>&1 &
( sh -c 'echo $$ > b.pid; exec sleep 1001' </dev/null >/dev/null 2>&1 & )
( setsid sh -c 'sh -c "echo \$\$ > c.pid; exec sleep 1002" &' </dev/null >/dev/null 2>&1 & )
sleep 0.2; echo started`})
			mustOK(t, r)
			var pids []int
			for _, f := range []string{"a.pid", "b.pid", "c.pid"} {
				var pid int
				eventually(t, 5*time.Second, f, func() bool {
					b, _ := os.ReadFile(filepath.Join(ws, f))
					pid, _ = strconv.Atoi(strings.TrimSpace(string(b)))
					return pid > 0
				})
				if !testenv.Alive(pid) {
					t.Fatalf("%s: process %d is not running before the stop", f, pid)
				}
				pids = append(pids, pid)
			}
			t.Cleanup(func() {
				for _, p := range pids {
					_ = killProcess(p)
				}
			})
			st, err := s.Stop(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			for i, p := range pids {
				if testenv.Alive(p) {
					t.Fatalf("detached process %d (%d of 3) outlived the tool set (stopped %+v)", p, i+1, st)
				}
			}
			if st.Processes < 3 || st.By != mode {
				t.Fatalf("stopped %+v, want at least the 3 detached processes, found by %s", st, mode)
			}
			if again, _ := s.Stop(context.Background()); again != st {
				t.Fatalf("a second stop says %+v, the first %+v", again, st)
			}
		})
	}
}

// TestTheMarkerIsTheSets: a command cannot choose the scope its processes are found by: the
// marker it sets in its own environment is replaced by its set's.
func TestTheMarkerIsTheSets(t *testing.T) {
	s, _ := newTestSet(t, nil)
	r := runTool(t, s, "exec", map[string]any{"command": "echo $" + ScopeEnv, "env": map[string]string{ScopeEnv: "someone-else"}})
	if got := strings.TrimSpace(mustOK(t, r)); got != s.procs.contain.scope {
		t.Fatalf("the command saw %s=%q, want its set's scope", ScopeEnv, got)
	}
}

func killProcess(pid int) error { return syscall.Kill(pid, syscall.SIGKILL) }

// TestAChildCgroupIsNoEscape: in the set's own cgroup a command may make a child cgroup and move
// into it, with an empty environment and a session of its own; the stop still finds and kills it
// (cgroup.kill takes the whole subtree) and removes both cgroups.
func TestAChildCgroupIsNoEscape(t *testing.T) {
	testenv.RequireCommands(t, "setsid", "env", "sleep")
	if dir, fd := makeCgroup("openclaw-tools-probe"); fd < 0 {
		t.Skip("this machine lets the test make no cgroup v2")
	} else {
		_ = syscall.Close(fd)
		_ = os.Remove(dir)
	}
	s, ws := newTestSet(t, nil)
	mustOK(t, runTool(t, s, "exec", map[string]any{"command": "true"}))
	cg := s.procs.contain.cgDir
	if cg == "" {
		t.Fatal("no cgroup was made for the set")
	}
	mustOK(t, runTool(t, s, "exec", map[string]any{"command": `mkdir ` + cg + `/inner && setsid env -i sh -c 'echo $$ > ` + cg + `/inner/cgroup.procs; echo $$ > d.pid; exec sleep 1003' </dev/null >/dev/null 2>&1 &
sleep 0.2; echo started`}))
	var pid int
	eventually(t, 5*time.Second, "d.pid", func() bool {
		b, _ := os.ReadFile(filepath.Join(ws, "d.pid"))
		pid, _ = strconv.Atoi(strings.TrimSpace(string(b)))
		return pid > 0
	})
	t.Cleanup(func() { _ = killProcess(pid) })
	if b, _ := os.ReadFile(cg + "/cgroup.procs"); strings.Contains(string(b), strconv.Itoa(pid)) {
		t.Fatal("the process did not move to the child cgroup: the test would prove nothing")
	}
	st, err := s.Stop(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if testenv.Alive(pid) || st.Processes < 1 {
		t.Fatalf("the process in a child cgroup outlived the set (alive %v, stopped %+v)", testenv.Alive(pid), st)
	}
	if _, err := os.Stat(cg); !os.IsNotExist(err) {
		t.Fatalf("the set's cgroup is left: %v", err)
	}
}

// TestLeftoversOfADeadOwnerAreStopped: a worker that died in the middle of a turn stopped
// nothing; the next worker of the same owner (its state dir) stops what its sets left running,
// detached ones included, and removes their cgroups, while another owner's processes live on.
func TestLeftoversOfADeadOwnerAreStopped(t *testing.T) {
	testenv.RequireCommands(t, "setsid", "sleep")
	for _, mode := range []string{"cgroup v2", "environment marker"} {
		t.Run(mode, func(t *testing.T) {
			if mode == "cgroup v2" {
				if dir, fd := makeCgroup("openclaw-tools-probe"); fd < 0 {
					t.Skip("this machine lets the test make no cgroup v2")
				} else {
					_ = syscall.Close(fd)
					_ = os.Remove(dir)
				}
			}
			owner, other := OwnerOf(t.TempDir()), OwnerOf(t.TempDir())
			start := func(owner string) (int, string) {
				s, ws := newTestSet(t, func(c *Config) { c.Owner = owner })
				if mode == "environment marker" {
					s.procs.contain.cgTried = true
				}
				mustOK(t, runTool(t, s, "exec", map[string]any{"command": `setsid sh -c 'echo $$ > e.pid; exec sleep 1004' </dev/null >/dev/null 2>&1 &
until [ -s e.pid ]; do sleep 0.02; done`}))
				b, _ := os.ReadFile(filepath.Join(ws, "e.pid"))
				pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
				if pid <= 0 || !testenv.Alive(pid) {
					t.Fatalf("no detached process (%q)", b)
				}
				t.Cleanup(func() { _ = killProcess(pid) })
				return pid, s.procs.contain.cgDir
			}
			dead, cg := start(owner) // its worker "dies": the set is never stopped
			living, _ := start(other)
			st, err := StopLeftovers(context.Background(), owner)
			if err != nil {
				t.Fatal(err)
			}
			if testenv.Alive(dead) || st.Processes < 1 {
				t.Fatalf("the dead owner's process outlived StopLeftovers (stopped %+v)", st)
			}
			if !testenv.Alive(living) {
				t.Fatal("StopLeftovers killed another owner's process")
			}
			if cg != "" {
				if _, err := os.Stat(cg); !os.IsNotExist(err) {
					t.Fatalf("the dead owner's cgroup is left: %v", err)
				}
			}
			if _, err := StopLeftovers(context.Background(), "a-b"); err == nil {
				t.Fatal("an owner that is no OwnerOf name was taken")
			}
		})
	}
}

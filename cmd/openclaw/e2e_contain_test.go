package main_test

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/openclaw/cloudworkers/gateway/placement"
	"github.com/openclaw/cloudworkers/internal/testrig/testenv"
)

// detachScript is a worker turn whose command leaves processes behind that escape its process
// group: one through setsid and nohup, one through a subshell's background job. Each records its
// pid in the workspace.
const detachScript = `[
  {"toolCalls": [{"name": "exec", "arguments": {"command": "setsid nohup sh -c 'echo $$ > detached-a.pid; exec sleep 7731' </dev/null >/dev/null 2>&1 & ( sh -c 'echo $$ > detached-b.pid; exec sleep 7732' </dev/null >/dev/null 2>&1 & ); until [ -s detached-a.pid ] && [ -s detached-b.pid ]; do sleep 0.05; done; echo started", "timeout": 60}}]},
  {"text": "Detached turn done."}
]`

// boxProcess reports whether a live process runs argv (a zombie does not count).
func boxProcess(argv ...string) []int {
	want := strings.Join(argv, "\x00") + "\x00"
	var out []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmd, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && string(cmd) == want {
			out = append(out, pid)
		}
	}
	return out
}

// TestDetachedProcessesDoNotOutliveTheirTurn: on a real OpenSSH box in a network namespace (a
// box user that may make no cgroup, so the worker finds the processes by their environment
// marker), a worker turn starts `setsid nohup sleep &` and `( sleep & )` and ends; the session is
// pulled back. Both processes ran (their pid files came home) and neither exists afterwards.
func TestDetachedProcessesDoNotOutliveTheirTurn(t *testing.T) {
	testenv.RequireCommands(t, "git", "nohup")
	profiles, _ := netnsProfile(t)
	root := t.TempDir()
	if err := os.Chmod(root, 0o755); err != nil {
		t.Fatal(err)
	}
	g := startGateway(t, filepath.Join(root, "data"), fastWorkerConfig+scriptedModels(t, root, map[string]string{"detach": detachScript})+profiles)
	t.Cleanup(func() { destroyAll(g) })
	t.Cleanup(func() { // nothing of the test outlives it, even when it fails
		for _, p := range append(boxProcess("sleep", "7731"), boxProcess("sleep", "7732")...) {
			if proc, err := os.FindProcess(p); err == nil {
				_ = proc.Kill()
			}
		}
	})
	ws := filepath.Join(root, "user")
	userWorkspace(t, ws, true)
	id, _ := g.activeSession(ws, "detach/m", "netns")
	g.runTurn(id, "start something that outlives you", "worker")
	g.pullback(id)
	anchor := g.mustRest(id, placement.Local).Placement.AnchorDir
	for _, f := range []string{"detached-a.pid", "detached-b.pid"} {
		b, err := os.ReadFile(filepath.Join(anchor, f))
		if pid, _ := strconv.Atoi(strings.TrimSpace(string(b))); err != nil || pid <= 0 {
			t.Fatalf("%s did not come home (%v %q): the detached process never ran", f, err, b)
		}
	}
	for _, argv := range [][]string{{"sleep", "7731"}, {"sleep", "7732"}} {
		if pids := boxProcess(argv...); len(pids) > 0 {
			t.Fatalf("%q outlived its turn and the pull-back: pids %v", strings.Join(argv, " "), pids)
		}
	}
}

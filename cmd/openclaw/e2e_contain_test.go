package main_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

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

// TestAKilledWorkersLeftoversAreStopped: a worker SIGKILLed in the middle of a turn stops nothing;
// the worker the gateway relaunches in its place (same state dir) stops what that turn left
// running, the detached process and the command itself, before it takes a turn.
func TestAKilledWorkersLeftoversAreStopped(t *testing.T) {
	testenv.RequireCommands(t, "git", "setsid")
	root := t.TempDir()
	hang := `[{"toolCalls": [{"name": "exec", "arguments": {"command": "setsid sh -c 'echo $$ > left.pid; exec sleep 7741' </dev/null >/dev/null 2>&1 & until [ -s left.pid ]; do sleep 0.05; done; exec sleep 7742", "timeout": 600}}]},
	          {"text": "never"}]`
	g := startGateway(t, filepath.Join(root, "data"), fastWorkerConfig+scriptedModels(t, root, map[string]string{"hang": hang}))
	t.Cleanup(func() { destroyAll(g) })
	t.Cleanup(func() {
		for _, p := range append(boxProcess("sleep", "7741"), boxProcess("sleep", "7742")...) {
			if proc, err := os.FindProcess(p); err == nil {
				_ = proc.Kill()
			}
		}
	})
	ws := filepath.Join(root, "user")
	userWorkspace(t, ws, true)
	id, envID := g.activeSession(ws, "hang/m", "local")
	if _, code, err := g.send(id, "start and hang"); err != nil {
		t.Fatalf("send: %d %v", code, err)
	}
	both := func() bool { return len(boxProcess("sleep", "7741")) == 1 && len(boxProcess("sleep", "7742")) == 1 }
	waitUntil(t, 30*time.Second, func() string { return "the turn's processes never ran" }, both)
	e, err := g.getEnv(envID)
	if err != nil {
		t.Fatal(err)
	}
	g.killWorker(e, workerPID(t, e))
	waitUntil(t, 30*time.Second, func() string {
		return fmt.Sprintf("the killed worker's processes outlived its successor's start: %v %v", boxProcess("sleep", "7741"), boxProcess("sleep", "7742"))
	}, func() bool { return len(boxProcess("sleep", "7741")) == 0 && len(boxProcess("sleep", "7742")) == 0 })
}

package tools

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/openclaw/cloudworkers/internal/testrig/testenv"
)

func TestExec(t *testing.T) {
	s, ws := newTestSet(t, func(c *Config) { c.Env = append(os.Environ(), "BASE_VAR=base") })
	if err := os.Mkdir(filepath.Join(ws, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		args     map[string]any
		isError  bool
		exitCode float64
		contains []string
	}{
		{name: "ok", args: map[string]any{"command": "echo hello"}, contains: []string{"hello"}},
		{name: "exit code", args: map[string]any{"command": "echo out; echo err >&2; exit 3"}, isError: true, exitCode: 3,
			contains: []string{"out", "err", "exited with code 3"}},
		{name: "runs in workspace", args: map[string]any{"command": "pwd"}, contains: []string{ws}},
		{name: "workdir", args: map[string]any{"command": "pwd", "workdir": "sub"}, contains: []string{filepath.Join(ws, "sub")}},
		{name: "env", args: map[string]any{"command": "echo $FOO-$BASE_VAR", "env": map[string]string{"FOO": "bar"}}, contains: []string{"bar-base"}},
		{name: "no output", args: map[string]any{"command": "true"}, contains: []string{"(no output)"}},
		{name: "missing workdir", args: map[string]any{"command": "pwd", "workdir": "nope"}, isError: true, exitCode: -1, contains: []string{"not a directory"}},
		{name: "stdin is not a terminal", args: map[string]any{"command": "cat </dev/null; echo done"}, contains: []string{"done"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := runTool(t, s, "exec", tc.args)
			if r.IsError != tc.isError {
				t.Fatalf("IsError = %v: %s", r.IsError, r.Text())
			}
			for _, c := range tc.contains {
				if !strings.Contains(r.Text(), c) {
					t.Fatalf("output %q lacks %q", r.Text(), c)
				}
			}
			if tc.exitCode >= 0 {
				if got := details(t, r)["exitCode"]; got != tc.exitCode {
					t.Fatalf("exitCode = %v, want %v", got, tc.exitCode)
				}
			}
		})
	}
}

// eventually polls cond until it holds or the deadline passes.
func eventually(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", within, what)
		}
		time.Sleep(20 * time.Millisecond) // polling interval, not a wait for an event
	}
}

func readPid(t *testing.T, path string) int {
	t.Helper()
	var pid int
	eventually(t, 20*time.Second, "pidfile "+path, func() bool {
		b, err := os.ReadFile(path)
		if err != nil {
			return false
		}
		pid, err = strconv.Atoi(strings.TrimSpace(string(b)))
		return err == nil && pid > 0
	})
	return pid
}

func TestExecTimeoutKillsProcessGroup(t *testing.T) {
	s, ws := newTestSet(t, nil)
	pidfile := filepath.Join(ws, "child.pid")
	start := time.Now()
	r := runTool(t, s, "exec", map[string]any{
		"command": "sleep 300 & echo $! > child.pid; echo started; wait",
		"timeout": 1,
	})
	mustErr(t, r, "timed out", "started")
	if d := details(t, r); d["status"] != "timed out" {
		t.Fatalf("details = %v", d)
	}
	if el := time.Since(start); el > 60*time.Second {
		t.Fatalf("timeout took %s", el)
	}
	pid := readPid(t, pidfile)
	eventually(t, 20*time.Second, fmt.Sprintf("child sleep %d to die", pid), func() bool { return !testenv.Alive(pid) })
}

func TestExecOutputTruncation(t *testing.T) {
	s, _ := newTestSet(t, func(c *Config) { c.MaxOutputBytes = 1000 })
	r := runTool(t, s, "exec", map[string]any{"command": "seq 1 20000"})
	out := mustOK(t, r)
	if !strings.HasPrefix(out, "1\n2\n3\n") || !strings.HasSuffix(out, "19999\n20000\n") {
		t.Fatalf("head or tail missing: %q ... %q", out[:20], tail(out, 20))
	}
	if !strings.Contains(out, "bytes of output omitted") || len(out) > 1100 {
		t.Fatalf("no bounded marker (len %d): %q", len(out), out)
	}
	d := details(t, r)
	if d["truncated"] != true || d["outputBytes"].(float64) < 100000 {
		t.Fatalf("details = %v", d)
	}
}

func TestExecContextCancelKills(t *testing.T) {
	s, ws := newTestSet(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	r := s.Run(ctx, "exec", []byte(`{"command":"echo $$ > shell.pid; sleep 300"}`))
	mustErr(t, r, "aborted")
	pid := readPid(t, filepath.Join(ws, "shell.pid"))
	eventually(t, 20*time.Second, "the shell to die", func() bool { return !testenv.Alive(pid) })
}

func startBackground(t *testing.T, s *Set, args map[string]any) string {
	t.Helper()
	r := runTool(t, s, "exec", args)
	out := mustOK(t, r)
	id, _ := details(t, r)["sessionId"].(string)
	if id == "" || !strings.Contains(out, id) {
		t.Fatalf("no sessionId in %q / %s", out, r.Details)
	}
	return id
}

// pollUntil polls a process (each poll waits up to 1 s for output) until its accumulated output
// contains want, and returns that output.
func pollUntil(t *testing.T, s *Set, id, want string) string {
	t.Helper()
	var acc strings.Builder
	deadline := time.Now().Add(30 * time.Second)
	for {
		r := runTool(t, s, "process", map[string]any{"action": "poll", "sessionId": id, "timeout": 1000})
		text := mustOK(t, r)
		if i := strings.LastIndex(text, "\n\nProcess "); i >= 0 {
			acc.WriteString(strings.TrimPrefix(text[:i], "(no new output)"))
		}
		if strings.Contains(acc.String(), want) {
			return acc.String()
		}
		if time.Now().After(deadline) {
			t.Fatalf("output %q never contained %q", acc.String(), want)
		}
	}
}

func TestBackgroundProcess(t *testing.T) {
	s, _ := newTestSet(t, nil)
	r0 := runTool(t, s, "exec", map[string]any{
		"command":    `echo ready; while read line; do echo "got:$line"; done; echo bye`,
		"background": true,
	})
	first := mustOK(t, r0)
	id, _ := details(t, r0)["sessionId"].(string)
	if id == "" {
		t.Fatalf("no sessionId in %s", r0.Details)
	}
	// on a loaded machine "ready" may already be in the exec result ("Output so far")
	if !strings.Contains(first, "ready") {
		pollUntil(t, s, id, "ready")
	}

	mustOK(t, runTool(t, s, "process", map[string]any{"action": "write", "sessionId": id, "data": "hello\n"}))
	pollUntil(t, s, id, "got:hello")

	list := mustOK(t, runTool(t, s, "process", map[string]any{"action": "list"}))
	if !strings.Contains(list, id) || !strings.Contains(list, "running") {
		t.Fatalf("list = %q", list)
	}
	log := mustOK(t, runTool(t, s, "process", map[string]any{"action": "log", "sessionId": id}))
	if !strings.Contains(log, "ready\ngot:hello\n") {
		t.Fatalf("log = %q", log)
	}
	log = mustOK(t, runTool(t, s, "process", map[string]any{"action": "log", "sessionId": id, "offset": 1, "limit": 1}))
	if !strings.HasPrefix(log, "got:hello\n\n[lines 1 to 1 of 2") {
		t.Fatalf("log offset = %q", log)
	}

	// Closing stdin ends the loop; the process exits 0.
	mustOK(t, runTool(t, s, "process", map[string]any{"action": "write", "sessionId": id, "data": "last\n", "eof": true}))
	out := pollUntil(t, s, id, "bye")
	if !strings.Contains(out, "got:last") {
		t.Fatalf("output = %q", out)
	}
	var st string
	eventually(t, 20*time.Second, "process to exit", func() bool {
		r := runTool(t, s, "process", map[string]any{"action": "poll", "sessionId": id, "timeout": 500})
		st, _ = details(t, r)["status"].(string)
		return st != "running"
	})
	if st != "completed" {
		t.Fatalf("status = %q", st)
	}
	mustErr(t, runTool(t, s, "process", map[string]any{"action": "write", "sessionId": id, "data": "x"}), "has exited")

	// kill and remove another one; its child dies with it.
	id2 := startBackground(t, s, map[string]any{"command": "sleep 300 & echo $! > bg.pid; wait", "background": true})
	pid := readPid(t, filepath.Join(s.Config().Workspace, "bg.pid"))
	r := runTool(t, s, "process", map[string]any{"action": "kill", "sessionId": id2})
	mustOK(t, r)
	if d := details(t, r); d["status"] != "killed" {
		t.Fatalf("after kill: %v", d)
	}
	eventually(t, 20*time.Second, "background child to die", func() bool { return !testenv.Alive(pid) })

	mustOK(t, runTool(t, s, "process", map[string]any{"action": "remove", "sessionId": id2}))
	list = mustOK(t, runTool(t, s, "process", map[string]any{"action": "list"}))
	if strings.Contains(list, id2) || !strings.Contains(list, id) {
		t.Fatalf("list after remove = %q", list)
	}
	mustErr(t, runTool(t, s, "process", map[string]any{"action": "poll", "sessionId": id2}), "no background process")
	mustErr(t, runTool(t, s, "process", map[string]any{"action": "poll"}), "sessionId is required")
}

func TestExecYieldMovesToBackground(t *testing.T) {
	s, _ := newTestSet(t, nil)
	id := startBackground(t, s, map[string]any{"command": "echo early; sleep 300", "yieldMs": 300})
	r := runTool(t, s, "process", map[string]any{"action": "list"})
	if !strings.Contains(mustOK(t, r), id) {
		t.Fatalf("yielded process not listed: %s", r.Text())
	}
	eventually(t, 20*time.Second, "early output", func() bool {
		log := mustOK(t, runTool(t, s, "process", map[string]any{"action": "log", "sessionId": id}))
		return strings.Contains(log, "early")
	})
	mustOK(t, runTool(t, s, "process", map[string]any{"action": "remove", "sessionId": id}))
}

func TestProcessOutputRingBuffer(t *testing.T) {
	s, _ := newTestSet(t, func(c *Config) { c.MaxOutputBytes = 1000; c.ProcessOutputBytes = 4096 })
	id := startBackground(t, s, map[string]any{"command": "seq 1 50000; echo END", "background": true})
	eventually(t, 30*time.Second, "process to finish", func() bool {
		r := runTool(t, s, "process", map[string]any{"action": "list"})
		return strings.Contains(r.Text(), "completed")
	})
	log := mustOK(t, runTool(t, s, "process", map[string]any{"action": "log", "sessionId": id, "limit": 100000}))
	if !strings.Contains(log, "earlier bytes no longer retained") || !strings.Contains(log, "lines cut") || !strings.Contains(log, "END") || len(log) > 1300 {
		t.Fatalf("log (%d bytes) = %q", len(log), log)
	}
	poll := mustOK(t, runTool(t, s, "process", map[string]any{"action": "poll", "sessionId": id}))
	if !strings.Contains(poll, "bytes of output skipped") || !strings.Contains(poll, "END") || len(poll) > 1300 {
		t.Fatalf("poll (%d bytes) = %q", len(poll), poll)
	}
}

func TestCloseKillsBackgroundProcesses(t *testing.T) {
	ws := t.TempDir()
	s := NewSet(Config{Workspace: ws})
	startBackground(t, s, map[string]any{"command": "sleep 300 & echo $! > c.pid; wait", "background": true})
	pid := readPid(t, filepath.Join(ws, "c.pid"))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := s.Close(ctx); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, "child to die after Close", func() bool { return !testenv.Alive(pid) })
	mustErr(t, runTool(t, s, "exec", map[string]any{"command": "true"}), "closed")
}

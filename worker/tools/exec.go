package tools

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/openclaw/cloudworkers/protocol"
)

// maxYield bounds yieldMs.
const maxYield = 10 * time.Minute

type execTool struct{ s *Set }

var _ Tool = (*execTool)(nil)

func (t *execTool) Name() string { return "exec" }

func (t *execTool) Schema() protocol.Tool {
	c := t.s.cfg
	yield := "never (waits for the command)"
	if c.DefaultYield > 0 {
		yield = fmt.Sprintf("%d", c.DefaultYield.Milliseconds())
	}
	return schema("exec", fmt.Sprintf("Execute a shell command (%s -c) in the workspace. Returns combined stdout and stderr; "+
		"output beyond %s keeps its start and end with a marker in between. A command still running after yieldMs "+
		"(default %s) or started with background=true keeps running in the background: use the process tool "+
		"(list/poll/log/write/kill/remove) with the returned sessionId.", c.Shell, formatSize(c.MaxOutputBytes), yield),
		`{"type":"object","properties":{`+
			`"command":{"type":"string","description":"Shell command to execute"},`+
			`"workdir":{"type":"string","description":"Working directory (relative to the workspace; defaults to the workspace)"},`+
			`"env":{"type":"object","additionalProperties":{"type":"string"},"description":"Extra environment variables"},`+
			`"timeout":{"type":"number","description":"Timeout in seconds; the command and its children are killed on expiry"},`+
			`"background":{"type":"boolean","description":"Run in the background immediately and return a sessionId"},`+
			`"yieldMs":{"type":"number","description":"Milliseconds to wait before moving the command to the background"}},`+
			`"required":["command"]}`)
}

type execDetails struct {
	Status     string `json:"status"` // completed | failed | timed out | killed | running | aborted
	ExitCode   *int   `json:"exitCode,omitempty"`
	Signal     string `json:"signal,omitempty"`
	SessionID  string `json:"sessionId,omitempty"`
	PID        int    `json:"pid,omitempty"`
	Cwd        string `json:"cwd"`
	DurationMs int64  `json:"durationMs"`
	Truncated  bool   `json:"truncated,omitempty"`
	OutputSize int64  `json:"outputBytes"`
}

func (t *execTool) Run(ctx context.Context, args json.RawMessage) (Result, error) {
	var a struct {
		Command    string            `json:"command"`
		Workdir    string            `json:"workdir"`
		Env        map[string]string `json:"env"`
		Timeout    *float64          `json:"timeout"`
		Background optBool           `json:"background"`
		YieldMs    *float64          `json:"yieldMs"`
	}
	if err := decodeArgs(args, &a); err != nil {
		return invalidArgs("exec", err), nil
	}
	if strings.TrimSpace(a.Command) == "" {
		return invalidArgs("exec", errors.New("command is required")), nil
	}
	c := t.s.cfg
	cwd := c.Workspace
	if a.Workdir != "" {
		// exec has full permission in the box: workdir resolves against the workspace but is not confined.
		cwd = a.Workdir
		if !filepath.IsAbs(cwd) {
			cwd = filepath.Join(c.Workspace, cwd)
		}
		cwd = filepath.Clean(cwd)
	}
	if fi, err := os.Stat(cwd); err != nil || !fi.IsDir() {
		return errorf("exec: workdir %s is not a directory", cwd), nil
	}
	timeout := c.DefaultTimeout
	if a.Background {
		timeout = 0
	}
	if a.Timeout != nil {
		if *a.Timeout <= 0 {
			return invalidArgs("exec", fmt.Errorf("timeout must be > 0 seconds, got %v", *a.Timeout)), nil
		}
		timeout = time.Duration(*a.Timeout * float64(time.Second))
	}
	yield := c.DefaultYield
	if a.YieldMs != nil {
		yield = time.Duration(*a.YieldMs * float64(time.Millisecond))
		if yield < 0 {
			yield = 0
		}
	}
	yield = min(yield, maxYield)

	p, err := t.s.procs.start(startSpec{command: a.Command, cwd: cwd, env: environ(c.Env, a.Env), timeout: timeout})
	if err != nil {
		return errorf("exec: %v", err), nil
	}
	if a.Background {
		return t.backgrounded(p), nil
	}
	var yieldC <-chan time.Time
	if yield > 0 || a.YieldMs != nil {
		tm := time.NewTimer(yield)
		defer tm.Stop()
		yieldC = tm.C
	}
	select {
	case <-p.done:
	case <-yieldC:
		return t.backgrounded(p), nil
	case <-ctx.Done():
		p.kill(context.Background(), 5*time.Second)
		t.s.procs.remove(p.id)
		return errorf("exec: aborted (%v); the command was killed", ctx.Err()), nil
	}
	t.s.procs.remove(p.id)
	return t.finished(p), nil
}

// backgrounded marks p as a background process and reports its id with the output so far.
func (t *execTool) backgrounded(p *process) Result {
	out, end, _ := p.out.since(0, t.s.cfg.MaxOutputBytes)
	p.mu.Lock()
	p.background = true
	p.pollOffset = end
	p.mu.Unlock()
	text := fmt.Sprintf("Command still running (sessionId %s, pid %d). Use process (list/poll/log/write/kill/remove) for follow-up.", p.id, p.pid)
	if len(out) > 0 {
		text += "\n\nOutput so far:\n" + string(out)
	}
	return withDetails(textResult(text), execDetails{
		Status: "running", SessionID: p.id, PID: p.pid, Cwd: p.cwd,
		DurationMs: time.Since(p.started).Milliseconds(), OutputSize: end,
	})
}

func (t *execTool) finished(p *process) Result {
	out, truncated := p.out.headTail(t.s.cfg.MaxOutputBytes)
	status := p.status()
	p.mu.Lock()
	d := execDetails{
		Status: status, Signal: p.signal, PID: p.pid, Cwd: p.cwd,
		DurationMs: p.ended.Sub(p.started).Milliseconds(), Truncated: truncated, OutputSize: p.out.size(),
	}
	code, timedOut, waitErr := p.exitCode, p.timedOut, p.waitErr
	p.mu.Unlock()
	if code >= 0 {
		d.ExitCode = &code
	}
	text := out
	if text == "" {
		text = "(no output)"
	}
	r := textResult(text)
	switch {
	case timedOut:
		r = textResult(text + fmt.Sprintf("\n\nCommand timed out after %s; it and its child processes were killed.",
			time.Duration(d.DurationMs)*time.Millisecond))
		r.IsError = true
	case waitErr != "":
		r = textResult(text + "\n\nCommand failed: " + waitErr)
		r.IsError = true
	case code != 0:
		if d.Signal != "" {
			r = textResult(text + "\n\nCommand was killed by " + d.Signal)
		} else {
			r = textResult(text + fmt.Sprintf("\n\nCommand exited with code %d", code))
		}
		r.IsError = true
	}
	return withDetails(r, d)
}

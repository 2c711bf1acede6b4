package tools

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/openclaw/cloudworkers/protocol"
)

const (
	// maxPollWait bounds how long poll waits for output.
	maxPollWait = 2 * time.Minute
	// stdinWriteTimeout bounds a write to a process that does not read its input.
	stdinWriteTimeout = 10 * time.Second
	// defaultLogLines is how many lines log shows without a limit.
	defaultLogLines = 200
)

type processTool struct{ s *Set }

var _ Tool = (*processTool)(nil)

func (t *processTool) Name() string { return "process" }

func (t *processTool) Schema() protocol.Tool {
	return schema("process", "Manage background processes started by exec. Actions: list (all processes), "+
		"poll (new output since the last poll and the status; timeout waits up to that many ms for output or exit), "+
		"log (retained output by lines: offset is 0-based, default the last 200 lines), write (send data to stdin; eof closes it), "+
		"kill (kill the process and its children), remove (kill if running and forget it).",
		`{"type":"object","properties":{`+
			`"action":{"type":"string","enum":["list","poll","log","write","kill","remove"],"description":"Action to perform"},`+
			`"sessionId":{"type":"string","description":"Process id returned by exec (all actions but list)"},`+
			`"data":{"type":"string","description":"Data to write to stdin (write)"},`+
			`"eof":{"type":"boolean","description":"Close stdin after writing (write)"},`+
			`"offset":{"type":"integer","minimum":0,"description":"First line, 0-based (log)"},`+
			`"limit":{"type":"integer","minimum":1,"description":"Number of lines (log)"},`+
			`"timeout":{"type":"number","description":"Milliseconds to wait for new output or exit (poll)"}},`+
			`"required":["action"]}`)
}

type processArgs struct {
	Action    string   `json:"action"`
	SessionID string   `json:"sessionId"`
	Data      *string  `json:"data"`
	EOF       optBool  `json:"eof"`
	Offset    optInt   `json:"offset"`
	Limit     optInt   `json:"limit"`
	Timeout   *float64 `json:"timeout"`
}

type processInfo struct {
	SessionID   string `json:"sessionId"`
	Status      string `json:"status"`
	PID         int    `json:"pid"`
	Command     string `json:"command"`
	Cwd         string `json:"cwd"`
	ExitCode    *int   `json:"exitCode,omitempty"`
	RuntimeMs   int64  `json:"runtimeMs"`
	OutputBytes int64  `json:"outputBytes"`
}

func info(p *process) processInfo {
	status := p.status()
	in := processInfo{SessionID: p.id, Status: status, PID: p.pid, Command: p.command, Cwd: p.cwd, OutputBytes: p.out.size()}
	end := time.Now()
	if p.exited() {
		p.mu.Lock()
		end = p.ended
		if code := p.exitCode; code >= 0 {
			in.ExitCode = &code
		}
		p.mu.Unlock()
	}
	in.RuntimeMs = end.Sub(p.started).Milliseconds()
	return in
}

func (t *processTool) Run(ctx context.Context, args json.RawMessage) (Result, error) {
	var a processArgs
	if err := decodeArgs(args, &a); err != nil {
		return invalidArgs("process", err), nil
	}
	if a.Action == "list" {
		return t.list(), nil
	}
	switch a.Action {
	case "poll", "log", "write", "kill", "remove":
	case "":
		return invalidArgs("process", errors.New("action is required: list, poll, log, write, kill or remove")), nil
	default:
		return invalidArgs("process", fmt.Errorf("unknown action %q; use list, poll, log, write, kill or remove", a.Action)), nil
	}
	if a.SessionID == "" {
		return invalidArgs("process", fmt.Errorf("sessionId is required for action %s", a.Action)), nil
	}
	p, ok := t.s.procs.get(a.SessionID)
	if ok {
		p.mu.Lock()
		ok = p.background
		p.mu.Unlock()
	}
	if !ok {
		return errorf("process: no background process with sessionId %q; use action=list", a.SessionID), nil
	}
	switch a.Action {
	case "poll":
		return t.poll(ctx, p, a), nil
	case "log":
		return t.log(p, a), nil
	case "write":
		return t.write(p, a), nil
	case "kill":
		if p.exited() {
			return withDetails(textResult(fmt.Sprintf("Process %s already exited: %s.", p.id, p.status())), info(p)), nil
		}
		if !p.kill(ctx, 5*time.Second) {
			return withDetails(errorf("process: sent SIGKILL to %s (pid %d) but it has not exited yet", p.id, p.pid), info(p)), nil
		}
		return withDetails(textResult(fmt.Sprintf("Killed process %s (pid %d).", p.id, p.pid)), info(p)), nil
	default: // remove
		if !p.exited() && !p.kill(ctx, 5*time.Second) {
			return withDetails(errorf("process: sent SIGKILL to %s (pid %d) but it has not exited yet; not removed", p.id, p.pid), info(p)), nil
		}
		t.s.procs.remove(p.id)
		return withDetails(textResult(fmt.Sprintf("Removed process %s.", p.id)), info(p)), nil
	}
}

func (t *processTool) list() Result {
	procs := t.s.procs.list()
	if len(procs) == 0 {
		return withDetails(textResult("No background processes."), map[string]any{"processes": []processInfo{}})
	}
	var b strings.Builder
	infos := make([]processInfo, 0, len(procs))
	for _, p := range procs {
		in := info(p)
		infos = append(infos, in)
		cmd := in.Command
		if len(cmd) > 120 {
			cmd = string(truncateBytes([]byte(cmd), 120))
		}
		fmt.Fprintf(&b, "%s  %s  %s  pid %d  %s\n", in.SessionID, in.Status,
			(time.Duration(in.RuntimeMs) * time.Millisecond).Round(time.Second), in.PID, strings.ReplaceAll(cmd, "\n", " "))
	}
	text, _ := limitText(strings.TrimRight(b.String(), "\n"), t.s.cfg.MaxOutputBytes)
	return withDetails(textResult(text), map[string]any{"processes": infos})
}

func (t *processTool) poll(ctx context.Context, p *process, a processArgs) Result {
	if a.Timeout != nil && *a.Timeout > 0 {
		wait := min(time.Duration(*a.Timeout*float64(time.Millisecond)), maxPollWait)
		p.mu.Lock()
		from := p.pollOffset
		p.mu.Unlock()
		changed := p.out.wait()
		if p.out.size() <= from && !p.exited() {
			tm := time.NewTimer(wait)
			select {
			case <-changed:
			case <-p.done:
			case <-tm.C:
			case <-ctx.Done():
			}
			tm.Stop()
		}
	}
	exited := p.exited() // before reading, so the output of an exited process is complete
	p.mu.Lock()
	out, end, skipped := p.out.since(p.pollOffset, t.s.cfg.MaxOutputBytes)
	p.pollOffset = end
	p.mu.Unlock()
	var b strings.Builder
	if skipped > 0 {
		fmt.Fprintf(&b, "[... %d bytes of output skipped ...]\n", skipped)
	}
	if len(out) == 0 {
		b.WriteString("(no new output)")
	} else {
		b.Write(out)
	}
	in := info(p)
	if exited {
		fmt.Fprintf(&b, "\n\nProcess %s: %s.", p.id, in.Status)
	} else {
		fmt.Fprintf(&b, "\n\nProcess %s still running.", p.id)
	}
	return withDetails(textResult(b.String()), in)
}

func (t *processTool) log(p *process, a processArgs) Result {
	data, dropped := p.out.retained()
	text := string(data)
	lines := strings.SplitAfter(text, "\n")
	if len(lines) > 0 && lines[len(lines)-1] == "" {
		lines = lines[:len(lines)-1]
	}
	limit := a.Limit.or(defaultLogLines)
	if limit < 1 {
		return invalidArgs("process", fmt.Errorf("limit must be >= 1, got %d", limit))
	}
	start := max(len(lines)-limit, 0)
	if a.Offset.Set {
		if a.Offset.V < 0 {
			return invalidArgs("process", fmt.Errorf("offset must be >= 0, got %d", a.Offset.V))
		}
		start = min(a.Offset.V, len(lines))
	}
	end := min(start+limit, len(lines))
	var b strings.Builder
	if dropped > 0 {
		fmt.Fprintf(&b, "[... %d earlier bytes no longer retained ...]\n", dropped)
	}
	body := strings.TrimSuffix(strings.Join(lines[start:end], ""), "\n")
	if a.Offset.Set {
		body, _ = limitText(body, t.s.cfg.MaxOutputBytes)
	} else {
		body = limitTextTail(body, t.s.cfg.MaxOutputBytes)
	}
	b.WriteString(body)
	if len(lines) == 0 {
		b.WriteString("(no output)")
	}
	fmt.Fprintf(&b, "\n\n[lines %d to %d of %d retained (offset is 0-based); process %s]", start, max(end-1, start), len(lines), p.status())
	in := info(p)
	return withDetails(textResult(b.String()), map[string]any{"process": in, "offset": start, "lines": end - start, "totalLines": len(lines)})
}

func (t *processTool) write(p *process, a processArgs) Result {
	if p.exited() {
		return errorf("process: %s has exited (%s); cannot write to it", p.id, p.status())
	}
	p.mu.Lock()
	open := p.stdinOpen
	p.mu.Unlock()
	if !open {
		return errorf("process: stdin of %s is closed", p.id)
	}
	n := 0
	if a.Data != nil && *a.Data != "" {
		_ = p.stdin.SetWriteDeadline(time.Now().Add(stdinWriteTimeout))
		var err error
		n, err = p.stdin.WriteString(*a.Data)
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				return errorf("process: wrote %d of %d bytes to %s; the process is not reading its input", n, len(*a.Data), p.id)
			}
			return errorf("process: write to %s: %v", p.id, err)
		}
	}
	msg := fmt.Sprintf("Wrote %d bytes to %s.", n, p.id)
	if a.EOF {
		p.mu.Lock()
		p.stdinOpen = false
		p.mu.Unlock()
		p.stdin.Close()
		msg += " Closed stdin."
	}
	return withDetails(textResult(msg), map[string]any{"sessionId": p.id, "bytes": n, "eof": bool(a.EOF)})
}

// limitTextTail bounds s to max bytes by keeping its end, with a marker saying how much was cut.
func limitTextTail(s string, max int) string {
	if len(s) <= max {
		return s
	}
	cut := len(s) - max
	for cut < len(s) && s[cut]&0xC0 == 0x80 {
		cut++
	}
	if nl := strings.IndexByte(s[cut:], '\n'); nl >= 0 && nl < max/2 {
		cut += nl + 1
	}
	return fmt.Sprintf("[... %d bytes, %d lines cut; use offset/limit to page ...]\n", cut, strings.Count(s[:cut], "\n")) + s[cut:]
}

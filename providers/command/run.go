package command

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/openclaw/cloudworkers/internal/capbuf"
	"github.com/openclaw/cloudworkers/internal/untrusted"
)

// Output limits: what a lease CLI prints is hostile input.
const (
	maxStdout   = 4 << 20
	maxStderr   = 64 << 10
	maxMessage  = 512
	maxSnippet  = 200
	killGrace   = 2 * time.Second
	defaultLang = "C.UTF-8"
)

// CLIError reports a lease CLI command that exited non-zero.
type CLIError struct {
	// Command is the settings field that was run ("provision", "inspect", …).
	Command  string
	ExitCode int
	// Message is the command's own output, bounded and sanitized.
	Message string
}

func (e *CLIError) Error() string {
	if e.Message == "" {
		return fmt.Sprintf("lease CLI %s exited %d", e.Command, e.ExitCode)
	}
	return fmt.Sprintf("lease CLI %s exited %d: %s", e.Command, e.ExitCode, e.Message)
}

// result is the outcome of one command that ran to completion.
type result struct {
	stdout, stderr []byte
	exit           int
}

// output is what the command said: stderr, or stdout when stderr is empty.
func (r result) output() string {
	if s := strings.TrimSpace(string(r.stderr)); s != "" {
		return s
	}
	return strings.TrimSpace(string(r.stdout))
}

func (r result) err(name string) error {
	return &CLIError{Command: name, ExitCode: r.exit, Message: sanitize(r.output(), maxMessage)}
}

// run executes argv without a shell, in a clean environment, bounded by the command timeout.
// A non-zero exit is reported in the result, not as an error; errors are for commands that could
// not start, timed out, were cancelled or printed too much.
func (c *config) run(ctx context.Context, name string, argv []string) (result, error) {
	return c.runLines(ctx, name, argv, nil)
}

// runLines is run that also hands every complete stdout line (at most maxLine bytes are looked
// at) to onLine the moment it is printed, while the command still runs.
func (c *config) runLines(ctx context.Context, name string, argv []string, onLine func(string)) (result, error) {
	if c.workDir == "" {
		return result{}, fmt.Errorf("lease CLI %s: the command provider has no working directory (the gateway's data dir)", name)
	}
	if err := os.MkdirAll(c.workDir, 0o700); err != nil {
		return result{}, fmt.Errorf("lease CLI %s: working directory: %w", name, err)
	}
	tctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	cmd := exec.CommandContext(tctx, argv[0], argv[1:]...)
	cmd.Env = c.environ()
	cmd.Dir = c.workDir
	cmd.Stdin = nil
	stdout := capbuf.New(maxStdout)
	stderr := capbuf.New(maxStderr)
	cmd.Stdout, cmd.Stderr = stdout, stderr
	if onLine != nil {
		cmd.Stdout = &lineWriter{next: stdout, onLine: onLine}
	}
	setProcessGroup(cmd)
	cmd.WaitDelay = killGrace
	err := cmd.Run()
	killProcessGroup(cmd)
	res := result{stdout: stdout.Bytes(), stderr: stderr.Bytes()}
	switch {
	case ctx.Err() != nil:
		return res, fmt.Errorf("lease CLI %s: %w", name, ctx.Err())
	case errors.Is(tctx.Err(), context.DeadlineExceeded):
		return res, fmt.Errorf("lease CLI %s timed out after %s (process group killed)", name, c.timeout)
	}
	var exitErr *exec.ExitError
	switch {
	case errors.As(err, &exitErr):
		res.exit = exitErr.ExitCode()
		if res.exit < 0 { // killed by a signal
			return res, fmt.Errorf("lease CLI %s: %v", name, exitErr)
		}
	case errors.Is(err, exec.ErrWaitDelay):
		// The command exited but something it started kept its output open; the answer stands.
	case err != nil:
		return res, fmt.Errorf("lease CLI %s: start %s: %w", name, argv[0], err)
	}
	if stdout.Truncated {
		return res, fmt.Errorf("lease CLI %s printed more than %d bytes", name, maxStdout)
	}
	return res, nil
}

// maxLine bounds one stdout line handed to a line callback; longer lines are cut.
const maxLine = 4 << 10

// lineWriter passes output through and calls onLine for each complete line.
type lineWriter struct {
	next   *capbuf.Buffer
	onLine func(string)
	line   []byte
}

func (w *lineWriter) Write(p []byte) (int, error) {
	n, _ := w.next.Write(p)
	for _, b := range p {
		if b == '\n' {
			w.onLine(string(w.line))
			w.line = w.line[:0]
			continue
		}
		if len(w.line) < maxLine {
			w.line = append(w.line, b)
		}
	}
	return n, nil
}

// environ is the small clean environment of every command: never the gateway's own secrets.
func (c *config) environ() []string {
	base := map[string]string{
		"PATH": os.Getenv("PATH"),
		"HOME": os.Getenv("HOME"),
		"LANG": os.Getenv("LANG"),
	}
	if base["PATH"] == "" {
		base["PATH"] = "/usr/local/bin:/usr/bin:/bin"
	}
	if base["LANG"] == "" {
		base["LANG"] = defaultLang
	}
	for k, v := range c.env {
		base[k] = v
	}
	env := make([]string, 0, len(base))
	for k, v := range base {
		if v != "" {
			env = append(env, k+"="+v)
		}
	}
	return env
}

// sanitize makes provider output safe to show: valid UTF-8, no control characters, at most max bytes.
func sanitize(s string, max int) string { return untrusted.Line(s, max) }

// Package gitexec runs the git CLI for the sync packages with bounded output and a quiet environment.
package gitexec

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
)

// maxStderr bounds the stderr kept for an error message.
const maxStderr = 4 << 10

// Env is the environment of every git command: the caller's, without prompts, pagers or
// translations, so that output can be parsed and nothing waits for a terminal.
func Env() []string {
	return append(os.Environ(),
		"GIT_TERMINAL_PROMPT=0",
		"GIT_PAGER=cat",
		"LC_ALL=C",
		"GIT_OPTIONAL_LOCKS=0",
	)
}

// Error is a git command that exited non-zero.
type Error struct {
	Args   []string
	Stderr string
	Err    error
}

func (e *Error) Error() string {
	msg := strings.TrimSpace(e.Stderr)
	if len(msg) > 500 {
		msg = msg[:500] + "…"
	}
	return fmt.Sprintf("git %s: %v: %s", strings.Join(e.Args, " "), e.Err, msg)
}

func (e *Error) Unwrap() error { return e.Err }

// Run runs git with args in dir and returns its stdout.
func Run(ctx context.Context, dir string, args ...string) ([]byte, error) {
	return RunInput(ctx, dir, nil, args...)
}

// RunInput is Run with stdin.
func RunInput(ctx context.Context, dir string, stdin []byte, args ...string) ([]byte, error) {
	return RunEnv(ctx, dir, nil, stdin, args...)
}

// RunEnv is RunInput with extra environment variables (KEY=value) after Env(), such as
// GIT_INDEX_FILE for a temporary index.
func RunEnv(ctx context.Context, dir string, env []string, stdin []byte, args ...string) ([]byte, error) {
	var in io.Reader
	if stdin != nil {
		in = bytes.NewReader(stdin)
	}
	var out bytes.Buffer
	err := run(ctx, dir, env, in, &out, args)
	return out.Bytes(), err
}

// Stream runs git with args in dir reading stdin (none when nil) and writing its stdout to
// stdout, for output too large to hold in memory, such as a pack.
func Stream(ctx context.Context, dir string, stdin io.Reader, stdout io.Writer, args ...string) error {
	return run(ctx, dir, nil, stdin, stdout, args)
}

func run(ctx context.Context, dir string, env []string, stdin io.Reader, stdout io.Writer, args []string) error {
	cmd := exec.CommandContext(ctx, "git", args...)
	cmd.Dir = dir
	cmd.Env = append(Env(), env...)
	cmd.Stdin = stdin
	errb := &capped{max: maxStderr}
	cmd.Stdout = stdout
	cmd.Stderr = errb
	if err := cmd.Run(); err != nil {
		return &Error{Args: args, Stderr: errb.String(), Err: err}
	}
	return nil
}

// Line runs git and returns its stdout with surrounding space trimmed.
func Line(ctx context.Context, dir string, args ...string) (string, error) {
	out, err := Run(ctx, dir, args...)
	return strings.TrimSpace(string(out)), err
}

type capped struct {
	bytes.Buffer
	max int
}

func (c *capped) Write(p []byte) (int, error) {
	if room := c.max - c.Len(); room > 0 {
		if len(p) > room {
			c.Buffer.Write(p[:room])
		} else {
			c.Buffer.Write(p)
		}
	}
	return len(p), nil
}

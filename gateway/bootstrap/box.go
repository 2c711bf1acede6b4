// Package bootstrap installs the worker bundle on a box, checks the box's hygiene and launches the worker.
package bootstrap

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/openclaw/cloudworkers/gateway/tunnel"
	"github.com/openclaw/cloudworkers/internal/capbuf"
)

// maxOutput bounds what is read back from one box command.
const maxOutput = 1 << 20

// RunResult is the outcome of one command on the box.
type RunResult struct {
	Stdout, Stderr string
	ExitCode       int
}

// Run runs cmd on the box through one exec session; a non-zero exit is not an error (see ExitCode).
// It honours ctx from the first step: a box that never answers the channel open, or a command
// that never ends, makes Run return ctx's error, and closes c (see tunnel.CloseOnDone).
func Run(ctx context.Context, c *ssh.Client, cmd string) (RunResult, error) {
	if err := ctx.Err(); err != nil {
		return RunResult{}, err
	}
	stop := tunnel.CloseOnDone(ctx, c)
	defer stop()
	sess, err := c.NewSession()
	if err != nil {
		if ctx.Err() != nil {
			return RunResult{}, fmt.Errorf("open session: %w", ctx.Err())
		}
		return RunResult{}, fmt.Errorf("open session: %w", err)
	}
	defer sess.Close()
	out, errb := capbuf.New(maxOutput), capbuf.New(64<<10)
	sess.Stdout = out
	sess.Stderr = errb
	done := make(chan error, 1)
	go func() { done <- sess.Run(cmd) }()
	select {
	case <-ctx.Done():
		_ = sess.Signal(ssh.SIGKILL)
		_ = sess.Close()
		return RunResult{}, ctx.Err()
	case err = <-done:
	}
	res := RunResult{Stdout: out.String(), Stderr: errb.String()}
	var ee *ssh.ExitError
	if errors.As(err, &ee) {
		res.ExitCode = ee.ExitStatus()
		return res, nil
	}
	var missing *ssh.ExitMissingError
	if errors.As(err, &missing) {
		return res, exitMissing(ctx, c)
	}
	return res, err
}

// exitMissing says why a command's channel closed without an exit status: the connection to the
// box dropped (it is closed within a second), or the box's SSH server closed the channel itself.
func exitMissing(ctx context.Context, c *ssh.Client) error {
	closed := make(chan error, 1)
	go func() { closed <- c.Wait() }() // ends when c is closed, by the caller at the latest
	t := time.NewTimer(time.Second)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case err := <-closed:
		if err == nil || errors.Is(err, io.EOF) {
			return errors.New("the connection to the box closed before the command ended")
		}
		return fmt.Errorf("the connection to the box dropped before the command ended: %w", err)
	case <-t.C:
		return errors.New("the box closed the command's channel without an exit status")
	}
}

// RunOK runs cmd and fails unless it exits 0, quoting its stderr in the error.
func RunOK(ctx context.Context, c *ssh.Client, what, cmd string) (string, error) {
	res, err := Run(ctx, c, cmd)
	if err != nil {
		return "", fmt.Errorf("%s: %w", what, err)
	}
	if res.ExitCode != 0 {
		msg := strings.TrimSpace(res.Stderr)
		if msg == "" {
			msg = strings.TrimSpace(res.Stdout)
		}
		if len(msg) > 300 {
			msg = msg[:300] + "…"
		}
		return res.Stdout, fmt.Errorf("%s: exit %d: %s", what, res.ExitCode, msg)
	}
	return res.Stdout, nil
}

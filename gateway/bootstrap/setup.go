package bootstrap

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/openclaw/cloudworkers/gateway/envs"
	"github.com/openclaw/cloudworkers/gateway/tunnel"
	"github.com/openclaw/cloudworkers/internal/capbuf"
	"github.com/openclaw/cloudworkers/internal/untrusted"
	"github.com/openclaw/cloudworkers/providers"
)

// setupTailBytes bounds the output kept from one setup step (its tail) before it is sanitized and
// cut to envs.MaxOutputTail for the timeline.
const setupTailBytes = 64 << 10

// setupExitTimeout is the exit status a setup step gets when its timeout killed it.
const setupExitTimeout = 124

// SetupError is a setup step (or the closeNetwork command) that failed: the environment is failed
// with its name and output tail.
type SetupError struct {
	Step     string
	ExitCode int
	Tail     string
	Err      error // set when the step could not run or timed out
}

func (e *SetupError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "setup step %q failed", e.Step)
	switch {
	case e.Err != nil:
		fmt.Fprintf(&b, ": %v", e.Err)
	default:
		fmt.Fprintf(&b, " with exit status %d", e.ExitCode)
	}
	if t := lastLines(e.Tail, 5, 400); t != "" {
		b.WriteString("; output tail: " + t)
	}
	return b.String()
}

func (e *SetupError) Unwrap() error { return e.Err }

// lastLines is the last n lines of s, at most max bytes, joined with " | ".
func lastLines(s string, n, max int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	out := strings.Join(lines, " | ")
	if len(out) > max {
		out = "…" + out[len(out)-max:]
	}
	return out
}

// Setup runs the profile's setup phase on the environment's box, in workdir (the session's box
// workspace), after bootstrap and sync and before the worker takes the session. Each step runs
// with a clean environment (PATH, HOME, LANG only: no gateway credential, no worker descriptor)
// under its timeout; its output tail, exit status and duration are timeline entries. A box whose
// setup already succeeded with the same cache key skips it, and the timeline says so. The
// profile's closeNetwork command runs on the gateway afterwards. A failing step fails the
// environment with the step's name and output tail.
func (b *Bootstrapper) Setup(ctx context.Context, env envs.Environment, workdir string) error {
	key := env.Profile.SetupCacheKey()
	if key == "" {
		return nil
	}
	if env.SetupKey == key {
		b.cfg.Envs.RecordStep(ctx, env.ID, envs.Step{Kind: envs.StepSetup, Name: "setup", StartedAt: b.cfg.Clock.Now(),
			Result: envs.ResultSkipped, Detail: "this box already ran setup with cache key " + key})
		return nil
	}
	release := b.cfg.Envs.Hold(env.ID) // a long setup is activity: the box is not idle meanwhile
	defer release()
	err := b.runSetup(ctx, env, workdir)
	if err == nil {
		err = b.closeNetwork(ctx, env)
	}
	if err != nil {
		var se *SetupError
		if errors.As(err, &se) && ctx.Err() == nil {
			b.cfg.Envs.Fail(context.WithoutCancel(ctx), env.ID, err.Error())
		}
		return err
	}
	return b.cfg.Envs.SetSetupKey(ctx, env.ID, key)
}

func (b *Bootstrapper) runSetup(ctx context.Context, env envs.Environment, workdir string) error {
	steps := env.Profile.Setup.Steps
	if len(steps) == 0 {
		return nil
	}
	c, err := b.Dial(ctx, env)
	if err != nil {
		return fmt.Errorf("setup: ssh %s@%s:%d: %w", env.Lease.SSHUser, env.Lease.SSHHost, env.Lease.SSHPort, err)
	}
	defer c.Close()
	for _, st := range steps {
		timeout := st.Timeout.D()
		if timeout == 0 {
			timeout = providers.DefaultSetupStepTimeout
		}
		start := b.cfg.Clock.Now()
		code, tail, err := runSetupStep(ctx, c, workdir, st.Run, timeout)
		rec := envs.Step{Kind: envs.StepSetup, Name: st.Name, StartedAt: start, DurationMs: b.cfg.Clock.Now().Sub(start).Milliseconds(),
			Result: envs.ResultOK, ExitCode: code, Output: tail}
		var fail *SetupError
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case err != nil:
			fail = &SetupError{Step: st.Name, Tail: tail, Err: err}
		case code == setupExitTimeout:
			fail = &SetupError{Step: st.Name, ExitCode: code, Tail: tail, Err: fmt.Errorf("timed out after %s (setup.steps timeout)", timeout)}
		case code != 0:
			fail = &SetupError{Step: st.Name, ExitCode: code, Tail: tail}
		}
		if fail != nil {
			rec.Result = envs.ResultFailed
			if fail.Err != nil {
				rec.Detail = fail.Err.Error()
			}
			b.cfg.Envs.RecordStep(context.WithoutCancel(ctx), env.ID, rec)
			return fail
		}
		b.cfg.Envs.RecordStep(ctx, env.ID, rec)
	}
	return nil
}

// setupScript is the shell line that runs one setup step: in workdir, with nothing of the SSH
// session's environment, killed when its timeout passes (where the box has timeout(1)).
func setupScript(workdir, run string, timeout time.Duration) string {
	secs := strconv.Itoa(int(timeout.Round(time.Second) / time.Second))
	return `cd ` + untrusted.Quote(workdir) + ` 2>/dev/null || cd "$HOME" || exit 97
T=; command -v timeout >/dev/null 2>&1 && T="timeout -s KILL ` + secs + `"
$T env -i PATH=` + WorkerPath + ` HOME="$HOME" LANG=C.UTF-8 TERM=dumb CI=1 sh -c ` + untrusted.Quote(run) + ` </dev/null 2>&1
s=$?; [ "$s" = 137 ] && [ -n "$T" ] && exit ` + strconv.Itoa(setupExitTimeout) + `; exit $s`
}

// runSetupStep runs one step and returns its exit status and output tail. The gateway's own
// deadline (the timeout and a grace) closes the connection of a box that does not end it.
func runSetupStep(ctx context.Context, c *ssh.Client, workdir, run string, timeout time.Duration) (int, string, error) {
	sctx, cancel := context.WithTimeout(ctx, timeout+30*time.Second)
	defer cancel()
	stop := tunnel.CloseOnDone(sctx, c)
	defer stop()
	sess, err := c.NewSession()
	if err != nil {
		if sctx.Err() != nil {
			err = sctx.Err()
		}
		return 0, "", fmt.Errorf("open session: %w", err)
	}
	defer sess.Close()
	tail := capbuf.NewTail(setupTailBytes)
	sess.Stdout, sess.Stderr = tail, tail
	done := make(chan error, 1)
	go func() { done <- sess.Run(setupScript(workdir, run, timeout)) }()
	select {
	case <-sctx.Done():
		_ = sess.Signal(ssh.SIGKILL)
		_ = sess.Close()
		<-done
		if ctx.Err() != nil {
			return 0, string(tail.Bytes()), ctx.Err()
		}
		return setupExitTimeout, string(tail.Bytes()), nil
	case err = <-done:
	}
	var ee *ssh.ExitError
	switch {
	case err == nil:
		return 0, string(tail.Bytes()), nil
	case errors.As(err, &ee):
		return ee.ExitStatus(), string(tail.Bytes()), nil
	}
	return 0, string(tail.Bytes()), err
}

// closeNetwork runs the profile's setup.closeNetwork argv on the gateway ({leaseId} and {envId}
// expanded) with a clean environment, and records its result. The gateway does not enforce
// egress itself: this command is the provider's.
func (b *Bootstrapper) closeNetwork(ctx context.Context, env envs.Environment) error {
	argv := env.Profile.Setup.CloseNetwork
	if len(argv) == 0 {
		return nil
	}
	expanded := make([]string, len(argv))
	for i, a := range argv {
		expanded[i] = strings.NewReplacer("{leaseId}", env.LeaseID, "{envId}", env.ID).Replace(a)
	}
	cctx, cancel := context.WithTimeout(ctx, b.cfg.CommandTimeout)
	defer cancel()
	start := b.cfg.Clock.Now()
	cmd := exec.CommandContext(cctx, expanded[0], expanded[1:]...)
	cmd.Env = []string{"PATH=" + WorkerPath, "LANG=C.UTF-8"}
	tail := capbuf.NewTail(setupTailBytes)
	cmd.Stdout, cmd.Stderr = tail, tail
	cmd.WaitDelay = 5 * time.Second
	err := cmd.Run()
	rec := envs.Step{Kind: envs.StepCloseNetwork, Name: "closeNetwork", StartedAt: start,
		DurationMs: b.cfg.Clock.Now().Sub(start).Milliseconds(), Result: envs.ResultOK, Output: string(tail.Bytes())}
	if err == nil {
		b.cfg.Envs.RecordStep(ctx, env.ID, rec)
		return nil
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	fail := &SetupError{Step: "closeNetwork", Tail: string(tail.Bytes())}
	var ee *exec.ExitError
	if errors.As(err, &ee) && ee.ExitCode() >= 0 {
		fail.ExitCode = ee.ExitCode()
	} else {
		if cctx.Err() != nil {
			err = fmt.Errorf("timed out after %s (box.commandTimeout)", b.cfg.CommandTimeout)
		}
		fail.Err = err
		rec.Detail = err.Error()
	}
	rec.Result, rec.ExitCode = envs.ResultFailed, fail.ExitCode
	b.cfg.Envs.RecordStep(context.WithoutCancel(ctx), env.ID, rec)
	return fail
}

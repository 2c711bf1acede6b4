package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/openclaw/cloudworkers/gateway/api"
	"github.com/openclaw/cloudworkers/gateway/boxaccess"
	"github.com/openclaw/cloudworkers/gateway/envs"
)

// remoteFailure is the exit code of a box session that ended without an exit status (as ssh's 255).
const remoteFailure = 255

func newEnvSSHCmd(g *globals) *cobra.Command {
	var noTTY bool
	cmd := &cobra.Command{
		Use: "ssh ID",
		Example: `  openclaw env ssh env_123
  openclaw env ssh env_123 < script.sh
  openclaw env ssh -T env_123`,
		Short: "Open a shell on an environment's box through the gateway",
		Long: `Open a shell on an environment's box. The gateway connects to the box with the lease's key and the
host key it pinned; the CLI never sees either. On a terminal the shell is interactive (a pseudo-terminal on
the box, resized with this window); without one (or with -T) the shell reads its commands from stdin. The
session ends when the shell exits, and is closed by the gateway when the environment is destroyed. Each
shell is audited (openclaw audit), its output never is.`,
		Args: cobra.ExactArgs(1),
		RunE: g.withClient(func(ctx context.Context, c *api.Client, args []string) error {
			st := boxaccess.Start{}
			in, _ := stdin.(*os.File)
			var restore func()
			var resize chan [2]int
			if !noTTY && in != nil && isTerminal(in) {
				ws, err := unix.IoctlGetWinsize(int(in.Fd()), unix.TIOCGWINSZ)
				if err != nil {
					return fmt.Errorf("terminal size: %w", err)
				}
				st.TTY, st.Term, st.Rows, st.Cols = true, os.Getenv("TERM"), int(ws.Row), int(ws.Col)
				if !boxaccess.ValidTerm(st.Term) {
					st.Term = "xterm"
				}
				if st.Rows == 0 || st.Cols == 0 {
					st.Rows, st.Cols = 24, 80
				}
				if restore, err = rawMode(in); err != nil {
					return err
				}
				defer restore()
				resize = make(chan [2]int, 1)
				stopWinch := watchWindow(ctx, in, resize)
				defer stopWinch()
			}
			return runBox(ctx, c, args[0], st, api.ExecIO{Stdin: stdin, Stdout: stdout, Stderr: stderr, Resize: resize}, st.TTY)
		}),
	}
	cmd.Flags().BoolVarP(&noTTY, "no-tty", "T", false, "no terminal: the shell reads its commands from stdin even on a terminal")
	return cmd
}

func newEnvExecCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use: "exec ID -- COMMAND [ARG...]",
		Example: `  openclaw env exec env_123 -- uname -a
  openclaw env exec env_123 -- sh -c 'ls ~/.openclaw-worker | wc -l'
  echo hi | openclaw env exec env_123 -- cat`,
		Short: "Run a command on an environment's box; its exit status is the CLI's",
		Long: `Run a command on an environment's box through the gateway. The arguments after -- are passed as they
are (each quoted for the box's shell: use sh -c '...' for pipes and variables). stdin is sent to the
command; its stdout and stderr arrive on this process's stdout and stderr. The CLI exits with the
command's exit code, 128+N when a signal N killed it (named on stderr), and 255 when the box gave no
exit status (refused, connection lost, environment destroyed). The first Ctrl-C sends INT to the
command, a second detaches. Each command is audited (openclaw audit), its output never is.`,
		Args: func(cmd *cobra.Command, args []string) error {
			if cmd.ArgsLenAtDash() != 1 || len(args) < 2 {
				return errors.New("usage: openclaw env exec ID -- COMMAND [ARG...] (the command after --)")
			}
			return nil
		},
		RunE: g.withClient(func(ctx context.Context, c *api.Client, args []string) error {
			return runBox(ctx, c, args[0], boxaccess.Start{Command: args[1:]}, api.ExecIO{Stdin: stdin, Stdout: stdout, Stderr: stderr}, false)
		}),
	}
	return cmd
}

// runBox runs one exec or shell and turns its end into the CLI's exit. Without a terminal, the
// first interrupt is sent to the command as INT and a second detaches; with one, Ctrl-C is a
// byte for the remote terminal (raw mode), so only a signal from outside detaches.
func runBox(ctx context.Context, c *api.Client, id string, st boxaccess.Start, x api.ExecIO, tty bool) error {
	sctx, detach := context.WithCancel(context.WithoutCancel(ctx))
	defer detach()
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)
	send := make(chan string, 1)
	x.Signal = send
	go func() {
		n := 0
		for {
			select {
			case <-sctx.Done():
				return
			case s := <-sigs:
				n++
				if tty || n > 1 || s == syscall.SIGTERM {
					detach()
					return
				}
				fmt.Fprintln(stderr, "\nsent INT to the command (Ctrl-C again to detach)")
				select {
				case send <- "INT":
				default:
				}
			}
		}
	}()
	exit, err := c.Exec(sctx, id, st, x)
	if err != nil {
		if sctx.Err() != nil {
			return &exitError{code: 130, msg: "detached from the box session"}
		}
		var ae *api.Error
		if errors.As(err, &ae) {
			return err
		}
		return &exitError{code: remoteFailure, msg: err.Error()}
	}
	switch {
	case exit.Error != "":
		return &exitError{code: remoteFailure, msg: exit.Error}
	case exit.Signal != "":
		return &exitError{code: 128 + signalNumber(exit.Signal), msg: "the command was killed by signal " + exit.Signal}
	case exit.Code != 0:
		return &exitError{code: exit.Code}
	}
	return nil
}

// signalNumber is the number of an RFC 4254 signal name (15 when unknown).
func signalNumber(name string) int {
	if s := unix.SignalNum("SIG" + name); s != 0 {
		return int(s)
	}
	return int(syscall.SIGTERM)
}

// rawMode puts the terminal in raw mode (as cfmakeraw) and returns what restores it.
func rawMode(f *os.File) (func(), error) {
	fd := int(f.Fd())
	old, err := unix.IoctlGetTermios(fd, unix.TCGETS)
	if err != nil {
		return nil, fmt.Errorf("terminal: %w", err)
	}
	raw := *old
	raw.Iflag &^= unix.IGNBRK | unix.BRKINT | unix.PARMRK | unix.ISTRIP | unix.INLCR | unix.IGNCR | unix.ICRNL | unix.IXON
	raw.Oflag &^= unix.OPOST
	raw.Lflag &^= unix.ECHO | unix.ECHONL | unix.ICANON | unix.ISIG | unix.IEXTEN
	raw.Cflag &^= unix.CSIZE | unix.PARENB
	raw.Cflag |= unix.CS8
	raw.Cc[unix.VMIN], raw.Cc[unix.VTIME] = 1, 0
	if err := unix.IoctlSetTermios(fd, unix.TCSETS, &raw); err != nil {
		return nil, fmt.Errorf("terminal raw mode: %w", err)
	}
	return func() { _ = unix.IoctlSetTermios(fd, unix.TCSETS, old) }, nil
}

// watchWindow sends f's size to resize at each SIGWINCH until the returned stop is called.
func watchWindow(ctx context.Context, f *os.File, resize chan [2]int) (stop func()) {
	winch := make(chan os.Signal, 1)
	signal.Notify(winch, syscall.SIGWINCH)
	wctx, cancel := context.WithCancel(ctx)
	go func() {
		for {
			select {
			case <-wctx.Done():
				return
			case <-winch:
			}
			ws, err := unix.IoctlGetWinsize(int(f.Fd()), unix.TIOCGWINSZ)
			if err != nil || ws.Row == 0 || ws.Col == 0 {
				continue
			}
			select {
			case <-resize: // only the latest size matters
			default:
			}
			resize <- [2]int{int(ws.Row), int(ws.Col)}
		}
	}()
	return func() { signal.Stop(winch); cancel() }
}

func newEnvLogsCmd(g *globals) *cobra.Command {
	var follow bool
	var tail int
	cmd := &cobra.Command{
		Use: "logs ID [-f] [--tail N]",
		Example: `  openclaw env logs env_123
  openclaw env logs env_123 --tail 50
  openclaw env logs env_123 -f`,
		Short: "Print the worker's log on an environment's box",
		Long: `Print the last lines of the worker's log on an environment's box (~/.openclaw-worker/state/<env>/worker.log),
read through the gateway: the last --tail lines, at most boxAccess.logTailBytes. With -f, what the worker
appends is printed as it comes, until Ctrl-C or the environment is destroyed.`,
		Args: cobra.ExactArgs(1),
		RunE: g.withClient(func(ctx context.Context, c *api.Client, args []string) error {
			if tail < 0 || tail > boxaccess.MaxTailLines {
				return fmt.Errorf("--tail must be from 0 to %d lines, got %d", boxaccess.MaxTailLines, tail)
			}
			body, err := c.EnvironmentLogs(ctx, args[0], tail, follow)
			if err != nil {
				return err
			}
			defer body.Close()
			_, err = io.Copy(stdout, body)
			if ctx.Err() != nil {
				return nil // Ctrl-C ends a follow
			}
			if err != nil {
				return fmt.Errorf("log of %s: %w", args[0], err)
			}
			if follow {
				qctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
				defer cancel()
				if v, err := c.Environment(qctx, args[0]); err == nil && !v.State.HasMachine() {
					fmt.Fprintf(stderr, "environment %s is %s: the log ended\n", args[0], v.State)
				}
			}
			return nil
		}),
	}
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "print what the worker appends until Ctrl-C or the environment ends")
	cmd.Flags().IntVar(&tail, "tail", boxaccess.DefaultTailLines, "how many of the last lines to print")
	return cmd
}

func newEnvExtendCmd(g *globals) *cobra.Command {
	var ttl time.Duration
	cmd := &cobra.Command{
		Use: "extend ID --ttl D",
		Example: `  openclaw env extend env_123 --ttl 2h
  openclaw env extend env_123 --ttl 30m -o json`,
		Short: "Renew an environment's lease for a duration from now",
		Long: `Renew an environment's lease for --ttl from now: the provider's renew runs first (a lease CLI's renew
command gets the duration as {ttl}); when it succeeds, the environment's ttl deadline moves to at least
now+D and the lease expiry the provider reports is stored (both in openclaw env show). A provider that
cannot renew, a bad duration or one above boxAccess.maxExtend is refused before anything changes.`,
		Args: cobra.ExactArgs(1),
		RunE: g.withClient(func(ctx context.Context, c *api.Client, args []string) error {
			if ttl <= 0 {
				return fmt.Errorf("--ttl must be a positive duration such as 2h or 30m, got %s", ttl)
			}
			e, err := c.ExtendEnvironment(ctx, args[0], ttl.String())
			if err != nil {
				return err
			}
			return printResult(g, e, extendLine(e, ttl))
		}),
	}
	cmd.Flags().DurationVar(&ttl, "ttl", 0, "how long from now to renew the lease for (2h, 30m)")
	_ = cmd.MarkFlagRequired("ttl")
	addOutput(cmd, g)
	return cmd
}

// extendLine says what an extension changed.
func extendLine(e envs.Environment, ttl time.Duration) string {
	parts := []string{fmt.Sprintf("environment %s renewed for %s", e.ID, ttl)}
	if !e.Lease.ExpiresAt.IsZero() {
		parts = append(parts, "lease expires "+e.Lease.ExpiresAt.Local().Format(time.RFC3339))
	}
	if !e.TTLDeadline.IsZero() {
		parts = append(parts, "ttl deadline "+e.TTLDeadline.Local().Format(time.RFC3339))
	}
	return strings.Join(parts, "; ")
}

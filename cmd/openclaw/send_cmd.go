package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sync/atomic"
	"time"

	"github.com/spf13/cobra"

	"github.com/openclaw/cloudworkers/cmd/openclaw/internal/console"
	"github.com/openclaw/cloudworkers/gateway/api"
	"github.com/openclaw/cloudworkers/gateway/turns"
	"github.com/openclaw/cloudworkers/protocol"
)

// maxMessageBytes bounds a message read from stdin or --file (the gateway's own bound is the
// same: a larger message is refused with 413 too-large).
const maxMessageBytes = 1 << 20

func newSessionSendCmd(g *globals) *cobra.Command {
	var follow, thinking bool
	var key, file string
	cmd := &cobra.Command{
		Use:   "send ID (TEXT | - | --file F) [--follow]",
		Short: "Send a message: starts a turn of the session",
		Long: `Send a message to a session; the gateway admits one turn at a time per session (stop a running
one with session cancel). The message is TEXT, or read from stdin with -, or from a file with
--file (no argv limit; at most 1 MiB). With --follow the reply (stdout) and tool activity (stderr)
stream to the terminal, and the command exits with the turn's outcome: 0 when the turn ended, 1
when it failed. Ctrl-C while following asks the gateway to cancel the turn and waits for it to
stop (exit 130); a second Ctrl-C detaches at once, leaving the turn to the gateway.`,
		Example: `  openclaw session send ses_123 "add a test for the parser" --follow
  git diff | openclaw session send ses_123 - --follow
  openclaw session send ses_123 --file prompt.md`,
		Args: cobra.RangeArgs(1, 2),
		RunE: g.withClient(func(ctx context.Context, c *api.Client, args []string) error {
			text, err := messageText(args, file)
			if err != nil {
				return err
			}
			t, err := c.SendMessage(ctx, args[0], turns.SendRequest{Text: text, IdempotencyKey: key})
			if err != nil {
				return err
			}
			if !follow {
				return printResult(g, t, t.RunID)
			}
			return followTurn(ctx, g, args[0], t, thinking)
		}),
	}
	f := cmd.Flags()
	f.BoolVar(&follow, "follow", false, "stream the reply and tool activity until the turn ends")
	f.BoolVar(&thinking, "thinking", false, "with --follow, also print thinking (stderr)")
	f.StringVar(&key, "idempotency-key", "", "a repeated key returns the turn it started instead of starting another")
	f.StringVarP(&file, "file", "f", "", "read the message from this file")
	addOutput(cmd, g)
	return cmd
}

// messageText is the message of `session send`: TEXT, stdin for "-", or --file.
func messageText(args []string, file string) (string, error) {
	var r io.Reader
	switch {
	case file != "" && len(args) == 2:
		return "", errors.New("give the message once: TEXT (or - for stdin) or --file F, not both")
	case file != "":
		f, err := os.Open(file)
		if err != nil {
			return "", fmt.Errorf("--file: %w", err)
		}
		defer f.Close()
		r = f
	case len(args) == 1:
		return "", errors.New("no message: give TEXT, - (read stdin) or --file F")
	case args[1] == "-":
		r = stdin
	default:
		return args[1], nil
	}
	b, err := io.ReadAll(io.LimitReader(r, maxMessageBytes+1))
	if err != nil {
		return "", fmt.Errorf("read message: %w", err)
	}
	if len(b) > maxMessageBytes {
		return "", fmt.Errorf("message is larger than %d bytes", maxMessageBytes)
	}
	if len(b) == 0 {
		return "", errors.New("message is empty")
	}
	return string(b), nil
}

// followTurn streams a turn until it ends. The first interrupt asks the gateway to cancel the
// turn and keeps following until it stops; a second detaches at once.
func followTurn(ctx context.Context, g *globals, sessionID string, t turns.Turn, thinking bool) error {
	c, err := g.client()
	if err != nil {
		return err
	}
	fctx, detach := context.WithCancel(context.WithoutCancel(ctx))
	defer detach()
	sig := make(chan os.Signal, 2)
	signal.Notify(sig, os.Interrupt)
	defer signal.Stop(sig)
	var canceled atomic.Bool
	go func() {
		n := 0
		for {
			select {
			case <-fctx.Done():
				return
			case <-sig:
			}
			n++
			if n > 1 {
				fmt.Fprintf(stderr, "\ndetached; turn %s goes on in the gateway (see openclaw session watch %s)\n", t.RunID, sessionID)
				detach()
				return
			}
			canceled.Store(true)
			fmt.Fprintf(stderr, "\ncanceling turn %s (Ctrl-C again to detach without waiting)\n", t.RunID)
			cctx, cancel := context.WithTimeout(fctx, 10*time.Second)
			if _, err := c.CancelTurn(cctx, sessionID); err != nil {
				fmt.Fprintf(stderr, "cancel: %v\n", err)
			}
			cancel()
		}
	}()
	p := &console.Printer{Out: stdout, Info: stderr, Thinking: thinking, JSONLines: g.asJSON()}
	outcome, err := p.FollowTurn(fctx, c, sessionID, t.RunID, t.Cursor, nil)
	if err != nil {
		if fctx.Err() != nil {
			return &exitError{code: 130}
		}
		return err
	}
	// The turn's last event can come before the gateway has recorded its end: return once it
	// has, so the next message is admitted at once (the session is free before its turn reads
	// as ended).
	for i := 0; i < 600; i++ {
		if tt, err := c.Turn(fctx, t.RunID); err != nil || !tt.Status.Ongoing() {
			break
		}
		select {
		case <-fctx.Done():
		case <-time.After(50 * time.Millisecond):
		}
	}
	detach()
	if outcome.Event.Type == protocol.LiveLifecycleError {
		if canceled.Load() {
			return &exitError{code: 130, msg: "turn canceled: " + outcome.Event.Error}
		}
		return &exitError{code: 1, msg: "turn failed: " + outcome.Event.Error}
	}
	return nil
}

func newSessionCancelCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:     "cancel ID",
		Short:   "Stop the turn a session is running",
		Long:    `Ask the gateway to stop the session's running turn (on the gateway or on its worker). It reports whether a turn was running.`,
		Example: "  openclaw session cancel ses_123",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			ok, err := c.CancelTurn(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			line := fmt.Sprintf("session %s: turn canceled", args[0])
			if !ok {
				line = fmt.Sprintf("session %s: no turn running", args[0])
			}
			return printResult(g, map[string]bool{"canceled": ok}, line)
		},
	}
	addOutput(cmd, g)
	return cmd
}

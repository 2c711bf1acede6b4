package main

import (
	"context"

	"github.com/spf13/cobra"

	"github.com/openclaw/cloudworkers/gateway/api"
	"github.com/openclaw/cloudworkers/gateway/turns"
	"github.com/openclaw/cloudworkers/internal/console"
	"github.com/openclaw/cloudworkers/protocol"
)

func newSessionSendCmd(g *globals) *cobra.Command {
	var follow, thinking bool
	var key string
	cmd := &cobra.Command{
		Use:   "send ID TEXT [--follow]",
		Short: "Send a message: starts a turn of the session",
		Long: `Send a message to a session; the gateway admits one turn at a time per session. With --follow
the reply (stdout) and tool activity (stderr) stream to the terminal, and the command exits with the
turn's outcome: 0 when the turn ended, 1 when it failed.`,
		Args: cobra.ExactArgs(2),
		RunE: g.withClient(func(ctx context.Context, c *api.Client, args []string) error {
			t, err := c.SendMessage(ctx, args[0], turns.SendRequest{Text: args[1], IdempotencyKey: key})
			if err != nil {
				return err
			}
			if !follow {
				return printResult(g, t, t.RunID)
			}
			p := &console.Printer{Out: stdout, Info: stderr, Thinking: thinking}
			outcome, err := p.FollowTurn(ctx, c, args[0], t.RunID, t.Cursor, nil)
			if err != nil {
				return err
			}
			if outcome.Event.Type == protocol.LiveLifecycleError {
				return &exitError{code: 1, msg: "turn failed: " + outcome.Event.Error}
			}
			return nil
		}),
	}
	f := cmd.Flags()
	f.BoolVar(&follow, "follow", false, "stream the reply and tool activity until the turn ends")
	f.BoolVar(&thinking, "thinking", false, "with --follow, also print thinking (stderr)")
	f.StringVar(&key, "idempotency-key", "", "a repeated key returns the turn it started instead of starting another")
	addOutput(cmd, g)
	return cmd
}

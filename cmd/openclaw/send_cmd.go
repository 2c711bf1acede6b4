package main

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"

	"github.com/coder/websocket"
	"github.com/spf13/cobra"

	"github.com/openclaw/cloudworkers/gateway/sessions"
	"github.com/openclaw/cloudworkers/gateway/turns"
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
		RunE: func(cmd *cobra.Command, args []string) error {
			asJSON, err := g.json()
			if err != nil {
				return err
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			var t turns.Turn
			if _, err := c.Do(ctx, http.MethodPost, "/api/v1/sessions/"+url.PathEscape(args[0])+"/messages",
				turns.SendRequest{Text: args[1], IdempotencyKey: key}, &t); err != nil {
				return err
			}
			if !follow {
				if asJSON {
					return printJSON(stdout, t)
				}
				fmt.Fprintf(stdout, "%s\n", t.RunID)
				return nil
			}
			p := &livePrinter{out: stdout, info: stderr, thinking: thinking}
			cursor := t.Cursor
			var outcome *sessions.LiveRecord
			until := func(r *sessions.LiveRecord) bool {
				if r.RunID == t.RunID && (r.Event.Type == sessions.LiveLifecycleEnd || r.Event.Type == sessions.LiveLifecycleError) {
					outcome = r
					return true
				}
				return false
			}
			for outcome == nil {
				err := watchOnce(ctx, c, args[0], &cursor, p, until)
				var ce websocket.CloseError
				if errors.As(err, &ce) && ce.Code == websocket.StatusTryAgainLater {
					continue
				}
				if err != nil {
					return err
				}
			}
			if outcome.Event.Type == sessions.LiveLifecycleError {
				return &exitError{code: 1, msg: "turn failed: " + outcome.Event.Error}
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.BoolVar(&follow, "follow", false, "stream the reply and tool activity until the turn ends")
	f.BoolVar(&thinking, "thinking", false, "with --follow, also print thinking (stderr)")
	f.StringVar(&key, "idempotency-key", "", "a repeated key returns the turn it started instead of starting another")
	addOutput(cmd, g)
	return cmd
}

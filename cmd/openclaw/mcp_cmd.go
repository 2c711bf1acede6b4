package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/spf13/cobra"

	"github.com/openclaw/cloudworkers/gateway/api"
	"github.com/openclaw/cloudworkers/gateway/mcp"
)

func newMCPCmd(g *globals) *cobra.Command {
	var cfg mcp.Config
	var logLevel string
	cmd := &cobra.Command{
		Use: "mcp",
		Example: `  openclaw mcp --profile local
  claude mcp add openclaw -- openclaw mcp`,
		Short: "Serve cloud workers to an MCP client (Claude Code, Codex CLI, Cursor) over stdio",
		Long: `Run an MCP server on stdin/stdout for an agent we did not write. Its tools (dispatch, status, send,
pullback, list_sessions, list_environments, destroy_environment) drive a running gateway's API at
--gateway with the token of --data-dir, like the other CLI commands. Add it to a client as
{"command": "openclaw", "args": ["mcp"]}. The gateway also serves the same tools over streamable
HTTP at /mcp (see openclaw mcp token). Logs go to stderr.`,
		Args: cobra.NoArgs,
		RunE: g.withClient(func(ctx context.Context, c *api.Client, _ []string) error {
			var lvl slog.Level
			if err := lvl.UnmarshalText([]byte(logLevel)); err != nil {
				return fmt.Errorf("--log-level: %w", err)
			}
			cfg.Client = c
			cfg.Log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lvl}))
			srv, err := mcp.New(cfg)
			if err != nil {
				return err
			}
			err = srv.Run(ctx, &sdk.StdioTransport{})
			if err == nil || errors.Is(err, io.EOF) || errors.Is(err, context.Canceled) {
				return nil // the client left, or we were told to stop
			}
			return err
		}),
	}
	f := cmd.Flags()
	f.StringVar(&cfg.DefaultProfile, "profile", "", "worker profile of a dispatch that names none (default: dispatch requires one)")
	f.IntVar(&cfg.MaxBackground, "max-background", mcp.DefaultMaxBackground, "dispatches with wait: false followed at once")
	f.DurationVar(&cfg.CallTimeout, "call-timeout", mcp.DefaultCallTimeout, "bound of one waiting tool call (dispatch, send, pullback)")
	f.Int64Var(&cfg.MaxResourceBytes, "max-resource-bytes", mcp.DefaultMaxResourceBytes, "bound of one resource read (transcript, diff)")
	f.IntVar(&cfg.MaxAnswerBytes, "max-answer-bytes", mcp.DefaultMaxAnswerBytes, "bound of the answer a tool result carries (the transcript resource has it all)")
	f.StringVar(&logLevel, "log-level", "warn", "log level on stderr: debug, info, warn, error")
	cmd.AddCommand(newMCPTokenCmd(g))
	return cmd
}

func newMCPTokenCmd(g *globals) *cobra.Command {
	return tokenCmd(g, "mcp", "Print (creating it on first use) the token that opens the gateway's /mcp endpoint",
		`Print the MCP token of the gateway's data dir (<data-dir>/`+mcp.TokenFile+`, mode 0600), creating it when
missing. The token opens the gateway's streamable-HTTP MCP endpoint /mcp and nothing else: an MCP
client holding it can use the MCP tools (dispatch and follow sessions, list sessions and environments,
destroy environments) but cannot reach /api/v1 (profiles, credentials, audit) or sign in to the
Control UI. --rotate replaces it; the old token stops working at once, with no gateway restart.`,
		"replace the token (the old one stops working)",
		func(dir string, rotate bool) (string, error) {
			if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
				return "", fmt.Errorf("data dir %s: not a directory (start the gateway with --data-dir %s first, or pass --data-dir)", dir, dir)
			}
			return mcp.EnsureToken(dir, rotate)
		})
}

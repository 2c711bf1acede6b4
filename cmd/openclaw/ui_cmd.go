package main

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/openclaw/cloudworkers/gateway/api"
)

func newUICmd(g *globals) *cobra.Command {
	var open bool
	var openclawPath string
	cmd := &cobra.Command{
		Use: "ui [--open] [--openclaw]",
		Example: `  openclaw ui
  openclaw ui --open
  openclaw ui --openclaw          # OpenClaw's own Control UI (config controlUi.openclawRoot)
  openclaw ui sessions
  openclaw ui sessions --revoke bs_0123456789abcdef`,
		Short: "Print (or open) a one-time sign-in link of the Control UI",
		Long: `Print a one-time sign-in link of the Control UI, http://<gateway>/login?code=<code>. The gateway
mints the code for the operator token this command holds: 256 random bits, stored hashed, valid two
minutes and only once. Visiting the link starts a browser session (a random id in an HttpOnly,
SameSite=Strict cookie, Secure over TLS) and leaves the code out of the address bar; the operator
token never appears in a URL. With --open the link is opened in the desktop's browser ($BROWSER,
else xdg-open or open). ` + "`openclaw ui sessions`" + ` lists the browser sessions. With --openclaw the
link signs in and continues to OpenClaw's own Control UI, which the gateway serves at /openclaw/ when
its config names an installed openclaw package (controlUi.openclawRoot; docs/openclaw-clients.md).`,
		Args: cobra.NoArgs,
		RunE: g.withClient(func(ctx context.Context, c *api.Client, _ []string) error {
			code, err := c.MintSignInCode(ctx)
			if err != nil {
				return fmt.Errorf("gateway at %s: %w", c.BaseURL, err)
			}
			link := c.BaseURL + code.Path
			if cmd := cmdFlag(openclawPath); cmd != "" {
				link += "&next=" + url.QueryEscape(cmd+"/")
			}
			fmt.Fprintln(stdout, link)
			if open {
				return openBrowser(link)
			}
			return nil
		}),
	}
	cmd.Flags().BoolVar(&open, "open", false, "open the link in the desktop's browser")
	cmd.Flags().StringVar(&openclawPath, "openclaw", "", "continue to OpenClaw's own Control UI at this base path after sign-in")
	cmd.Flags().Lookup("openclaw").NoOptDefVal = "/openclaw"
	cmd.AddCommand(newUISessionsCmd(g))
	return cmd
}

// cmdFlag is the --openclaw base path, cleaned ("" when not given).
func cmdFlag(p string) string {
	p = strings.TrimRight(p, "/")
	if p != "" && !strings.HasPrefix(p, "/") {
		p = "/" + p
	}
	return p
}

func newUISessionsCmd(g *globals) *cobra.Command {
	var revoke string
	cmd := &cobra.Command{
		Use: "sessions [--revoke ID]",
		Example: `  openclaw ui sessions
  openclaw ui sessions -o json
  openclaw ui sessions --revoke bs_0123456789abcdef`,
		Short: "List the Control UI's browser sessions, or end one",
		Long: `List the Control UI's browser sessions, newest first: the live ones and those that ended in the
last day, with their state (active, idle, expired, revoked), when they signed in, their last request,
when they end and from where. --revoke ID ends one at once: its cookie gets 401 from then on. A
session also ends on "Sign out", after ui.sessionIdle without a request (default 12h), after
ui.sessionLifetime (default 7 days) and when the operator token changes.`,
		Args: cobra.NoArgs,
		RunE: g.withClient(func(ctx context.Context, c *api.Client, _ []string) error {
			if revoke != "" {
				s, err := c.RevokeBrowserSession(ctx, revoke)
				if err != nil {
					return err
				}
				return printResult(g, s, fmt.Sprintf("browser session %s %s", s.ID, s.State))
			}
			ss, err := c.BrowserSessions(ctx)
			if err != nil {
				return err
			}
			return printList(g, ss, []string{"ID", "STATE", "SIGNED IN", "LAST SEEN", "ENDS", "REMOTE", "REASON"},
				func(s api.BrowserSession) []string {
					ends := s.IdleExpiresAt
					return []string{s.ID, s.State, s.CreatedAt.Local().Format(time.DateTime), s.LastSeenAt.Local().Format(time.DateTime),
						ends.Local().Format(time.DateTime), dash(s.Remote), dash(s.RevokedReason)}
				})
		}),
	}
	cmd.Flags().StringVar(&revoke, "revoke", "", "end the browser session with this id")
	addOutput(cmd, g)
	return cmd
}

func openBrowser(link string) error {
	var cmd *exec.Cmd
	switch b := os.Getenv("BROWSER"); {
	case b != "":
		cmd = exec.Command(b, link)
	case runtime.GOOS == "darwin":
		cmd = exec.Command("open", link)
	default:
		cmd = exec.Command("xdg-open", link)
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("open a browser (%s): %w; open the link above by hand", cmd.Path, err)
	}
	go func() { _ = cmd.Wait() }()
	return nil
}

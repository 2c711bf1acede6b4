package main

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"runtime"

	"github.com/spf13/cobra"

	"github.com/openclaw/cloudworkers/gateway/api"
)

func newUICmd(g *globals) *cobra.Command {
	var open bool
	cmd := &cobra.Command{
		Use: "ui [--open]",
		Example: `  openclaw ui
  openclaw ui --open`,
		Short: "Print (or open) the Control UI's sign-in link",
		Long: `Print the Control UI's sign-in link, http://<gateway>/login?token=<token>. Visiting it exchanges
the operator token for a session cookie and leaves the token out of the address bar. The gateway
is asked first, so a printed link is one that works. With --open the link is opened in the
desktop's browser ($BROWSER, else xdg-open or open).`,
		Args: cobra.NoArgs,
		RunE: g.withClient(func(ctx context.Context, c *api.Client, _ []string) error {
			if _, err := c.Gateway(ctx); err != nil {
				return fmt.Errorf("gateway at %s: %w", c.BaseURL, err)
			}
			link := loginURL(c.BaseURL, c.Token)
			fmt.Fprintln(stdout, link)
			if open {
				return openBrowser(link)
			}
			return nil
		}),
	}
	cmd.Flags().BoolVar(&open, "open", false, "open the link in the desktop's browser")
	return cmd
}

// loginURL is the Control UI's sign-in link for a gateway base URL and its token.
func loginURL(base, token string) string {
	return base + "/login?token=" + url.QueryEscape(token)
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

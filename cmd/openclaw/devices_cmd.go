package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/openclaw/cloudworkers/gateway/api"
	"github.com/openclaw/cloudworkers/gateway/openclaw"
)

func newDevicesCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "devices",
		Short: "List or revoke the devices of OpenClaw's own clients",
		Long: `OpenClaw's own clients (its Control UI, openclaw tui, openclaw-node) may send a signed device identity.
A device that connects with the operator token is issued a device token of its own, for the scopes it
was granted; it connects with that token afterwards. These commands list those devices and revoke
one: its token stops working at once and its open connections are closed (docs/openclaw-clients.md).`,
		Example: `  openclaw devices list
  openclaw devices list -o json
  openclaw devices revoke 3f1c…`,
	}
	cmd.AddCommand(&cobra.Command{
		Use:     "list",
		Short:   "List the devices, seen most recently first",
		Example: "  openclaw devices list\n  openclaw devices list -o json",
		Args:    cobra.NoArgs,
		RunE: g.withClient(func(ctx context.Context, c *api.Client, _ []string) error {
			list, err := c.OpenClawDevices(ctx)
			if err != nil {
				return err
			}
			return printList(g, list, []string{"ID", "CLIENT", "MODE", "PLATFORM", "SCOPES", "LAST SEEN", "REVOKED"},
				func(d openclaw.Device) []string {
					revoked := "-"
					if !d.RevokedAt.IsZero() {
						revoked = d.RevokedAt.Local().Format(time.DateTime)
					}
					return []string{d.ID, d.ClientID, d.ClientMode, dash(d.Platform), strings.Join(d.Scopes, ","),
						d.LastSeenAt.Local().Format(time.DateTime), revoked}
				})
		}),
	})
	cmd.AddCommand(&cobra.Command{
		Use:     "revoke ID",
		Short:   "Revoke a device's token and close its connections",
		Example: "  openclaw devices revoke 3f1c0d…",
		Args:    cobra.ExactArgs(1),
		RunE: g.withClient(func(ctx context.Context, c *api.Client, args []string) error {
			d, err := c.RevokeOpenClawDevice(ctx, args[0])
			if err != nil {
				return err
			}
			return printResult(g, d, fmt.Sprintf("device %s revoked", d.ID))
		}),
	})
	return cmd
}

package main

import (
	"context"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/openclaw/cloudworkers/providers/local"
)

// newLocalboxCmd returns `openclaw localbox`, the built-in development machine.
func newLocalboxCmd() *cobra.Command {
	var (
		dir, leaseID, listen string
		labels               []string
	)
	cmd := &cobra.Command{
		Use:     "localbox",
		Example: `  openclaw localbox --dir /tmp/box --lease-id dev-box`,
		Short:   "Run the built-in development machine (an SSH server rooted in a directory)",
		Long: `localbox is the built-in development machine: an SSH server that serves one box directory,
which is the box user's HOME and the working directory of every command.

It accepts public-key logins for the current user with the key in <dir>/.localbox/client_ed25519
only, runs exec requests under /bin/sh -c with a clean environment, serves interactive shells on a
pseudo-terminal (pty-req, shell, window-change; terminal name and size checked), the SFTP subsystem and
forwards unix sockets for the gateway (streamlocal-forward@openssh.com). It writes
<dir>/.localbox/state.json (pid, port, pinned host key, client key path, labels) once it listens.

The local provider starts it as its own detached process, so a box outlives a gateway restart like
a real machine. It stops on SIGTERM or when its directory is removed. You rarely run it by hand.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			lbls, err := local.ParseLabels(labels)
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			if ctx == nil {
				ctx = context.Background()
			}
			ctx, stop := signal.NotifyContext(ctx, syscall.SIGTERM, os.Interrupt)
			defer stop()
			log := slog.New(slog.NewTextHandler(os.Stderr, nil)).With("subsystem", "localbox")
			return local.Serve(ctx, local.BoxConfig{
				Dir:     dir,
				LeaseID: leaseID,
				Labels:  lbls,
				Listen:  listen,
				Logger:  log,
			})
		},
	}
	f := cmd.Flags()
	f.StringVar(&dir, "dir", "", "box directory (HOME of the box user), e.g. <data-dir>/boxes/<lease-id>")
	f.StringVar(&leaseID, "lease-id", "", "lease id of the box (default: base name of --dir)")
	f.StringArrayVar(&labels, "label", nil, "label key=value recorded in the box state (repeatable)")
	f.StringVar(&listen, "listen", local.DefaultListen, "TCP address to serve SSH on")
	_ = cmd.MarkFlagRequired("dir")
	return cmd
}

package main

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/openclaw/cloudworkers/internal/dirwatch"
	"github.com/openclaw/cloudworkers/internal/version"
	"github.com/openclaw/cloudworkers/protocol"
	"github.com/openclaw/cloudworkers/worker/remote"
	"github.com/openclaw/cloudworkers/worker/tools"
	"github.com/openclaw/cloudworkers/worker/turnrun"
)

// maxDescriptorBytes bounds the launch descriptor.
const maxDescriptorBytes = 64 << 10

func newWorkerCmd() *cobra.Command {
	var descriptorPath, logPath string
	var logMax int64
	cmd := &cobra.Command{
		Use:     "worker",
		Example: `  openclaw worker --help`,
		Short:   "Run as a worker on a box (started by the gateway; never by hand in production)",
		Long: `openclaw worker is the box side of a cloud worker. The gateway pushes this binary to a
leased machine and starts it there; it is never started by hand in production.

It reads a JSON launch descriptor (at most 64 KiB) from stdin, or from --descriptor FILE, which
must not be readable by anyone but its owner (mode 0600 or narrower):

  {"environmentId", "credential", "ownerEpoch", "bundleHash", "socketPath", "stateDir", "version"}

It then connects to the gateway through the tunnelled unix socket at socketPath, presents its
credential and the sha256 of its own executable, and stays connected, reconnecting after tunnel
drops, until the gateway tells it to shut down. It runs the turns the gateway assigns
(worker.turn.start), one at a time, with its tools on this box and every model call proxied
through the gateway. It exits non-zero when admission is refused.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			d, err := readDescriptor(cmd.InOrStdin(), descriptorPath)
			if err != nil {
				return err
			}
			if err := os.MkdirAll(d.StateDir, 0o700); err != nil {
				return fmt.Errorf("create state dir: %w", err)
			}
			var logw io.Writer = cmd.ErrOrStderr()
			if logPath != "" {
				lf, err := remote.OpenLogFile(logPath, logMax)
				if err != nil {
					return fmt.Errorf("open log file: %w", err)
				}
				defer lf.Close()
				logw = lf
			}
			log := slog.New(slog.NewTextHandler(logw, nil)).With("env", d.EnvironmentID)
			log.Info("worker starting", "pid", os.Getpid(), "socket", d.SocketPath)
			_, sum, err := version.ExecutableSHA256()
			if err != nil {
				return fmt.Errorf("hash own executable: %w", err)
			}
			if d.BundleHash != "" && d.BundleHash != sum {
				// The gateway decides (and audits) the mismatch; say it here too for the box's log.
				log.Warn("this executable is not the bundle the gateway pushed", "expected", d.BundleHash, "actual", sum)
			}
			// The worker's key, made now and kept in memory only: the gateway binds the credential
			// to it at the first admission, so a copy of the credential alone admits nothing.
			_, key, err := ed25519.GenerateKey(nil)
			if err != nil {
				return fmt.Errorf("worker key: %w", err)
			}
			// The worker goes away with its box: when its state dir is removed (the environment was
			// destroyed) it stops instead of retrying forever.
			ctx, cancel := context.WithCancel(cmd.Context())
			defer cancel()
			go func() {
				if dirwatch.Gone(ctx, d.StateDir, 2*time.Second) {
					log.Info("state dir removed; stopping")
					cancel()
				}
			}()
			rcfg := remote.Config{
				SocketPath:    d.SocketPath,
				EnvironmentID: d.EnvironmentID,
				Credential:    d.Credential,
				Latest:        remote.NewSecret(d.Credential), // shared with the per-turn clients
				OwnerEpoch:    d.OwnerEpoch,
				BundleHash:    sum,
				Tools:         tools.Manifest(),
				Key:           key,
				Version:       version.Version,
				Log:           log,
			}
			// Turns the gateway assigns (worker.turn.start) run here, one at a time; each opens its own
			// connection for its session.
			exec := turnrun.New(turnrun.Config{Remote: rcfg, StateDir: d.StateDir, Log: log})
			defer exec.Close()
			rcfg.Handler = exec.Handle
			err = remote.Run(ctx, rcfg)
			if errors.Is(err, context.Canceled) {
				log.Info("worker stopped")
				return nil // told to stop (signal, or the box is being torn down)
			}
			if err != nil {
				log.Error("worker exiting", "err", err)
			} else {
				log.Info("worker shut down by the gateway")
			}
			return err
		},
	}
	cmd.Flags().StringVar(&descriptorPath, "descriptor", "", "read the launch descriptor from FILE (mode 0600) instead of stdin")
	cmd.Flags().StringVar(&logPath, "log-file", "", "write logs to FILE (bounded by --log-max-bytes, rotated once to FILE.1) instead of stderr")
	cmd.Flags().Int64Var(&logMax, "log-max-bytes", 4<<20, "size bound of --log-file")
	// Box-side halves of workspace sync, run by the gateway over the sync connection.
	cmd.AddCommand(newUnpackCmd(), newFeedCmd(), newPackCmd(), newManifestCmd())
	return cmd
}

// readDescriptor reads and strictly decodes the launch descriptor from path, or stdin when path is "".
func readDescriptor(stdin io.Reader, path string) (*protocol.LaunchDescriptor, error) {
	r := stdin
	if path != "" {
		f, err := os.Open(path)
		if err != nil {
			return nil, fmt.Errorf("open launch descriptor: %w", err)
		}
		defer f.Close()
		fi, err := f.Stat()
		if err != nil {
			return nil, fmt.Errorf("stat launch descriptor: %w", err)
		}
		if !fi.Mode().IsRegular() {
			return nil, fmt.Errorf("launch descriptor %s is not a regular file", path)
		}
		if fi.Mode().Perm()&^0o600 != 0 {
			return nil, fmt.Errorf("launch descriptor %s has mode %v: it holds a credential and must be 0600", path, fi.Mode().Perm())
		}
		r = f
	}
	b, err := io.ReadAll(io.LimitReader(r, maxDescriptorBytes+1))
	if err != nil {
		return nil, fmt.Errorf("read launch descriptor: %w", err)
	}
	if len(b) > maxDescriptorBytes {
		return nil, fmt.Errorf("launch descriptor larger than %d bytes", maxDescriptorBytes)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var d protocol.LaunchDescriptor
	if err := dec.Decode(&d); err != nil {
		return nil, fmt.Errorf("decode launch descriptor: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("decode launch descriptor: trailing data")
	}
	if err := d.Validate(); err != nil {
		return nil, err
	}
	return &d, nil
}

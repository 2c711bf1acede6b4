package main

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/openclaw/cloudworkers/gateway"
)

func newGatewayCmd(g *globals) *cobra.Command {
	var configPath string
	var devLocalBox bool
	var cfg gateway.Config
	cmd := &cobra.Command{
		Use: "gateway",
		Example: `  openclaw gateway
  openclaw gateway --listen 127.0.0.1:7421 --data-dir /srv/openclaw --config gateway.yaml
  openclaw gateway --dev-local-box      # with the development-only local box as profile "local"`,
		Short: "Run the gateway daemon",
		Long: `Run the gateway daemon: the HTTP API under /api/v1, /healthz, /readyz and /metrics (with the token;
metricsListen serves it without), the environment state machine with restart reconciliation and
the periodic orphan sweep. Requests whose Host is not an IP literal, localhost or one of
allowedHosts are refused with 421. With tls.cert and tls.key (--tls-cert, --tls-key) the listener
serves TLS, and SIGHUP reads the certificate again; a listener on a non-loopback address without
TLS is logged at WARN when the gateway starts.

A fresh gateway has no worker profile: sessions run on the gateway until the operator adds one
(openclaw profile apply, or profiles: in the config). --dev-local-box adds the profile "local", the
built-in local box: workers on this machine, as this user, without isolation (development only).

Configuration is read from defaults, then the YAML file given with --config, then flags.
The data dir (mode 0700) holds gateway.db (SQLite, 0600), gateway.token (the API bearer token,
0600) and gateway.lock; a second gateway on the same data dir refuses to start.

Example:
  openclaw gateway --data-dir ~/.local/state/openclaw-gateway --listen 127.0.0.1:7420`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var file gateway.Config
			if configPath != "" {
				if err := gateway.LoadConfigFile(configPath, &file); err != nil {
					return err
				}
			}
			f := cmd.Flags()
			if g.dataDir != "" {
				file.DataDir = g.dataDir
			}
			if f.Changed("listen") {
				file.Listen = cfg.Listen
			}
			if f.Changed("log-format") {
				file.LogFormat = cfg.LogFormat
			}
			if f.Changed("log-level") {
				file.LogLevel = cfg.LogLevel
			}
			if f.Changed("tls-cert") {
				file.TLS.Cert = cfg.TLS.Cert
			}
			if f.Changed("tls-key") {
				file.TLS.Key = cfg.TLS.Key
			}
			file.SetDefaults()
			if err := file.Validate(); err != nil {
				return fmt.Errorf("config: %w", err)
			}
			log := newLogger(os.Stderr, file.LogFormat, file.LogLevel)
			return gateway.Run(cmd.Context(), file, gatewayDeps(log, devLocalBox))
		},
	}
	f := cmd.Flags()
	f.StringVar(&configPath, "config", "", "YAML config file")
	f.StringVar(&cfg.Listen, "listen", gateway.DefaultListen, "HTTP listen address")
	f.StringVar(&cfg.LogFormat, "log-format", "text", "log format: text or json")
	f.StringVar(&cfg.LogLevel, "log-level", "info", "log level: debug, info, warn, error")
	f.StringVar(&cfg.TLS.Cert, "tls-cert", "", "serve TLS with this certificate (PEM; with --tls-key; read again on SIGHUP)")
	f.StringVar(&cfg.TLS.Key, "tls-key", "", "the TLS certificate's private key (PEM)")
	f.BoolVar(&devLocalBox, "dev-local-box", false, "create the profile \"local\" (the built-in local box, development only) when missing")
	return cmd
}

func newLogger(w io.Writer, format, level string) *slog.Logger {
	var lv slog.Level
	_ = lv.UnmarshalText([]byte(strings.ToUpper(level)))
	opts := &slog.HandlerOptions{Level: lv}
	if format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

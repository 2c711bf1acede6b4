package main

import (
	"log/slog"
	"path/filepath"

	"github.com/openclaw/cloudworkers/gateway"
	"github.com/openclaw/cloudworkers/gateway/store"
	"github.com/openclaw/cloudworkers/providers"
	"github.com/openclaw/cloudworkers/providers/command"
	"github.com/openclaw/cloudworkers/providers/local"
	"github.com/openclaw/cloudworkers/providers/static"
)

// gatewayDeps wires the providers explicitly (no init() registration) and, with devLocalBox, the
// built-in profile "local".
func gatewayDeps(log *slog.Logger, devLocalBox bool) gateway.Deps {
	d := gateway.Deps{
		Log: log,
		Providers: func(db *store.DB, dataDir string, log *slog.Logger) (providers.Registry, error) {
			lp, err := local.New(local.Config{BoxesDir: local.BoxesDir(dataDir), Logger: log.With("provider", "local")})
			if err != nil {
				return nil, err
			}
			// Lease CLIs run in <data-dir>/providers/<profile>, never in the gateway's own directory.
			cc := command.Config{WorkRoot: filepath.Join(dataDir, "providers")}
			return providers.Registry{
				"command": command.New(cc),
				"crabbox": command.NewCrabbox(cc),
				"static":  static.New(db),
				"local":   lp,
			}, nil
		},
	}
	if devLocalBox {
		// --dev-local-box: a fresh gateway can start a worker without any configuration. The local
		// box is this machine: it has a default route and may have a Docker socket, so those
		// checks only warn there.
		d.Builtin = []providers.Profile{{ID: "local", Provider: "local", Hygiene: map[string]string{
			providers.HygieneMetadataRoute: providers.HygieneWarn, providers.HygieneDockerSocket: providers.HygieneWarn,
		}}}
	}
	return d
}

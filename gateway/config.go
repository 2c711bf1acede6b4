// Package gateway wires the daemon together: configuration, data dir, lock, token and lifecycle.
package gateway

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/openclaw/cloudworkers/gateway/inference"
	"github.com/openclaw/cloudworkers/gateway/websearch"
	"github.com/openclaw/cloudworkers/providers"
	"github.com/openclaw/cloudworkers/sync/checkpoint"
	"github.com/openclaw/cloudworkers/sync/stream"
)

// Config is the gateway configuration: defaults, then the YAML file, then flags.
type Config struct {
	DataDir   string             `yaml:"dataDir"`
	Listen    string             `yaml:"listen"`
	LogFormat string             `yaml:"logFormat"`
	LogLevel  string             `yaml:"logLevel"`
	Sweep     providers.Duration `yaml:"sweepInterval"`
	// Lifecycle is how often the profiles' lifetime policy (idle auto-stop, TTL, renewal) runs;
	// zero means 30s.
	Lifecycle providers.Duration `yaml:"lifecycleInterval"`
	// BundleDir holds cross-built worker bundles (openclaw-linux-arm64, …) from `make bundles`.
	BundleDir string       `yaml:"bundleDir"`
	Tunnel    TunnelConfig `yaml:"tunnel"`
	// Box bounds every operation on a box (zero means the default).
	Box    BoxConfig    `yaml:"box"`
	Worker WorkerConfig `yaml:"worker"`
	// Models is the model catalog; empty means the built-in scripted demo catalog.
	Models inference.CatalogConfig `yaml:"models"`
	// WebSearch configures the gateway-resident web_search tool; unset means no such tool.
	WebSearch websearch.Config `yaml:"webSearch"`
	// Profiles are applied at start (created or replaced), in addition to those stored.
	Profiles []providers.Profile `yaml:"profiles"`
	Sync     SyncConfig          `yaml:"sync"`
}

// SyncConfig tunes workspace sync to boxes.
type SyncConfig struct {
	// Compression: auto (default: below about 200 Mbit/s, try compressed frames and keep them while
	// they go through faster), zstd (always) or none (never).
	Compression string `yaml:"compression"`
	// Channels is how many SSH channels the first sync of a large workspace to a box uses at once
	// (0: 2). More help a long fat link, where one channel's window limits the rate.
	Channels int `yaml:"channels"`
	// CheckpointKeep is how many of a remote session's newest checkpoints are kept (0: 20); older
	// ones are pruned after each checkpoint (git: their refs; plain: their snapshots and blobs).
	CheckpointKeep int `yaml:"checkpointKeep"`
}

// TunnelConfig tunes the SSH control connections (zero means the default).
type TunnelConfig struct {
	KeepaliveInterval providers.Duration `yaml:"keepaliveInterval"` // default 10s
	KeepaliveTimeout  providers.Duration `yaml:"keepaliveTimeout"`  // default 30s: a dead link is closed after it
	BackoffMax        providers.Duration `yaml:"backoffMax"`        // default 30s
}

// BoxConfig bounds operations on boxes, so that a box that never answers cannot hold a
// bootstrap, a sync or a teardown (zero means the default). The sync and bootstrap connections
// keep alive with the tunnel's keepaliveInterval and keepaliveTimeout.
type BoxConfig struct {
	CommandTimeout   providers.Duration `yaml:"commandTimeout"`   // default 1m: one short command (platform, hygiene, launch)
	BootstrapTimeout providers.Duration `yaml:"bootstrapTimeout"` // default 15m: a whole bootstrap, bundle upload included
	ReleaseTimeout   providers.Duration `yaml:"releaseTimeout"`   // default 15s: box-side cleanup at destroy (the provider's destroy follows regardless)
	SyncTimeout      providers.Duration `yaml:"syncTimeout"`      // default 30m: one sync out to a box
	ReconcileTimeout providers.Duration `yaml:"reconcileTimeout"` // default 10m: one pull-back or checkpoint from a box
}

// WorkerConfig tunes worker admission and supervision (zero means the default).
type WorkerConfig struct {
	HeartbeatTimeout providers.Duration `yaml:"heartbeatTimeout"` // default 30s; workers heartbeat at a third of it
	AdmitTimeout     providers.Duration `yaml:"admitTimeout"`     // default 60s
	RelaunchGrace    providers.Duration `yaml:"relaunchGrace"`    // default 5s: a worker away longer is checked and relaunched
}

// DefaultListen is where the gateway listens unless told otherwise.
const DefaultListen = "127.0.0.1:7420"

// DefaultDataDir is $XDG_STATE_HOME/openclaw-gateway, else ~/.local/state/openclaw-gateway.
func DefaultDataDir() string {
	if x := os.Getenv("XDG_STATE_HOME"); x != "" {
		return filepath.Join(x, "openclaw-gateway")
	}
	home, err := os.UserHomeDir()
	if err != nil || home == "" {
		home = "."
	}
	return filepath.Join(home, ".local", "state", "openclaw-gateway")
}

// SetDefaults fills unset fields.
func (c *Config) SetDefaults() {
	if c.DataDir == "" {
		c.DataDir = DefaultDataDir()
	}
	if c.Listen == "" {
		c.Listen = DefaultListen
	}
	if c.LogFormat == "" {
		c.LogFormat = "text"
	}
	if c.LogLevel == "" {
		c.LogLevel = "info"
	}
}

// Validate names the first bad field.
func (c *Config) Validate() error {
	switch {
	case c.LogFormat != "text" && c.LogFormat != "json":
		return providers.Fieldf("logFormat", "must be text or json, got %q", c.LogFormat)
	case !validLevel(c.LogLevel):
		return providers.Fieldf("logLevel", "must be debug, info, warn or error, got %q", c.LogLevel)
	case c.Sweep < 0:
		return providers.Fieldf("sweepInterval", "must not be negative")
	case c.Lifecycle < 0:
		return providers.Fieldf("lifecycleInterval", "must not be negative")
	case !strings.Contains(c.Listen, ":"):
		return providers.Fieldf("listen", "must be host:port, got %q", c.Listen)
	}
	for name, d := range map[string]providers.Duration{"box.commandTimeout": c.Box.CommandTimeout, "box.bootstrapTimeout": c.Box.BootstrapTimeout,
		"box.releaseTimeout": c.Box.ReleaseTimeout, "box.syncTimeout": c.Box.SyncTimeout, "box.reconcileTimeout": c.Box.ReconcileTimeout} {
		if d < 0 {
			return providers.Fieldf(name, "must not be negative (0: the default), got %s", d.D())
		}
	}
	if c.Sync.Channels < 0 || c.Sync.Channels > stream.MaxParts {
		return providers.Fieldf("sync.channels", "must be from 1 to %d (0: the default, %d), got %d", stream.MaxParts, stream.DefaultChannels, c.Sync.Channels)
	}
	if c.Sync.CheckpointKeep < 0 {
		return providers.Fieldf("sync.checkpointKeep", "must be at least 1 (0: the default, %d), got %d", checkpoint.DefaultKeep, c.Sync.CheckpointKeep)
	}
	if _, err := stream.ParseCompression(c.Sync.Compression); err != nil {
		return providers.Fieldf("sync.compression", "must be auto, zstd or none, got %q", c.Sync.Compression)
	}
	return nil
}

func validLevel(l string) bool {
	switch strings.ToLower(l) {
	case "debug", "info", "warn", "error":
		return true
	}
	return false
}

// LoadConfigFile reads a YAML config file strictly (unknown fields are errors).
func LoadConfigFile(path string, into *Config) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(into); err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("config %s: %w", path, err)
	}
	into.Models.ResolvePaths(filepath.Dir(path))
	return nil
}

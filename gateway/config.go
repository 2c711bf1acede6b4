// Package gateway wires the daemon together: configuration, data dir, lock, token and lifecycle.
package gateway

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/openclaw/cloudworkers/gateway/spend"

	"go.yaml.in/yaml/v3"

	"github.com/openclaw/cloudworkers/gateway/agents"
	"github.com/openclaw/cloudworkers/gateway/boxaccess"
	"github.com/openclaw/cloudworkers/gateway/credentials"
	"github.com/openclaw/cloudworkers/gateway/hub"
	"github.com/openclaw/cloudworkers/gateway/inference"
	"github.com/openclaw/cloudworkers/gateway/mcp"
	"github.com/openclaw/cloudworkers/gateway/occ"
	"github.com/openclaw/cloudworkers/gateway/placement"
	"github.com/openclaw/cloudworkers/gateway/sessions"
	"github.com/openclaw/cloudworkers/gateway/websearch"
	"github.com/openclaw/cloudworkers/gateway/workspace"
	"github.com/openclaw/cloudworkers/protocol"
	"github.com/openclaw/cloudworkers/providers"
	"github.com/openclaw/cloudworkers/sync/checkpoint"
	"github.com/openclaw/cloudworkers/sync/gitsync"
	"github.com/openclaw/cloudworkers/sync/stream"
)

// Config is the gateway configuration: defaults, then the YAML file, then flags.
type Config struct {
	DataDir string `yaml:"dataDir"`
	Listen  string `yaml:"listen"`
	// AllowedHosts are the names (besides IP literals and localhost) by which clients reach the
	// gateway; a request with any other Host header is refused (421), against DNS rebinding.
	AllowedHosts []string `yaml:"allowedHosts"`
	// MetricsListen, when set, serves /metrics without the token on this address (for a
	// Prometheus scraper); /metrics on Listen always needs the token.
	MetricsListen string `yaml:"metricsListen"`
	// TLS serves the API listener over TLS (docs/operations.md → TLS); reloaded on SIGHUP.
	TLS TLSConfig `yaml:"tls"`
	// TrustedProxies are the addresses (CIDR prefixes or IPs) of TLS-terminating proxies in
	// front of the gateway: a request from one of them with X-Forwarded-Proto: https counts as
	// TLS (the session cookie gets Secure, the Origin check expects https).
	TrustedProxies []string `yaml:"trustedProxies"`
	// UI bounds the Control UI's browser sessions.
	UI        UIConfig           `yaml:"ui"`
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
	Box BoxConfig `yaml:"box"`
	// Placement tunes moves of a session whose turn runs.
	Placement PlacementConfig `yaml:"placement"`
	Worker    WorkerConfig    `yaml:"worker"`
	// Capacity bounds what the whole gateway holds (zero means the default); see docs/operations.md.
	Capacity CapacityConfig `yaml:"capacity"`
	// Models is the model catalog; empty means the built-in scripted demo catalog.
	Models inference.CatalogConfig `yaml:"models"`
	// WebSearch configures the gateway-resident web_search tool; unset means no such tool.
	WebSearch websearch.Config `yaml:"webSearch"`
	// Agents configures the sessions_* tools: the default worker profile of a spawn and the
	// recursion bound.
	Agents agents.Config `yaml:"agents"`
	// MCP configures the MCP server behind /mcp (see docs/agents.md).
	MCP mcp.Settings `yaml:"mcp"`
	// Profiles are applied at start (created or replaced), in addition to those stored.
	Profiles []providers.Profile `yaml:"profiles"`
	Sync     SyncConfig          `yaml:"sync"`
	// Git is the box repository's settings: git.author is the identity of the worker's commits
	// (a profile's git.author overrides it); unset, a commit on the box needs one of its own.
	Git GitConfig `yaml:"git"`
	// Retention bounds how long audit rows, dead worker credentials and inference call rows are kept.
	Retention RetentionConfig `yaml:"retention"`
	// BoxAccess bounds env ssh, exec, logs and extend (docs/cli.md).
	BoxAccess boxaccess.Config `yaml:"boxAccess"`
	// OCC configures the OCC Compute side under /occ/v1/ (docs/occ.md).
	OCC occ.Config `yaml:"occ"`
	// Workspaces confines the directories a session's workspace may name (docs/operations.md →
	// Security model).
	Workspaces WorkspacesConfig `yaml:"workspaces"`
	// OpenClawClients configures the OpenClaw Gateway protocol endpoint that OpenClaw's own
	// clients use (docs/openclaw-clients.md).
	OpenClawClients OpenClawClientsConfig `yaml:"openclawClients"`
	// ControlUI serves OpenClaw's own Control UI from an installed openclaw package, behind this
	// gateway's sign-in (docs/openclaw-clients.md).
	ControlUI OpenClawControlUIConfig `yaml:"controlUi"`
	// Credentials places the sealing key of stored credentials (credentials.keyFile; default
	// <dataDir>/credentials.key); see docs/operations.md → Credentials key.
	Credentials credentials.Settings `yaml:"credentials"`
	// Budgets are the spend limits of machines and model calls together, and Spend where their
	// day and month windows begin (docs/operations.md, "Spend and budgets").
	Budgets []spend.Budget `yaml:"budgets"`
	Spend   SpendConfig    `yaml:"spend"`
	// Pool bounds the prepared pools (profiles' pool:) gateway-wide (docs/workers.md).
	Pool PoolConfig `yaml:"pool"`
}

// PoolConfig is the config's pool section.
type PoolConfig struct {
	// MaxUnassigned bounds the machines the prepared pools hold unassigned, gateway-wide
	// (default 4; 0 drains the pools).
	MaxUnassigned *int `yaml:"maxUnassigned"`
}

// SpendConfig is the config's spend section.
type SpendConfig struct {
	// TimeZone is the IANA zone in which day and month budget windows begin (default UTC).
	TimeZone string `yaml:"timeZone"`
}

// Zone returns the spend time zone (UTC when unset); Validate has checked it.
func (c SpendConfig) Zone() *time.Location {
	if c.TimeZone == "" {
		return time.UTC
	}
	z, err := time.LoadLocation(c.TimeZone)
	if err != nil {
		return time.UTC
	}
	return z
}

// OpenClawControlUIConfig is the config's controlUi section: OpenClaw's own Control UI, served
// from an installed openclaw package.
type OpenClawControlUIConfig struct {
	// OpenClawRoot is the installed openclaw npm package (the directory holding
	// dist/control-ui); empty: not served.
	OpenClawRoot string `yaml:"openclawRoot"`
	// BasePath is where it is served (default /openclaw; our own UI stays at /).
	BasePath string `yaml:"basePath"`
}

// OpenClawClientsConfig is the config's openclawClients section.
type OpenClawClientsConfig struct {
	// TraceFile, when set, receives every protocol frame the gateway sends to OpenClaw's clients,
	// one JSON document per line (a debugging aid: frames carry session content, never a token).
	TraceFile string `yaml:"traceFile"`
	// MaxConnections bounds the open connections of OpenClaw's clients, gateway-wide (default
	// 1024, at most 65536).
	MaxConnections int `yaml:"maxConnections"`
	// MaxConnectionsPerDevice bounds the open connections of one device of OpenClaw's clients (its
	// device token or signed identity; default 32).
	MaxConnectionsPerDevice int `yaml:"maxConnectionsPerDevice"`
}

// Validate names a bad setting of the section.
func (o OpenClawClientsConfig) Validate() error {
	if o.MaxConnections < 0 || o.MaxConnections > 65536 {
		return providers.Fieldf("openclawClients.maxConnections", "must be within 0..65536 (0: the default, 1024), got %d", o.MaxConnections)
	}
	if o.MaxConnectionsPerDevice < 0 || o.MaxConnectionsPerDevice > 65536 {
		return providers.Fieldf("openclawClients.maxConnectionsPerDevice", "must be within 0..65536 (0: the default, 32), got %d", o.MaxConnectionsPerDevice)
	}
	return nil
}

// WorkspacesConfig is the config's workspaces section.
type WorkspacesConfig struct {
	// Roots are absolute directories every workspace or spawn directory must lie in (symlinks
	// resolved); default: the home directory of the user the gateway runs as.
	Roots []string `yaml:"roots"`
}

// roots resolves the workspace roots (the default when none are set) against the data dir.
func (w WorkspacesConfig) roots(dataDir string) (sessions.Roots, error) {
	home, _ := os.UserHomeDir()
	list := w.Roots
	if len(list) == 0 {
		if home == "" {
			return sessions.Roots{}, providers.Fieldf("workspaces.roots", "is not set and the gateway's user has no home directory to default to")
		}
		list = []string{home}
	}
	return sessions.NewRoots("workspaces.roots", list, dataDir, home)
}

// RetentionConfig bounds the database's growth; a periodic prune deletes older rows (zero means
// the default).
type RetentionConfig struct {
	Audit          providers.Duration `yaml:"audit"`          // default 720h: audit rows older than this
	Credentials    providers.Duration `yaml:"credentials"`    // default 168h: worker credentials expired or revoked this long ago
	InferenceCalls providers.Duration `yaml:"inferenceCalls"` // default 720h: inference call rows (accounting, replay) ended this long ago
	Interval       providers.Duration `yaml:"interval"`       // default 1h: how often the prune runs
}

// Retention defaults.
const (
	DefaultAuditRetention         = 720 * time.Hour
	DefaultCredentialRetention    = 168 * time.Hour
	DefaultInferenceCallRetention = 720 * time.Hour
	DefaultRetentionInterval      = time.Hour
	minRetention                  = time.Hour
)

// orDefault returns d, or def when d is zero.
func orDefault(d providers.Duration, def time.Duration) time.Duration {
	if d == 0 {
		return def
	}
	return d.D()
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
	// ReserveFreeBytes and ReserveFreePercent: a pull-back is refused when what a box sends
	// would leave less free than the larger of the two on the anchor's filesystem or the data
	// directory's (gateway.db must stay writable); 0: 1 GiB and 5.
	ReserveFreeBytes   int64   `yaml:"reserveFreeBytes"`
	ReserveFreePercent float64 `yaml:"reserveFreePercent"`
	// SnapshotAuthor signs the commit "openclaw: working tree at dispatch" that carries a git
	// checkout's uncommitted work to a box (default OpenClaw <openclaw@openclaw.invalid>).
	SnapshotAuthor GitIdentity `yaml:"snapshotAuthor"`
	// MaxAllowedSecrets bounds the secret scan's false positives (`pullback --allow-secret`)
	// one session may let through (0: 100).
	MaxAllowedSecrets int `yaml:"maxAllowedSecrets"`
}

// GitIdentity is a git author: name and email.
// GitConfig is the gateway's settings of box repositories.
type GitConfig struct {
	Author providers.GitAuthor `yaml:"author"`
	// Signing re-signs a session's commits with a gateway-held key before they are published.
	Signing GitSigning `yaml:"signing"`
}

// GitSigning is git.signing.
type GitSigning struct {
	// Key is the path of an OpenSSH private key without a passphrase (mode 0600) that signs the
	// commits a publish pushes (SSH signatures, as `git verify-commit` checks them).
	Key string `yaml:"key"`
}

type GitIdentity struct {
	Name  string `yaml:"name"`
	Email string `yaml:"email"`
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

// PlacementConfig tunes moves between the gateway and workers (zero means the default).
type PlacementConfig struct {
	// DrainTimeout bounds how long a dispatch or pull-back with the drain policy waits for a
	// running turn to end (default 10m): a dispatch is then refused, a pull-back cancels the turn.
	DrainTimeout providers.Duration `yaml:"drainTimeout"`
}

// WorkerConfig tunes worker admission and supervision (zero means the default).
type WorkerConfig struct {
	HeartbeatTimeout providers.Duration `yaml:"heartbeatTimeout"` // default 30s; workers heartbeat at a third of it
	WriteTimeout     providers.Duration `yaml:"writeTimeout"`     // default 10s (1s to 10m): a connection whose write to its worker is blocked this long is cut
	AdmitTimeout     providers.Duration `yaml:"admitTimeout"`     // default 60s
	RelaunchGrace    providers.Duration `yaml:"relaunchGrace"`    // default 5s: a worker away longer is checked and relaunched
	// Limits bound what one worker may hold on the gateway (zero means the default).
	Limits WorkerLimits `yaml:"limits"`
	// RequireKey (default true) admits a worker only with the proof of its launch key, bound to
	// its credential at the first admission. false lets a copy of a credential admit: only for a
	// test that stands in for a killed worker.
	RequireKey *bool `yaml:"requireKey"`
}

// WorkerLimits are the hub's per-worker limits (hub.Limits).
type WorkerLimits struct {
	CallsPerConnection int                `yaml:"callsPerConnection"`        // default 4: inference, context and tool calls in flight per connection
	BytesPerConnection int64              `yaml:"bytesPerConnection"`        // default 64 MiB: their request bytes in flight per connection
	CallsPerEnv        int                `yaml:"callsPerEnvironment"`       // default 8: calls in flight per environment
	BytesPerEnv        int64              `yaml:"bytesPerEnvironment"`       // default 128 MiB: bytes in flight per environment
	RefreshInterval    providers.Duration `yaml:"credentialRefreshInterval"` // default 10s: one credential refresh per interval per environment
	RefreshBurst       int                `yaml:"credentialRefreshBurst"`    // default 2
	PreAdmission       int                `yaml:"preAdmissionConnections"`   // default 8: unadmitted connections per tunnel
	AdmissionTimeout   providers.Duration `yaml:"admissionTimeout"`          // default 10s: accept to admission, else closed
	// RefusalAuditWindow is how often refused connections and calls are written to the audit,
	// one row per kind and environment counting them (default 1m).
	RefusalAuditWindow providers.Duration `yaml:"refusalAuditWindow"`
	// CreditStall ends a model call whose worker grants it no credit this long (default 1m).
	CreditStall providers.Duration `yaml:"creditStall"`
}

// Bounds of worker.writeTimeout: below a second a worker busy for a moment would be cut, above ten
// minutes a worker that stopped reading holds its connection's buffers that long.
const (
	minWriteTimeout = time.Second
	maxWriteTimeout = 10 * time.Minute
)

// configureHub sets what gateway.yaml says of the hub on hc: the worker deadlines, limits and
// capacity (zero fields take the hub's defaults).
func (c *Config) configureHub(hc *hub.Config) {
	hc.HeartbeatTimeout, hc.WriteTimeout = c.Worker.HeartbeatTimeout.D(), c.Worker.WriteTimeout.D()
	hc.Limits, hc.AdmissionTimeout = c.Worker.Limits.HubLimits(), c.Worker.Limits.AdmissionTimeout.D()
	hc.Capacity = c.Capacity.HubCapacity()
	hc.RequireWorkerKey = c.Worker.RequireKey == nil || *c.Worker.RequireKey
}

// HubLimits converts l for the hub (zero fields take the hub's defaults).
func (l WorkerLimits) HubLimits() hub.Limits {
	return hub.Limits{ConnCalls: l.CallsPerConnection, ConnBytes: l.BytesPerConnection, EnvCalls: l.CallsPerEnv,
		EnvBytes: l.BytesPerEnv, RefreshInterval: l.RefreshInterval.D(), RefreshBurst: l.RefreshBurst, PreAdmission: l.PreAdmission,
		RejectAuditWindow: l.RefusalAuditWindow.D(), CreditStall: l.CreditStall.D()}
}

// CapacityConfig bounds the gateway's load: over a limit, new work is refused with capacity-exceeded
// (a new environment with HTTP 429 and Retry-After) and nothing already admitted is dropped.
type CapacityConfig struct {
	MaxWorkers                 int   `yaml:"maxWorkers"`                           // default 500: environments with a connected worker; also live environments
	MaxInflightInference       int   `yaml:"maxInflightInference"`                 // default 512: model calls in flight, gateway-wide
	MaxInflightInferencePerEnv int   `yaml:"maxInflightInferencePerEnvironment"`   // default 8: model calls in flight per environment
	MaxRelayBytesPerSecond     int64 `yaml:"maxRelayBytesPerSecondPerEnvironment"` // default 4 MiB/s: inference event bytes relayed per environment
}

// HubCapacity converts c for the hub (zero fields take the hub's defaults).
func (c CapacityConfig) HubCapacity() hub.Capacity {
	return hub.Capacity{MaxWorkers: c.MaxWorkers, MaxInflightInference: c.MaxInflightInference,
		MaxInflightInferencePerEnv: c.MaxInflightInferencePerEnv, MaxRelayBytesPerSecond: c.MaxRelayBytesPerSecond}
}

func (c CapacityConfig) validate() error {
	for _, f := range []struct {
		name string
		v    int64
	}{{"capacity.maxWorkers", int64(c.MaxWorkers)}, {"capacity.maxInflightInference", int64(c.MaxInflightInference)},
		{"capacity.maxInflightInferencePerEnvironment", int64(c.MaxInflightInferencePerEnv)},
		{"capacity.maxRelayBytesPerSecondPerEnvironment", c.MaxRelayBytesPerSecond}} {
		if f.v < 0 {
			return providers.Fieldf(f.name, "must not be negative (0: the default), got %d", f.v)
		}
	}
	inflight := c.MaxInflightInference
	if inflight == 0 {
		inflight = hub.DefaultMaxInflightInference
	}
	if c.MaxInflightInferencePerEnv > inflight {
		return providers.Fieldf("capacity.maxInflightInferencePerEnvironment", "must not be above capacity.maxInflightInference (%d), got %d",
			inflight, c.MaxInflightInferencePerEnv)
	}
	return nil
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
	case c.MetricsListen != "" && !strings.Contains(c.MetricsListen, ":"):
		return providers.Fieldf("metricsListen", "must be host:port, got %q", c.MetricsListen)
	}
	if err := c.validateTransport(); err != nil {
		return err
	}
	for i, h := range c.AllowedHosts {
		if h == "" || strings.ContainsAny(h, ":/ ") {
			return providers.Fieldf(fmt.Sprintf("allowedHosts[%d]", i), "must be a host name without port or scheme, got %q", h)
		}
	}
	if err := providers.FirstBad([]providers.Field[providers.Duration]{{Name: "box.commandTimeout", Value: c.Box.CommandTimeout},
		{Name: "box.bootstrapTimeout", Value: c.Box.BootstrapTimeout}, {Name: "box.releaseTimeout", Value: c.Box.ReleaseTimeout},
		{Name: "box.syncTimeout", Value: c.Box.SyncTimeout}, {Name: "box.reconcileTimeout", Value: c.Box.ReconcileTimeout},
		{Name: "placement.drainTimeout", Value: c.Placement.DrainTimeout},
		{Name: "worker.heartbeatTimeout", Value: c.Worker.HeartbeatTimeout}, {Name: "worker.admitTimeout", Value: c.Worker.AdmitTimeout},
		{Name: "worker.relaunchGrace", Value: c.Worker.RelaunchGrace}, {Name: "worker.limits.creditStall", Value: c.Worker.Limits.CreditStall}},
		func(d providers.Duration) bool { return d < 0 },
		func(d providers.Duration) string {
			return fmt.Sprintf("must not be negative (0: the default), got %s", d.D())
		}); err != nil {
		return err
	}
	if c.Sync.Channels < 0 || c.Sync.Channels > stream.MaxParts {
		return providers.Fieldf("sync.channels", "must be from 1 to %d (0: the default, %d), got %d", stream.MaxParts, stream.DefaultChannels, c.Sync.Channels)
	}
	if c.Sync.CheckpointKeep < 0 {
		return providers.Fieldf("sync.checkpointKeep", "must be at least 1 (0: the default, %d), got %d", checkpoint.DefaultKeep, c.Sync.CheckpointKeep)
	}
	if w := c.Worker.WriteTimeout; w != 0 && (w.D() < minWriteTimeout || w.D() > maxWriteTimeout) {
		return providers.Fieldf("worker.writeTimeout", "must be from %s to %s (0: the default, %s), got %s",
			minWriteTimeout, maxWriteTimeout, hub.DefaultWriteTimeout, w.D())
	}
	if err := c.Worker.Limits.validate(); err != nil {
		return err
	}
	if err := c.Capacity.validate(); err != nil {
		return err
	}
	if err := c.Retention.validate(); err != nil {
		return err
	}
	ag := c.Agents
	ag.SetDefaults()
	if err := ag.Validate(); err != nil {
		return err
	}
	if err := c.OpenClawClients.Validate(); err != nil {
		return err
	}
	if err := c.MCP.Validate(); err != nil {
		return err
	}
	if err := c.Credentials.Validate(); err != nil {
		return err
	}
	if err := c.BoxAccess.Validate(); err != nil {
		return err
	}
	if err := c.OCC.Validate(); err != nil {
		return err
	}
	if c.Sync.ReserveFreeBytes < 0 {
		return providers.Fieldf("sync.reserveFreeBytes", "must not be negative (0: the default, %d), got %d", stream.DefaultReserveBytes, c.Sync.ReserveFreeBytes)
	}
	if !(c.Sync.ReserveFreePercent >= 0 && c.Sync.ReserveFreePercent < 100) { // NaN too
		return providers.Fieldf("sync.reserveFreePercent", "must be from 0 to under 100 (0: the default, %d), got %v", stream.DefaultReservePercent, c.Sync.ReserveFreePercent)
	}
	if c.Sync.MaxAllowedSecrets < 0 {
		return providers.Fieldf("sync.maxAllowedSecrets", "must be at least 1 (0: the default, %d), got %d", placement.DefaultMaxAllowedSecrets, c.Sync.MaxAllowedSecrets)
	}
	if err := c.Git.Author.Validate("git.author"); err != nil {
		return err
	}
	if k := c.Git.Signing.Key; k != "" {
		if !filepath.IsAbs(k) {
			return providers.Fieldf("git.signing.key", "must be an absolute path, got %q", k)
		}
		if _, err := workspace.LoadSigningKey(k); err != nil {
			return providers.Fieldf("git.signing.key", "%v", strings.TrimPrefix(err.Error(), "git.signing.key: "))
		}
	}
	if err := (gitsync.Identity{Name: c.Sync.SnapshotAuthor.Name, Email: c.Sync.SnapshotAuthor.Email}).Validate(); err != nil {
		return providers.Fieldf("sync.snapshotAuthor", "%v", err)
	}
	if _, err := stream.ParseCompression(c.Sync.Compression); err != nil {
		return providers.Fieldf("sync.compression", "must be auto, zstd or none, got %q", c.Sync.Compression)
	}
	if m := c.Pool.MaxUnassigned; m != nil && (*m < 0 || *m > 1000) {
		return providers.Fieldf("pool.maxUnassigned", "must be from 0 (drain the pools) to 1000, got %d", *m)
	}
	if c.Spend.TimeZone != "" {
		if _, err := time.LoadLocation(c.Spend.TimeZone); err != nil {
			return providers.Fieldf("spend.timeZone", "must be an IANA time zone such as Europe/Berlin, got %q", c.Spend.TimeZone)
		}
	}
	if _, err := spend.New(spend.Config{Budgets: slices.Clone(c.Budgets)}); err != nil {
		return err
	}
	return nil
}

func (l WorkerLimits) validate() error {
	hl := l.HubLimits()
	if err := providers.FirstBad([]providers.Field[int64]{{Name: "worker.limits.callsPerConnection", Value: int64(hl.ConnCalls)},
		{Name: "worker.limits.bytesPerConnection", Value: hl.ConnBytes}, {Name: "worker.limits.callsPerEnvironment", Value: int64(hl.EnvCalls)},
		{Name: "worker.limits.bytesPerEnvironment", Value: hl.EnvBytes}, {Name: "worker.limits.credentialRefreshInterval", Value: int64(hl.RefreshInterval)},
		{Name: "worker.limits.credentialRefreshBurst", Value: int64(hl.RefreshBurst)}, {Name: "worker.limits.preAdmissionConnections", Value: int64(hl.PreAdmission)},
		{Name: "worker.limits.admissionTimeout", Value: int64(l.AdmissionTimeout)}, {Name: "worker.limits.refusalAuditWindow", Value: int64(l.RefusalAuditWindow)}},
		func(v int64) bool { return v < 0 }, func(int64) string { return "must not be negative (0: the default)" }); err != nil {
		return err
	}
	if l.BytesPerConnection != 0 && l.BytesPerConnection < protocol.DefaultFrameLimit {
		return providers.Fieldf("worker.limits.bytesPerConnection", "must be at least the frame limit, %d bytes (0: the default, %d)",
			protocol.DefaultFrameLimit, hub.DefaultConnBytes)
	}
	if l.CallsPerEnv != 0 && l.CallsPerEnv < max(l.CallsPerConnection, 1) {
		return providers.Fieldf("worker.limits.callsPerEnvironment", "must not be below worker.limits.callsPerConnection")
	}
	if l.BytesPerEnv != 0 && l.BytesPerEnv < max(l.BytesPerConnection, protocol.DefaultFrameLimit) {
		return providers.Fieldf("worker.limits.bytesPerEnvironment", "must not be below worker.limits.bytesPerConnection")
	}
	return nil
}

func (r RetentionConfig) validate() error {
	if r.Interval < 0 {
		return providers.Fieldf("retention.interval", "must not be negative (0: the default, %s)", DefaultRetentionInterval)
	}
	return providers.FirstBad([]providers.Field[providers.Duration]{{Name: "retention.audit", Value: r.Audit},
		{Name: "retention.credentials", Value: r.Credentials}, {Name: "retention.inferenceCalls", Value: r.InferenceCalls}},
		func(d providers.Duration) bool { return d != 0 && d.D() < minRetention },
		func(d providers.Duration) string {
			return fmt.Sprintf("must be at least %s (0: the default), got %s", minRetention, d.D())
		})
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

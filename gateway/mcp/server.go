// Package mcp serves the gateway's cloud workers to any MCP client (Claude Code, Codex CLI,
// Cursor) through the official Go SDK, over stdio (`openclaw mcp`) or streamable HTTP (/mcp).
package mcp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/openclaw/cloudworkers/gateway/api"
	"github.com/openclaw/cloudworkers/gateway/sessions"
	"github.com/openclaw/cloudworkers/internal/version"
	"github.com/openclaw/cloudworkers/providers"
)

// Config configures the MCP server.
type Config struct {
	// Client reaches the gateway's HTTP API; every tool is a sequence of its calls.
	Client *api.Client
	// DefaultProfile is the worker profile of a dispatch that names none ("" makes profile
	// required).
	DefaultProfile string
	// MaxBackground bounds the dispatches with wait: false that this server follows at once
	// (each waits for its placement, then sends its task).
	MaxBackground int
	// CallTimeout bounds one waiting tool call (dispatch or send with wait, pullback).
	CallTimeout time.Duration
	// MaxAnswerBytes bounds the answer a tool result carries (the transcript resource has it all).
	MaxAnswerBytes int
	// MaxResourceBytes bounds a resource read (a transcript export, a branch diff).
	MaxResourceBytes int64
	// SessionTimeout closes an HTTP MCP session idle this long (streamable HTTP only).
	SessionTimeout time.Duration
	// MaxSessionsPerToken and MaxSessions bound the HTTP MCP sessions open at once, per bearer
	// token and in all; a new session past a bound evicts the one idle the longest, or is
	// refused (429) when every one is in a call.
	MaxSessionsPerToken int
	MaxSessions         int
	// Registry, when set, gets the /mcp session metrics (openclaw_mcp_sessions and the
	// evictions and refusals by cap).
	Registry prometheus.Registerer
	// Roots confine the workspaces a dispatch may name, before the gateway's own check (the
	// gateway's workspaces.roots narrowed by mcp.workspaceRoots). The zero value leaves it to
	// the gateway.
	Roots sessions.Roots
	Log   *slog.Logger
}

// Defaults of Config.
const (
	DefaultMaxBackground    = 16
	DefaultCallTimeout      = time.Hour
	DefaultSessionTimeout   = 30 * time.Minute
	DefaultMaxResourceBytes = 8 << 20
	DefaultMaxAnswerBytes   = 64 << 10
	// DefaultMaxSessionsPerToken and DefaultMaxSessions bound the HTTP MCP sessions (each holds
	// some 15 KiB and a goroutine or two; an agent needs one, an editor a handful).
	DefaultMaxSessionsPerToken = 64
	DefaultMaxSessions         = 256
)

func (c *Config) setDefaults() {
	if c.MaxBackground == 0 {
		c.MaxBackground = DefaultMaxBackground
	}
	if c.CallTimeout == 0 {
		c.CallTimeout = DefaultCallTimeout
	}
	if c.MaxAnswerBytes == 0 {
		c.MaxAnswerBytes = DefaultMaxAnswerBytes
	}
	if c.MaxResourceBytes == 0 {
		c.MaxResourceBytes = DefaultMaxResourceBytes
	}
	if c.SessionTimeout == 0 {
		c.SessionTimeout = DefaultSessionTimeout
	}
	if c.MaxSessionsPerToken == 0 {
		c.MaxSessionsPerToken = DefaultMaxSessionsPerToken
	}
	if c.MaxSessions == 0 {
		c.MaxSessions = max(DefaultMaxSessions, c.MaxSessionsPerToken)
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
}

// Validate checks the configuration, naming the bad field as the gateway config's mcp section
// (and `openclaw mcp`'s flags) spell it.
func (c *Config) Validate() error {
	switch {
	case c.Client == nil:
		return errors.New("mcp: Client is required")
	case c.MaxBackground < 1 || c.MaxBackground > 1024:
		return providers.Fieldf("mcp.maxBackground", "must be within 1..1024 (0: the default, %d), got %d", DefaultMaxBackground, c.MaxBackground)
	case c.CallTimeout < time.Second:
		return providers.Fieldf("mcp.callTimeout", "must be at least 1s (0: the default, %s), got %s", DefaultCallTimeout, c.CallTimeout)
	case c.MaxAnswerBytes < 1<<10 || c.MaxAnswerBytes > 16<<20:
		return providers.Fieldf("mcp.maxAnswerBytes", "must be within 1KiB..16MiB (0: the default, %d), got %d", DefaultMaxAnswerBytes, c.MaxAnswerBytes)
	case c.MaxResourceBytes < 1<<10 || c.MaxResourceBytes > 1<<30:
		return providers.Fieldf("mcp.maxResourceBytes", "must be within 1KiB..1GiB (0: the default, %d), got %d", DefaultMaxResourceBytes, c.MaxResourceBytes)
	case c.SessionTimeout < time.Second:
		return providers.Fieldf("mcp.sessionTimeout", "must be at least 1s (0: the default, %s), got %s", DefaultSessionTimeout, c.SessionTimeout)
	case c.MaxSessionsPerToken < 1 || c.MaxSessionsPerToken > 4096:
		return providers.Fieldf("mcp.maxSessionsPerToken", "must be within 1..4096 (0: the default, %d), got %d", DefaultMaxSessionsPerToken, c.MaxSessionsPerToken)
	case c.MaxSessions < c.MaxSessionsPerToken || c.MaxSessions > 65536:
		return providers.Fieldf("mcp.maxSessions", "must be within mcp.maxSessionsPerToken (%d)..65536 (0: the default, %d), got %d", c.MaxSessionsPerToken, DefaultMaxSessions, c.MaxSessions)
	}
	return nil
}

// Settings are the gateway config's mcp section, for the server behind /mcp (zero: the default).
type Settings struct {
	// DefaultProfile is the worker profile of a dispatch that names none (default: the agents
	// section's defaultProfile).
	DefaultProfile   string             `yaml:"defaultProfile"`
	MaxBackground    int                `yaml:"maxBackground"`
	CallTimeout      providers.Duration `yaml:"callTimeout"`
	SessionTimeout   providers.Duration `yaml:"sessionTimeout"`
	MaxResourceBytes int64              `yaml:"maxResourceBytes"`
	MaxAnswerBytes   int                `yaml:"maxAnswerBytes"`
	// MaxSessionsPerToken and MaxSessions bound the HTTP MCP sessions (default 64 per bearer
	// token, 256 in all).
	MaxSessionsPerToken int `yaml:"maxSessionsPerToken"`
	MaxSessions         int `yaml:"maxSessions"`
	// WorkspaceRoots confine the workspaces a dispatch through /mcp may name further than the
	// gateway's workspaces.roots (each must lie inside one of those).
	WorkspaceRoots []string `yaml:"workspaceRoots"`
}

// Config is the server configuration of these settings with client.
func (st Settings) Config(client *api.Client) Config {
	return Config{Client: client, DefaultProfile: st.DefaultProfile, MaxBackground: st.MaxBackground,
		CallTimeout: st.CallTimeout.D(), SessionTimeout: st.SessionTimeout.D(), MaxResourceBytes: st.MaxResourceBytes, MaxAnswerBytes: st.MaxAnswerBytes,
		MaxSessionsPerToken: st.MaxSessionsPerToken, MaxSessions: st.MaxSessions}
}

// Validate names the first bad setting.
func (st Settings) Validate() error {
	c := st.Config(&api.Client{})
	c.setDefaults()
	return c.Validate()
}

// Server is the MCP server: its tools and resources, and the background dispatches it follows.
type Server struct {
	cfg Config
	mcp *mcp.Server

	ctx    context.Context // ends at Close: background dispatches stop
	cancel context.CancelFunc
	wg     sync.WaitGroup
	mu     sync.Mutex
	bg     map[string]*background // session id → dispatch with wait: false
	caps   *sessionCaps           // bounds the sessions of HTTPHandler
}

// background is a dispatch followed after its tool call returned.
type background struct {
	done   bool
	result *DispatchResult
	err    error
}

// New builds the server.
func New(cfg Config) (*Server, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	info, _ := version.Get()
	s := &Server{cfg: cfg, bg: map[string]*background{}}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.mcp = mcp.NewServer(&mcp.Implementation{Name: "openclaw", Title: "OpenClaw cloud workers", Version: info.Version}, &mcp.ServerOptions{
		Instructions: instructions,
		Logger:       slog.New(demoteInfo{cfg.Log.Handler()}),
	})
	s.addTools()
	s.addResources()
	s.caps = newSessionCaps(s.mcp, cfg.MaxSessionsPerToken, cfg.MaxSessions, cfg.Log)
	if cfg.Registry != nil {
		if err := s.caps.register(cfg.Registry); err != nil {
			return nil, fmt.Errorf("mcp metrics: %w", err)
		}
	}
	return s, nil
}

// MCP returns the SDK server (to connect a transport to).
func (s *Server) MCP() *mcp.Server { return s.mcp }

// Run serves one MCP session over t (stdio for `openclaw mcp`) until the client leaves or ctx
// ends, then stops the background dispatches.
func (s *Server) Run(ctx context.Context, t mcp.Transport) error {
	defer s.Close()
	return s.mcp.Run(ctx, t)
}

// Close stops the background dispatches and ends the HTTP requests in flight, and waits for the
// dispatches. The gateway keeps whatever they started (sessions, placements, turns). Close the
// server before shutting down the HTTP server that serves HTTPHandler.
func (s *Server) Close() {
	s.cancel()
	s.wg.Wait()
}

const instructions = `OpenClaw runs coding tasks on cloud workers: leased machines that get a copy of a workspace.
Use dispatch to run a task on a worker in a git workspace; it returns the answer and the commits the
worker made on the branch openclaw/<name> of that repository. Follow up with send, check with status,
bring results home with pullback. Long calls report each placement step and each tool call of the
worker as progress.`

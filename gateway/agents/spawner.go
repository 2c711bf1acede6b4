package agents

import (
	"context"
	"errors"
	"log/slog"
	"sync"

	"github.com/openclaw/cloudworkers/gateway/envs"
	"github.com/openclaw/cloudworkers/gateway/placement"
	"github.com/openclaw/cloudworkers/gateway/sessions"
	"github.com/openclaw/cloudworkers/gateway/store"
	"github.com/openclaw/cloudworkers/gateway/turns"
	"github.com/openclaw/cloudworkers/gateway/workspace"
	"github.com/openclaw/cloudworkers/internal/clock"
)

// Deps are the gateway parts a Spawner drives; they are built after the tools are handed to the
// turn service, so they are given to Start.
type Deps struct {
	DB         *store.DB
	Sessions   *sessions.Store
	Turns      *turns.Service
	Dispatcher *placement.Dispatcher
	// Workspace tells what a child brought back (its changes).
	Workspace  *workspace.Service
	Placements *placement.Placements
	Envs       *envs.Manager
	// Admitted reports whether an environment's worker is admitted (an idle environment is
	// reused only then).
	Admitted func(envID string) bool
	// DataDir holds the children's forked workspaces (DataDir/agents/…).
	DataDir string
	Log     *slog.Logger
	// Clock dates the audit rows of spawns (the real clock when nil).
	Clock clock.Clock
}

// ErrNotStarted is a call before Start (the gateway is still starting).
var ErrNotStarted = errors.New("agents: the gateway is still starting")

// Spawner spawns and drives child sessions on workers. It is the one core of the
// sessions_* tools and the MCP server.
type Spawner struct {
	cfg Config

	mu        sync.Mutex
	d         *Deps
	ctx       context.Context
	cancel    context.CancelFunc
	wg        sync.WaitGroup
	admitting map[string]int // profile id → spawns between their capacity check and dispatch
}

// New returns a Spawner of cfg (defaults applied, validated).
func New(cfg Config) (*Spawner, error) {
	cfg.SetDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Spawner{cfg: cfg, ctx: ctx, cancel: cancel, admitting: map[string]int{}}, nil
}

// Config returns the effective config.
func (s *Spawner) Config() Config { return s.cfg }

// Start gives the Spawner the parts it drives; calls before it fail with ErrNotStarted.
func (s *Spawner) Start(d Deps) {
	if d.Log == nil {
		d.Log = slog.New(slog.DiscardHandler)
	}
	s.mu.Lock()
	s.d = &d
	s.mu.Unlock()
}

// Close stops background followers of children (spawned without wait) and waits for them.
func (s *Spawner) Close() {
	s.cancel()
	s.wg.Wait()
}

func (s *Spawner) deps() (*Deps, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.d == nil {
		return nil, ErrNotStarted
	}
	return s.d, nil
}

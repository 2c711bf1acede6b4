package gateway

import (
	"context"
	"crypto/tls"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"golang.org/x/sync/errgroup"

	"github.com/openclaw/cloudworkers/gateway/agents"
	"github.com/openclaw/cloudworkers/gateway/api"
	"github.com/openclaw/cloudworkers/gateway/auth"
	"github.com/openclaw/cloudworkers/gateway/bootstrap"
	"github.com/openclaw/cloudworkers/gateway/boxaccess"
	"github.com/openclaw/cloudworkers/gateway/credentials"
	"github.com/openclaw/cloudworkers/gateway/envs"
	"github.com/openclaw/cloudworkers/gateway/hub"
	"github.com/openclaw/cloudworkers/gateway/inference"
	"github.com/openclaw/cloudworkers/gateway/inference/builtin"
	"github.com/openclaw/cloudworkers/gateway/mcp"
	"github.com/openclaw/cloudworkers/gateway/occ"
	"github.com/openclaw/cloudworkers/gateway/openclaw"
	"github.com/openclaw/cloudworkers/gateway/placement"
	"github.com/openclaw/cloudworkers/gateway/profiles"
	"github.com/openclaw/cloudworkers/gateway/publish"
	"github.com/openclaw/cloudworkers/gateway/sessions"
	"github.com/openclaw/cloudworkers/gateway/spend"
	"github.com/openclaw/cloudworkers/gateway/store"
	"github.com/openclaw/cloudworkers/gateway/tunnel"
	"github.com/openclaw/cloudworkers/gateway/turns"
	"github.com/openclaw/cloudworkers/gateway/websearch"
	"github.com/openclaw/cloudworkers/gateway/workspace"
	"github.com/openclaw/cloudworkers/internal/clock"
	"github.com/openclaw/cloudworkers/internal/shutdown"
	"github.com/openclaw/cloudworkers/internal/version"
	"github.com/openclaw/cloudworkers/providers"
	"github.com/openclaw/cloudworkers/sync/gitsync"
	"github.com/openclaw/cloudworkers/sync/stream"
	"github.com/openclaw/cloudworkers/ui"
	"github.com/openclaw/cloudworkers/worker/tools"
)

// components are the gateway's parts, built floor by floor by Run's steps: the store and the
// catalogue, the worker side (tunnels, hub, bootstrap, environments), the session side (turns,
// dispatch, spawns), then the doors (sign-in, OpenClaw's protocol, /api/v1, /mcp, /occ/v1).
//
// Three parts need one another both ways, so each step wires the one built later through a
// method of components below (turnRuns, envBusy, redispatch, workerOnly, afterWorkerTurn):
// the method reads the field at call time, which is set before Run serves. Following a worker
// turn: api → turns.Service.Send → hub.Server (the tunnel's RPC) → worker; back through the hub's
// turn events into turns (docs/architecture.md, "the path of one turn").
type components struct {
	cfg     Config
	deps    Deps
	log     *slog.Logger
	clk     clock.Clock
	dataDir string
	info    version.Info

	closers *shutdown.Stack // every started component, closed in reverse on the way out
	serving *errgroup.Group // every serving goroutine; one that fails stops the gateway
	ready   atomic.Bool

	// floor 1: the store and what reads it
	token, gatewayID string
	db               *store.DB
	registry         providers.Registry
	profiles         *profiles.Store
	creds            *credentials.Store
	catalog          *inference.Catalog
	ledger           *spend.Ledger // the spend ledger and its budgets
	roots            sessions.Roots
	sessions         *sessions.Store
	credGW           *occ.CredentialGateway
	reg              *prometheus.Registry

	// floor 2: the worker side
	tunnels     *tunnel.Mux
	workerCreds *hub.Credentials
	spawner     *agents.Spawner
	extraTools  []tools.Tool // the gateway-side tools of local turns (spawnTools: while a worker profile exists)
	spawnTools  []tools.Tool
	workers     *hub.Server
	boot        *bootstrap.Bootstrapper
	envs        *envs.Manager

	// floor 3: sessions on the move
	placements *placement.Placements
	turns      *turns.Service
	dispatcher *placement.Dispatcher
	workspace  *workspace.Service
	remover    *turns.Remover
	occCompute atomic.Pointer[occ.Compute] // set by the OCC door; turn admission asks it

	// floor 4: the doors
	proxies   []netip.Prefix
	refusals  *auth.Refusals
	cert      *certificate
	browser   *auth.Browser
	boxAccess *boxaccess.Service
	ocDevices *openclaw.Devices
	ocSrv     *openclaw.Server
	ocUI      *openclaw.ControlUI
	api       *api.Server
	ln        net.Listener
	served    bool // ln belongs to the http server
	mcp       *mcp.Server
}

// audit records an audit row, logging (not failing) when the store refuses it.
func (g *components) audit(ctx context.Context, kind, envID, detail string) {
	if err := g.db.InTx(ctx, func(tx *sql.Tx) error { return store.Audit(ctx, tx, g.clk.Now(), kind, envID, detail) }); err != nil {
		g.log.Warn("audit", "kind", kind, "err", err)
	}
}

func (g *components) sub(name string) *slog.Logger { return g.log.With("subsystem", name) }

func (g *components) tunnelStatus(envID string) string { return string(g.tunnels.Status(envID)) }

// openStore opens the database and everything that only reads and writes it.
func (g *components) openStore(ctx context.Context) error {
	var err error
	if g.token, err = EnsureToken(g.dataDir); err != nil {
		return err
	}
	if g.db, err = store.Open(ctx, filepath.Join(g.dataDir, "gateway.db")); err != nil {
		return err
	}
	g.closers.Push("database", func(context.Context) error { return g.db.Close() })
	if g.gatewayID, err = EnsureGatewayID(ctx, g.db); err != nil {
		return err
	}
	g.log = g.log.With("gateway", g.gatewayID)
	if g.registry, err = g.deps.Providers(g.db, g.dataDir, g.sub("providers")); err != nil {
		return err
	}
	g.profiles = profiles.New(g.db, g.registry, g.sub("profiles"))
	g.profiles.Clock = g.clk
	for _, p := range g.deps.Builtin {
		if err := g.profiles.EnsureBuiltin(ctx, p); err != nil {
			return fmt.Errorf("builtin profile %s: %w", p.ID, err)
		}
	}
	for i := range g.cfg.Profiles {
		if _, err := g.profiles.Put(ctx, &g.cfg.Profiles[i]); err != nil {
			return fmt.Errorf("config profiles[%d]: %w", i, err)
		}
	}
	if !g.hasWorkerProfile(ctx) {
		g.log.Info("no worker profile: sessions run on the gateway; add one with `openclaw profile apply` (docs/cli.md), or start with --dev-local-box for the development-only local box")
	}
	if g.creds, err = credentials.OpenKey(g.db, g.cfg.Credentials.KeyPath(g.dataDir)); err != nil {
		if g.cfg.Credentials.KeyFile != "" {
			return fmt.Errorf("config credentials.keyFile: %w", err)
		}
		return err
	}
	g.creds.Clock = g.clk
	if g.catalog, err = inference.NewCatalog(g.cfg.Models, g.creds, builtin.Adapters()); err != nil {
		return fmt.Errorf("config models: %w", err)
	}
	if g.ledger, err = spend.New(spend.Config{DB: g.db, Clock: g.clk, Log: g.sub("spend"), Budgets: g.cfg.Budgets, Zone: g.cfg.Spend.Zone(),
		Stop: g.stopSpent, Notify: func(kind, id string) { g.sessions.Notify(kind, id) }}); err != nil { // sessions are built below
		return fmt.Errorf("config: %w", err)
	}
	if err := g.ledger.Recover(ctx); err != nil {
		return fmt.Errorf("recover the spend ledger: %w", err)
	}
	g.catalog.SetMeter(meter{g.ledger}) // every model call, on the gateway or a worker, is metered
	if g.roots, err = g.cfg.Workspaces.roots(g.dataDir); err != nil {
		return fmt.Errorf("config: %w", err)
	}
	g.log.Info("workspace roots", "roots", g.roots.Allowed())
	if g.sessions, err = sessions.New(sessions.Config{DB: g.db, Log: g.sub("sessions"), Roots: g.roots,
		CheckModel: func(model string) error { _, err := g.catalog.Resolve(model); return err }}); err != nil {
		return err
	}
	g.closers.Push("sessions", g.sessions.Close)
	// The OCC credential gateway: sources sealed in creds; the hub asks it for the key of each
	// proxied call of an environment that serves an OCC revision (served under /occ/v1/ below).
	g.reg = prometheus.NewRegistry()
	g.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	g.credGW, err = occ.NewCredentialGateway(occ.CredentialGatewayConfig{DB: g.db, Secrets: g.creds, Catalog: g.catalog,
		GatewayID: g.gatewayID, Log: g.sub("occ"), Clock: g.clk})
	return err
}

// buildWorkerSide builds the tunnels, the worker hub that serves on them, the bootstrapper that
// brings boxes to ready, and the environment manager.
func (g *components) buildWorkerSide(context.Context) error {
	g.tunnels = tunnel.NewMux(tunnel.Config{
		Log: g.sub("tunnel"), KeepaliveInterval: g.cfg.Tunnel.KeepaliveInterval.D(),
		KeepaliveTimeout: g.cfg.Tunnel.KeepaliveTimeout.D(), BackoffMax: g.cfg.Tunnel.BackoffMax.D(),
		OnHostKeyMismatch: func(envID string, err *tunnel.HostKeyMismatchError) {
			g.audit(context.Background(), "ssh.hostkey-mismatch", envID, err.Error())
		},
		Clock: g.clk,
	})
	g.closers.Push("tunnels", g.tunnels.Close)
	g.workerCreds = hub.NewCredentials(g.db)
	g.workerCreds.Clock = g.clk
	hubTools, err := g.buildTools()
	if err != nil {
		return err
	}
	hubCfg := hub.Config{
		DB: g.db, Credentials: g.workerCreds, Log: g.sub("hub"), Registerer: g.reg,
		Runs:           turnRuns{g},
		ExpectedBundle: func(envID string) (string, bool) { return g.envs.BundleHash(envID) },
		OnAdmit:        func(envID string) { g.envs.Touch(context.Background(), envID) },
		OnActivity:     func(envID string) { g.envs.Seen(envID) },
		Sessions:       g.sessions, Models: g.catalog, CallCredentials: g.credGW,
		GatewayTools: hubTools, Spawn: g.spawner.WorkerSpawn, Clock: g.clk,
		ExpectedTools: tools.Manifest(),
	}
	g.cfg.configureHub(&hubCfg)
	if g.workers, err = hub.New(hubCfg); err != nil {
		return err
	}
	g.closers.Push("worker hub", g.workers.Close)
	c, box := g.cfg, g.cfg.Box
	g.boot = bootstrap.New(bootstrap.Config{
		Tunnels: g.tunnels, Workers: g.workers, Credentials: g.workerCreds, Audit: g.audit,
		BundleDir: c.BundleDir, Log: g.sub("bootstrap"),
		AdmitTimeout: c.Worker.AdmitTimeout.D(), RelaunchGrace: c.Worker.RelaunchGrace.D(),
		CommandTimeout: box.CommandTimeout.D(), BootstrapTimeout: box.BootstrapTimeout.D(), ReleaseTimeout: box.ReleaseTimeout.D(),
		Keepalive: tunnel.KeepaliveConfig{Interval: c.Tunnel.KeepaliveInterval.D(), Timeout: c.Tunnel.KeepaliveTimeout.D()},
		Clock:     g.clk,
	})
	g.closers.Push("bootstrap", g.boot.Close)
	g.envs = envs.New(envs.Config{
		DB: g.db, Profiles: g.profiles, Providers: g.registry, GatewayID: g.gatewayID,
		Log: g.sub("envs"), SweepInterval: c.Sweep.D(), LifecycleInterval: c.Lifecycle.D(), Bootstrapper: g.boot,
		TunnelStatus: g.tunnelStatus, Clock: g.clk,
		// each environment holds one worker: beyond capacity.maxWorkers, a new one is refused up front
		MaxEnvironments: g.workers.Capacity().MaxWorkers,
		OnRefused:       g.workers.CountRejection,
		Busy:            g.envBusy,
		AdmitLease: func(ctx context.Context, p providers.Profile) (func(), error) {
			r, err := g.ledger.ReserveLease(ctx, p)
			return r.Release, err
		},
	})
	g.closers.Push("environments", g.envs.Close)
	g.boot.SetEnvs(g.envs)
	return nil
}

// buildTools builds the gateway-side tools: those of local turns (g.extraTools) and the subset a
// worker may call through the hub (returned). Workers call sessions_spawn only through its
// closed method (worker.sessions.spawn, bounded by agents.maxSpawnDepth), never as a tool call.
func (g *components) buildTools() ([]tools.Tool, error) {
	if !g.cfg.WebSearch.IsZero() {
		ws, err := websearch.New(g.cfg.WebSearch, g.creds)
		if err != nil {
			return nil, fmt.Errorf("config webSearch: %w", err)
		}
		g.extraTools = append(g.extraTools, ws)
	}
	var err error
	if g.spawner, err = agents.New(g.cfg.Agents); err != nil {
		return nil, fmt.Errorf("config agents: %w", err)
	}
	g.closers.Push("agents", func(context.Context) error { g.spawner.Close(); return nil })
	hubTools := slices.Clone(g.extraTools)
	g.spawnTools = g.spawner.Tools()
	for _, t := range g.spawner.Tools() {
		if t.Name() != agents.SpawnToolName {
			hubTools = append(hubTools, t)
		}
	}
	return hubTools, nil
}

// buildSessionSide builds placements, the turns service, the dispatcher and the remover, and
// starts the spawner on them.
func (g *components) buildSessionSide(ctx context.Context) error {
	g.placements = placement.NewPlacements(g.db)
	g.placements.Clock = g.clk
	g.placements.Notify = g.sessions.Notify // placement changes are on the gateway-wide feed
	var err error
	if g.turns, err = turns.New(ctx, turns.Config{Clock: g.clk, DB: g.db, Sessions: g.sessions, Catalog: g.catalog,
		DataDir: g.dataDir, Log: g.sub("turns"), Workers: g.workers, Placements: g.placements, ExtraTools: g.extraTools,
		SpawnTools: g.spawnTools, WorkerProfiles: g.hasWorkerProfile,
		AfterWorkerTurn: g.afterWorkerTurn, Redispatch: g.redispatch, WorkerOnly: g.workerOnly, Budget: g.ledger.Admit}); err != nil {
		return err
	}
	g.closers.Push("turns", g.turns.Close)
	publisher, err := publish.New(publish.Config{Credentials: g.creds, Log: g.sub("publish")})
	if err != nil {
		return err
	}
	c := g.cfg
	g.dispatcher = placement.NewDispatcher(placement.DispatchConfig{
		Placements: g.placements, Sessions: g.sessions, Envs: g.envs, Boot: g.boot, Admitted: g.workers.Admitted,
		Busy: g.sessionBusy, CancelTurn: g.turns.CancelAndWait, DrainTimeout: c.Placement.DrainTimeout.D(),
		YieldTurn: g.turns.Yield, Unyield: g.turns.Unyield, AfterMove: g.turns.ContinueMoved,
		DataDir: g.dataDir, Log: g.sub("dispatch"),
		Compression: stream.Compression(c.Sync.Compression), Channels: c.Sync.Channels, CheckpointKeep: c.Sync.CheckpointKeep,
		ReserveFreeBytes: c.Sync.ReserveFreeBytes, ReserveFreePercent: c.Sync.ReserveFreePercent,
		SyncTimeout: c.Box.SyncTimeout.D(), ReconcileTimeout: c.Box.ReconcileTimeout.D(),
		SnapshotAuthor:    gitsync.Identity{Name: c.Sync.SnapshotAuthor.Name, Email: c.Sync.SnapshotAuthor.Email},
		GitAuthor:         gitsync.Identity{Name: c.Git.Author.Name, Email: c.Git.Author.Email},
		MaxAllowedSecrets: c.Sync.MaxAllowedSecrets,
		Secrets:           g.secretValues,
		// an OCC revision's environment takes only its agent's session (occ.Compute routes it)
		Reserved: func(e envs.Environment) bool { return occ.ReservedEnvironment(e.IdempotencyKey) },
		Clock:    g.clk,
		PoolCap:  c.Pool.MaxUnassigned,
	})
	g.closers.Push("dispatcher", g.dispatcher.Close)
	var signing *workspace.SigningKey
	if k := c.Git.Signing.Key; k != "" {
		if signing, err = workspace.LoadSigningKey(k); err != nil {
			return err
		}
		g.log.Info("published commits are signed", "key", signing.Fingerprint)
	}
	g.workspace = workspace.New(workspace.Config{Placements: g.placements, Envs: g.envs, Sessions: g.sessions, Signing: signing,
		Dispatcher: g.dispatcher, Publisher: publisher})
	g.spawner.Start(agents.Deps{DB: g.db, Sessions: g.sessions, Turns: g.turns, Dispatcher: g.dispatcher, Workspace: g.workspace, Placements: g.placements,
		Envs: g.envs, Admitted: g.workers.Admitted, DataDir: g.dataDir, Log: g.sub("agents"), Clock: g.clk})
	// session rm (/api/v1) and sessions.delete (OpenClaw's clients)
	g.remover = turns.NewRemover(turns.RemoverConfig{Turns: g.turns, Dispatcher: g.dispatcher, Envs: g.envs,
		PullBackWait: c.Box.ReconcileTimeout.D(), AlsoDelete: []func(context.Context, *sql.Tx, string) error{g.spawner.DeleteTx}})
	g.registerMetrics()
	return nil
}

func (g *components) registerMetrics() {
	g.reg.MustRegister(newStateCollector(g.db, "openclaw_environments", "Environments by state.", "state", stateNames(envs.AllStates),
		`SELECT state, COUNT(*) FROM environments GROUP BY state`))
	g.reg.MustRegister(newStateCollector(g.db, "openclaw_sessions", "Sessions by placement state (local: on the gateway).", "placement", stateNames(placement.AllStates),
		`SELECT COALESCE(p.state, 'local'), COUNT(*) FROM sessions s LEFT JOIN placements p ON p.session_id = s.id GROUP BY 1`))
	g.reg.MustRegister(g.tunnels.Collectors()...)
	g.reg.MustRegister(g.catalog.Collectors()...)
	g.reg.MustRegister(g.envs.Collectors()...)
	g.reg.MustRegister(g.turns.Collectors()...)
	g.reg.MustRegister(g.ledger.Collectors()...)
	g.reg.MustRegister(g.dispatcher.Collectors()...)
}

// The calls that run back up a floor, each read at call time (see components).

// hasWorkerProfile tells whether any worker profile exists (the spawn tools are offered then).
func (g *components) hasWorkerProfile(ctx context.Context) bool {
	list, err := g.profiles.List(ctx)
	return err == nil && len(list) > 0
}

// stopSpent is what a spent budget whose policy is stop does (a session's own budget always is):
// every idle session on a worker whose charges it counts is pulled back, and once its work is home
// its machine is released; a machine whose work could not come home is kept, and its timeline says
// why. Unassigned machines of a counted profile are released too. A running turn is waited for
// (bounded): its next model call is refused, which ends it.
func (g *components) stopSpent(budget string, counts func(spend.Scope) bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	log := g.log.With("budget", budget)
	list, err := g.placements.List(ctx, placement.MaxListedPlacements)
	if err != nil {
		log.Warn("budget spent: list the placements", "err", err)
		return
	}
	var wg sync.WaitGroup
	for _, p := range list {
		if p.State != placement.Active {
			continue
		}
		sc, err := g.ledger.ScopeOf(ctx, p.SessionID)
		if err != nil || !counts(sc) {
			continue
		}
		wg.Go(func() { g.bringHomeAndRelease(ctx, budget, p) })
	}
	wg.Wait()
	g.releaseUnassigned(ctx, counts)
}

// bringHomeAndRelease pulls a session whose budget is spent back from its worker once it is idle
// (a running turn ends at its next model call, which the budget refuses; a checkpoint ends by
// itself), then releases its machine; one whose work did not come home keeps its machine.
func (g *components) bringHomeAndRelease(ctx context.Context, budget string, p placement.Placement) {
	wctx, cancel := context.WithTimeout(ctx, spentIdleWait)
	err := g.placements.Await(wctx, p.SessionID, time.Second, func() (bool, error) { return !g.sessionBusy(p.SessionID), nil })
	cancel()
	if err != nil {
		g.placements.Note(ctx, p.SessionID, "budget "+budget+" is spent: its machine is kept for now, its session stayed busy for "+spentIdleWait.String())
		return
	}
	if now, err := g.placements.Get(ctx, p.SessionID); err != nil || now.State != placement.Active || now.EnvironmentID != p.EnvironmentID {
		return // moved meanwhile: that move decides
	}
	g.log.Warn("budget spent: bringing an idle session's work home to release its machine", "budget", budget, "session", p.SessionID, "env", p.EnvironmentID)
	if _, err := g.dispatcher.PullBack(ctx, p.SessionID, false); err != nil {
		g.placements.Note(ctx, p.SessionID, "budget "+budget+" is spent: its machine is kept, the pull-back was refused: "+err.Error())
		return
	}
	var rest placement.Placement
	_ = g.placements.Await(ctx, p.SessionID, 0, func() (bool, error) {
		var err error
		rest, err = g.placements.Get(ctx, p.SessionID)
		return err == nil && (rest.State == placement.Local || rest.State == placement.Failed), err
	})
	if rest.State != placement.Local {
		g.placements.Note(ctx, p.SessionID, "budget "+budget+" is spent: its machine "+p.EnvironmentID+" is kept, because its work did not come home ("+rest.Error+")")
		return
	}
	if e, err := g.envs.Get(ctx, p.EnvironmentID); err != nil || !g.dispatcher.Unassigned(ctx, e) {
		return // taken again (a dispatch claimed it) or gone: not released here
	}
	if _, err := g.envs.RequestDestroy(ctx, p.EnvironmentID, false); err != nil {
		g.log.Warn("budget spent: release the machine", "budget", budget, "env", p.EnvironmentID, "err", err)
		return
	}
	g.placements.Note(ctx, p.SessionID, "budget "+budget+" is spent: its work came home and its machine "+p.EnvironmentID+" was released")
}

// spentIdleWait bounds how long a spent budget's stop waits for a session to be idle.
const spentIdleWait = 2 * time.Minute

// releaseUnassigned releases the unassigned machines of the profiles a spent budget counts.
func (g *components) releaseUnassigned(ctx context.Context, counts func(spend.Scope) bool) {
	envList, err := g.envs.List(ctx, false)
	if err != nil {
		return
	}
	for _, e := range envList {
		if !counts(spend.Scope{ProfileID: e.ProfileID, EnvironmentID: e.ID}) || !g.dispatcher.Unassigned(ctx, e) {
			continue
		}
		g.log.Warn("budget spent: releasing an unassigned machine", "env", e.ID)
		if _, err := g.envs.RequestDestroy(ctx, e.ID, false); err != nil {
			g.log.Warn("budget spent: release the machine", "env", e.ID, "err", err)
		}
	}
}

// meter is the spend ledger as the catalog's meter: every model call is reserved against the
// budgets and settled from its usage.
type meter struct{ l *spend.Ledger }

func (m meter) ReserveCall(ctx context.Context, session string, worst float64) (inference.Settler, error) {
	r, err := m.l.ReserveCall(ctx, session, worst)
	if err != nil {
		return nil, err
	}
	return r, nil
}

// turnRuns tells the hub which turn of a session runs: the turns service keeps that record.
type turnRuns struct{ g *components }

func (r turnRuns) RunningTurn(ctx context.Context, sessionID string) (string, uint64, bool, error) {
	return r.g.turns.RunningTurn(ctx, sessionID)
}

// Yielding tells the hub to stop a worker's run at its next model call (a live move).
func (r turnRuns) Yielding(sessionID, runID string) bool { return r.g.turns.Yielding(sessionID, runID) }

// envBusy tells the lifetime policy whether an environment is in use by a session.
func (g *components) envBusy(envID string) bool {
	// a move holds its environment at most as long as its longest step may take, and then some
	moveHold := max(orDefault(g.cfg.Box.SyncTimeout, 30*time.Minute), orDefault(g.cfg.Box.ReconcileTimeout, 10*time.Minute)) + 10*time.Minute
	if envInUse(g.placements.ServedBy, g.turns.Busy, envID, g.clk.Now(), moveHold) {
		return true
	}
	// an unassigned machine its profile's prepared pool keeps (pool.maxReady) is not idle
	if g.dispatcher == nil {
		return false
	}
	e, err := g.envs.Get(context.Background(), envID)
	return err == nil && g.dispatcher.PoolHolds(context.Background(), e)
}

// sessionBusy tells the dispatcher whether a session has a turn in flight.
func (g *components) sessionBusy(id string) bool {
	if g.turns.Busy(id) {
		return true
	}
	p, err := g.placements.Get(context.Background(), id)
	return err == nil && p.TurnRunID != ""
}

func (g *components) afterWorkerTurn(id string) { g.dispatcher.AfterTurn(id) }

// redispatch puts a session back on a worker for a message; an OCC agent's session goes back only
// through activateRevision (a fresh lease of the profile would use the catalog's credentials).
func (g *components) redispatch(ctx context.Context, id string) error {
	if only, err := g.workerOnly(ctx, id); err != nil {
		return err
	} else if only {
		return fmt.Errorf("OCC agent session (its next activateRevision places it): %w", turns.ErrWorkerOnly)
	}
	return g.dispatcher.Redispatch(ctx, id)
}

// workerOnly: an OCC agent's session runs only on its activated revision's worker.
func (g *components) workerOnly(ctx context.Context, id string) (bool, error) {
	if c := g.occCompute.Load(); c != nil {
		return c.WorkerOnly(ctx, id)
	}
	return false, nil
}

// secretValues are the values the secret scan of a pull-back looks for.
func (g *components) secretValues(ctx context.Context) (map[string]string, error) {
	v, err := g.creds.Values(ctx)
	if err == nil {
		publish.SecretValues(v)       // a git credential's token alone
		v["@gateway-token"] = g.token // the API bearer token ("@": no stored credential has that name)
	}
	return v, err
}

// buildSignIn builds what every door shares: the refused-authentication log, TLS, the browser
// sessions of the Control UI, and box access.
func (g *components) buildSignIn(ctx context.Context) error {
	var err error
	if g.proxies, err = auth.ParseProxies(g.cfg.TrustedProxies); err != nil {
		return fmt.Errorf("config: trustedProxies: %w", err)
	}
	g.refusals = auth.NewRefusals(g.sub("auth"), g.clk, g.proxies...)
	runOwned(ctx, g.closers, "refused-authentication log", g.refusals.Run)
	if g.cfg.TLS.Enabled() {
		if g.cert, err = loadCertificate(g.cfg.TLS); err != nil {
			return fmt.Errorf("config: %w", err)
		}
		runOwned(ctx, g.closers, "TLS reload", func(ctx context.Context) { g.cert.reloadOnHangup(ctx, g.sub("tls")) })
	}
	if g.browser, err = auth.OpenBrowser(ctx, auth.BrowserConfig{DB: g.db, Token: g.token, Idle: g.cfg.UI.SessionIdle.D(),
		Lifetime: g.cfg.UI.SessionLifetime.D(), TrustedProxies: g.proxies, Refusals: g.refusals, Clock: g.clk, Log: g.sub("auth")}); err != nil {
		return err
	}
	if g.boxAccess, err = boxaccess.New(g.cfg.BoxAccess, boxaccess.Deps{Envs: g.envs, Dial: g.boot.Dial, Audit: g.audit,
		StartTimeout: g.cfg.Box.CommandTimeout.D(), Log: g.sub("boxaccess")}); err != nil {
		return fmt.Errorf("config boxAccess: %w", err)
	}
	return nil
}

// buildOpenClawDoor builds OpenClaw's protocol v4 endpoint (WebSocket upgrades of "/") and,
// when configured, the real Control UI's files.
func (g *components) buildOpenClawDoor(context.Context) error {
	g.ocDevices = openclaw.NewDevices(g.db, g.clk.Now)
	var trace io.Writer
	if f := g.cfg.OpenClawClients.TraceFile; f != "" {
		tf, err := os.OpenFile(f, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
		if err != nil {
			return fmt.Errorf("config openclawClients.traceFile: %w", err)
		}
		g.closers.Push("openclaw trace", func(context.Context) error { return tf.Close() })
		trace = tf
	}
	var err error
	if g.ocSrv, err = newOpenClawDoor(openClawDeps{token: g.token, sessions: g.sessions, turns: g.turns, catalog: g.catalog,
		envs: g.envs, profiles: g.profiles, placements: g.placements, dispatcher: g.dispatcher, dataDir: g.dataDir,
		tunnel: g.tunnelStatus, version: g.info.Version, log: g.sub("openclaw"), trace: trace, signedIn: g.browser.SignedIn,
		maxConns: g.cfg.OpenClawClients.MaxConnections, maxPerDev: g.cfg.OpenClawClients.MaxConnectionsPerDevice, devices: g.ocDevices,
		removeSession: func(ctx context.Context, id string) error {
			_, err := g.remover.Remove(ctx, id, turns.RemoveRefuseHeld)
			return err
		},
		refuse: func(r *http.Request, why string) { g.refusals.Refuse(r, "openclaw", why) }}); err != nil {
		return err
	}
	if root := g.cfg.ControlUI.OpenClawRoot; root != "" {
		if g.ocUI, err = openclaw.NewControlUI(openclaw.ControlUIConfig{Root: root, BasePath: g.cfg.ControlUI.BasePath,
			SignedIn: g.browser.SignedIn, LoginURL: "/login", Version: g.info.Version}); err != nil {
			return fmt.Errorf("config: %w", err)
		}
		g.log.Info("OpenClaw Control UI served", "path", g.ocUI.BasePath()+"/", "root", root)
	}
	return nil
}

// buildAPI builds /api/v1 with every package's routes, and our own Control UI.
func (g *components) buildAPI(context.Context) error {
	controlUI, err := ui.New(ui.Config{Sessions: g.browser, Log: g.sub("ui")})
	if err != nil {
		return err
	}
	g.api = api.New(api.Config{
		Token: g.token, DB: g.db, Profiles: g.profiles, Envs: g.envs, Registry: g.reg,
		Log: g.sub("api"), GatewayID: g.gatewayID, Version: g.info.Version, Ready: g.ready.Load, Bootstrap: true,
		AllowedHosts: g.cfg.AllowedHosts, UI: controlUI, Browser: g.browser, Refusals: g.refusals,
		Transport: &api.Transport{Listen: g.cfg.Listen, Loopback: ListenIsLoopback(g.cfg.Listen), TLS: g.cert != nil,
			TrustedProxies: len(g.proxies)},
		Served: g.servedBy,
		Mount: []func(g *echo.Group){
			func(eg *echo.Group) { openclaw.RegisterDevicesAPI(eg, g.ocDevices, g.ocSrv) },
			func(eg *echo.Group) {
				sessions.RegisterAPI(eg, g.sessions, sessions.WithDispatch(func(ctx context.Context, id, profile, class string) error {
					_, err := g.dispatcher.Dispatch(ctx, id, profile, class)
					return err
				}), sessions.WithTargetCheck(g.dispatcher.CheckTarget))
			},
			func(eg *echo.Group) { inference.RegisterAPI(eg, g.catalog, g.creds) },
			func(eg *echo.Group) { turns.RegisterAPI(eg, g.turns) },
			func(eg *echo.Group) { turns.RegisterRemoveAPI(eg, g.remover) },
			func(eg *echo.Group) { placement.RegisterDispatchAPI(eg, g.dispatcher) },
			func(eg *echo.Group) { spend.RegisterAPI(eg, g.ledger) },
			func(eg *echo.Group) { workspace.RegisterAPI(eg, g.workspace) },
			func(eg *echo.Group) { agents.RegisterAPI(eg, g.spawner) },
			func(eg *echo.Group) { boxaccess.RegisterAPI(eg, g.boxAccess) },
		},
		WorkerInfo: g.workerInfo,
	})
	return nil
}

// servedBy lists the sessions an environment serves.
func (g *components) servedBy(ctx context.Context, envID string) []string {
	ps, _ := g.placements.ServedBy(ctx, envID)
	ids := make([]string, 0, len(ps))
	for _, p := range ps {
		ids = append(ids, p.SessionID)
	}
	return ids
}

// workerInfo is what the API shows of an environment's worker.
func (g *components) workerInfo(envID string) api.WorkerInfo {
	bp := g.workers.Backpressure(envID)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	it, err := g.workers.InferenceTotals(ctx, envID)
	cancel()
	if err != nil {
		g.log.Warn("inference totals", "env", envID, "err", err)
	}
	return api.WorkerInfo{Admitted: g.workers.Admitted(envID), TunnelStatus: g.tunnelStatus(envID), TunnelEpoch: g.tunnels.Epoch(envID),
		Backpressure: bp.Active, Queued: bp.Queued, CapacityRejections: bp.Rejected, Inference: api.InferenceTotals(it),
		Shedding: (*api.Shedding)(bp.Shedding)}
}

// listen binds the API's address (with TLS when configured).
func (g *components) listen(context.Context) error {
	ln, err := net.Listen("tcp", g.cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen %s: %w", g.cfg.Listen, err)
	}
	g.closers.Push("listener", func(context.Context) error {
		if g.served { // the http server closes it
			return nil
		}
		return ln.Close()
	})
	g.ln = ln
	warnCleartext(g.log, g.cfg.Listen, g.cert != nil, len(g.proxies))
	return nil
}

// buildMCP builds /mcp: the MCP server over streamable HTTP, driving this gateway's own API on
// loopback (over TLS with the listener's own certificate pinned, when it serves TLS).
func (g *components) buildMCP(context.Context) error {
	client := api.NewClient(mcp.LoopbackURL(g.ln.Addr()), g.token)
	if g.cert != nil {
		g.ln = tls.NewListener(g.ln, g.cert.serverConfig())
		client.BaseURL = "https" + strings.TrimPrefix(client.BaseURL, "http")
		client.HTTP = g.cert.pinnedClient()
	}
	mcpCfg := g.cfg.MCP.Config(client)
	var err error
	if mcpCfg.Roots, err = g.roots.Narrow("mcp.workspaceRoots", g.cfg.MCP.WorkspaceRoots); err != nil {
		return fmt.Errorf("config: %w", err)
	}
	if mcpCfg.DefaultProfile == "" {
		mcpCfg.DefaultProfile = g.cfg.Agents.DefaultProfile
	}
	mcpCfg.Log = g.sub("mcp")
	mcpCfg.Registry = g.reg
	if g.mcp, err = mcp.New(mcpCfg); err != nil {
		return err
	}
	g.api.Echo.Any("/mcp", echo.WrapHandler(auth.Door("mcp", g.refusals, g.mcp.HTTPHandler(g.token, g.dataDir))))
	return nil
}

// buildOCC builds /occ/v1/: OCC's Compute side, behind its own token (docs/occ.md). Each side
// registers its Driver on the OCC server (see the gateway/occ package comment).
func (g *components) buildOCC(context.Context) error {
	occCfg := g.cfg.OCC
	occCfg.SetDefaults()
	if _, err := occ.EnsureToken(g.dataDir); err != nil {
		return err
	}
	occSrv := occ.NewServer(occ.ServerConfig{DataDir: g.dataDir, Log: g.sub("occ"), MaxBody: occCfg.MaxRequestBytes})
	compute, err := occ.NewCompute(occ.ComputeDeps{
		DB: g.db, Config: occCfg, Profiles: g.profiles, Providers: g.registry, Envs: g.envs, Admitted: g.workers.Admitted,
		RevokeWorkerCredentials: g.workerCreds.RevokeEnv,
		RevokeCredentialSources: g.credGW.RevokeRevision,
		HasSources:              g.credGW.HasSources,
		TunnelStatus:            g.tunnelStatus,
		ReadWorkerLog: func(ctx context.Context, env envs.Environment, maxBytes int) ([]byte, error) {
			return readWorkerLog(ctx, g.boot, env, maxBytes, g.cfg.Box.CommandTimeout.D())
		},
		CreateSession: g.createAgentSession,
		Router:        g.dispatcher,
		ModelKnown: func(model string) bool {
			_, err := g.catalog.Resolve(model)
			return err == nil
		},
		GatewayCommit: g.info.Commit, Log: g.sub("occ"), Clock: g.clk,
	})
	if err != nil {
		return err
	}
	g.occCompute.Store(compute)
	occSrv.RegisterCompute(compute.Driver())
	g.credGW.SetRevisions(compute)
	occSrv.RegisterCredentialGateway(g.credGW.Driver())
	g.api.Echo.Any("/occ/v1/*", echo.WrapHandler(auth.Door("occ", g.refusals, occSrv)))
	return nil
}

// createAgentSession makes an OCC agent's session in a gateway-owned workspace, synced out to
// each revision's box.
func (g *components) createAgentSession(ctx context.Context, title string) (string, error) {
	ws, err := occ.NewAgentWorkspace(g.dataDir)
	if err != nil {
		return "", err
	}
	s, err := g.sessions.Create(ctx, sessions.CreateParams{Title: title, Workspace: ws})
	return s.ID, err
}

// serve serves the doors, then starts the background work that acts on its own: the environment
// manager's reconcile and policy, placements resumed after a restart, and retention.
func (g *components) serve(ctx context.Context) error {
	if g.deps.OnAPI != nil {
		g.deps.OnAPI(g.api)
	}
	// Streams and long polls lift the read and write deadlines for themselves (api.Server.streams).
	g.served = true
	g.serveHTTP("http server", withOpenClaw(g.api, g.ocSrv, g.ocUI, g.cfg.AllowedHosts), g.ln)
	// closed before the http server, so that it has nothing to wait for: OpenClaw clients get the
	// protocol's shutdown event, open /mcp streams end, an open log follow or shell ends at once
	g.closers.Push("openclaw clients", g.ocSrv.Close)
	g.closers.Push("mcp", func(context.Context) error { g.mcp.Close(); return nil })
	g.closers.Push("box access", g.boxAccess.Close)
	if g.cfg.MetricsListen != "" {
		mln, err := net.Listen("tcp", g.cfg.MetricsListen)
		if err != nil {
			return fmt.Errorf("metricsListen %s: %w", g.cfg.MetricsListen, err)
		}
		g.serveHTTP("metrics server", api.New(api.Config{DB: g.db, Registry: g.reg, PublicMetrics: true,
			AllowedHosts: g.cfg.AllowedHosts, Log: g.sub("metrics")}), mln)
		g.log.Info("metrics listening", "listen", mln.Addr().String())
	}
	// workers are admitted only now that every part they may call is built
	g.serving.Go(func() error {
		if err := g.workers.Serve(g.tunnels.Listener()); !errors.Is(err, hub.ErrClosed) {
			g.log.Error("worker hub", "err", err)
			return fmt.Errorf("worker hub: %w", err)
		}
		return nil
	})
	if err := g.envs.Start(ctx); err != nil {
		return err
	}
	if err := g.dispatcher.Resume(ctx); err != nil {
		return err
	}
	// turns a live move left between owners go on where their sessions rest (those still moving
	// go on at the resumed move's end)
	if err := g.turns.ContinueAllMoved(ctx); err != nil {
		return err
	}
	runOwned(ctx, g.closers, "spend ledger", g.ledger.Run)
	runOwned(ctx, g.closers, "prepared pools", g.dispatcher.RunPool)
	runOwned(ctx, g.closers, "retention", func(ctx context.Context) {
		runRetention(ctx, g.clk, g.cfg.Retention, g.db, g.workerCreds, g.workers, g.sub("retention"))
	})
	return nil
}

func (g *components) serveHTTP(name string, h http.Handler, ln net.Listener) {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: APIReadTimeout,
		WriteTimeout: APIWriteTimeout, IdleTimeout: APIIdleTimeout}
	g.closers.Push(name, srv.Shutdown)
	g.serving.Go(func() error {
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			g.log.Error(name, "err", err)
			return fmt.Errorf("%s: %w", name, err)
		}
		return nil
	})
}

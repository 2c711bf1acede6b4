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
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
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
	"github.com/openclaw/cloudworkers/gateway/store"
	"github.com/openclaw/cloudworkers/gateway/tunnel"
	"github.com/openclaw/cloudworkers/gateway/turns"
	"github.com/openclaw/cloudworkers/gateway/websearch"
	"github.com/openclaw/cloudworkers/internal/clock"
	"github.com/openclaw/cloudworkers/internal/ids"
	"github.com/openclaw/cloudworkers/internal/shutdown"
	"github.com/openclaw/cloudworkers/internal/untrusted"
	"github.com/openclaw/cloudworkers/internal/version"
	"github.com/openclaw/cloudworkers/providers"
	"github.com/openclaw/cloudworkers/sync/gitsync"
	"github.com/openclaw/cloudworkers/sync/stream"
	"github.com/openclaw/cloudworkers/ui"
	"github.com/openclaw/cloudworkers/worker/tools"
)

// Deps are the parts wired explicitly by cmd/openclaw.
type Deps struct {
	// Providers builds the provider registry once the data dir and database are open.
	Providers func(db *store.DB, dataDir string, log *slog.Logger) (providers.Registry, error)
	// Builtin profiles are created on first start when missing (an operator may edit them later).
	Builtin []providers.Profile
	Log     *slog.Logger
	// OnReady, if set, is called with the bound address once the gateway serves.
	OnReady func(addr string)
	// OnAPI, if set, is called with the API server once every route is mounted (the OpenAPI test
	// walks its router).
	OnAPI func(*api.Server)
	// Clock is the one clock of every component (tunnels, worker hub, bootstrap, environments,
	// dispatch); the real clock when nil.
	Clock clock.Clock
}

// DrainTimeout bounds a gateway's stop: every component is closed, in reverse start order, within it.
const DrainTimeout = 15 * time.Second

// Run runs the gateway until ctx ends, then drains and stops.
func Run(ctx context.Context, cfg Config, deps Deps) error {
	cfg.SetDefaults()
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("config: %w", err)
	}
	log := deps.Log
	if log == nil {
		log = slog.Default()
	}
	dataDir, err := filepath.Abs(cfg.DataDir)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return fmt.Errorf("create data dir: %w", err)
	}
	if tightened, err := TightenDataDir(dataDir); err != nil {
		return err
	} else if len(tightened) > 0 {
		log.Warn("data dir: access by other users removed", "dataDir", dataDir, "paths", tightened)
	}
	lock, err := LockDataDir(dataDir)
	if err != nil {
		return err
	}
	defer lock.Release()
	clk := clock.Or(deps.Clock)

	// Every long-lived component is pushed on closers once it has started, and every serving
	// goroutine runs in serving; a server that fails stops the gateway. On the way out, whatever
	// the way, the components are closed in reverse start order under DrainTimeout, and then the
	// serving goroutines (which end with their components) are waited for.
	var closers shutdown.Stack
	serving, servingCtx := errgroup.WithContext(ctx)
	stopped := false // the way out through the drain below
	defer func() {
		if stopped {
			return
		}
		dctx, cancel := context.WithTimeout(context.Background(), DrainTimeout)
		defer cancel()
		if err := errors.Join(closers.Close(dctx), serving.Wait()); err != nil {
			log.Warn("gateway stop after a failed start", "err", err)
		}
	}()

	token, err := EnsureToken(dataDir)
	if err != nil {
		return err
	}
	db, err := store.Open(ctx, filepath.Join(dataDir, "gateway.db"))
	if err != nil {
		return err
	}
	defer db.Close()
	gatewayID, err := EnsureGatewayID(ctx, db)
	if err != nil {
		return err
	}
	log = log.With("gateway", gatewayID)

	registry, err := deps.Providers(db, dataDir, log.With("subsystem", "providers"))
	if err != nil {
		return err
	}
	profStore := profiles.New(db, registry, log.With("subsystem", "profiles"))
	profStore.Clock = clk
	for _, p := range deps.Builtin {
		if err := profStore.EnsureBuiltin(ctx, p); err != nil {
			return fmt.Errorf("builtin profile %s: %w", p.ID, err)
		}
	}
	for i := range cfg.Profiles {
		if _, err := profStore.Put(ctx, &cfg.Profiles[i]); err != nil {
			return fmt.Errorf("config profiles[%d]: %w", i, err)
		}
	}
	// The worker side: one hub listener for all tunnels, the worker endpoint served on it, and the
	// bootstrapper that brings boxes to ready.
	auditFn := func(ctx context.Context, kind, envID, detail string) {
		if err := db.InTx(ctx, func(tx *sql.Tx) error { return store.Audit(ctx, tx, clk.Now(), kind, envID, detail) }); err != nil {
			log.Warn("audit", "kind", kind, "err", err)
		}
	}
	var mgr *envs.Manager
	tunnels := tunnel.NewMux(tunnel.Config{
		Log:               log.With("subsystem", "tunnel"),
		KeepaliveInterval: cfg.Tunnel.KeepaliveInterval.D(),
		KeepaliveTimeout:  cfg.Tunnel.KeepaliveTimeout.D(),
		BackoffMax:        cfg.Tunnel.BackoffMax.D(),
		OnHostKeyMismatch: func(envID string, err *tunnel.HostKeyMismatchError) {
			auditFn(context.Background(), "ssh.hostkey-mismatch", envID, err.Error())
		},
		Clock: clk,
	})
	closers.Push("tunnels", tunnels.Close)
	creds, err := credentials.OpenKey(db, cfg.Credentials.KeyPath(dataDir))
	if err != nil {
		if cfg.Credentials.KeyFile != "" {
			return fmt.Errorf("config credentials.keyFile: %w", err)
		}
		return err
	}
	creds.Clock = clk
	catalog, err := inference.NewCatalog(cfg.Models, creds, builtin.Adapters())
	if err != nil {
		return fmt.Errorf("config models: %w", err)
	}
	roots, err := cfg.Workspaces.roots(dataDir)
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}
	log.Info("workspace roots", "roots", roots.Allowed())
	sess, err := sessions.New(sessions.Config{DB: db, Log: log.With("subsystem", "sessions"), Roots: roots,
		CheckModel: func(model string) error { _, err := catalog.Resolve(model); return err }})
	if err != nil {
		return err
	}
	closers.Push("sessions", sess.Close)

	// The OCC credential gateway: sources sealed in creds; the hub asks it for the key of each
	// proxied call of an environment that serves an OCC revision (served under /occ/v1/ below).
	credGW, err := occ.NewCredentialGateway(occ.CredentialGatewayConfig{DB: db, Secrets: creds, Catalog: catalog,
		GatewayID: gatewayID, Log: log.With("subsystem", "occ"), Clock: clk})
	if err != nil {
		return err
	}

	workerCreds := hub.NewCredentials(db)
	workerCreds.Clock = clk
	var extraTools []tools.Tool
	if !cfg.WebSearch.IsZero() {
		ws, err := websearch.New(cfg.WebSearch, creds)
		if err != nil {
			return fmt.Errorf("config webSearch: %w", err)
		}
		extraTools = append(extraTools, ws)
	}
	spawner, err := agents.New(cfg.Agents)
	if err != nil {
		return fmt.Errorf("config agents: %w", err)
	}
	closers.Push("agents", func(context.Context) error { spawner.Close(); return nil })
	// Workers call sessions_spawn only through its closed method (worker.sessions.spawn, bounded by
	// agents.maxSpawnDepth), never as a worker.tool.call.
	hubTools := slices.Clone(extraTools)
	extraTools = append(extraTools, spawner.Tools()...)
	for _, t := range spawner.Tools() {
		if t.Name() != agents.SpawnToolName {
			hubTools = append(hubTools, t)
		}
	}
	var turnSvc *turns.Service                 // built below; workers ask it only once turns run
	var occCompute atomic.Pointer[occ.Compute] // built below; turn admission asks it
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	var envBusy func(envID string) bool // set once the dispatcher is built
	hubCfg := hub.Config{
		DB: db, Credentials: workerCreds, Log: log.With("subsystem", "hub"), Registerer: reg,
		TurnRunning: func(ctx context.Context, sessionID, runID string) (bool, error) {
			t, err := turnSvc.Get(ctx, runID)
			if errors.Is(err, store.ErrNotFound) {
				return false, nil
			}
			return err == nil && t.SessionID == sessionID && t.Status == turns.TurnRunning, err
		},
		ExpectedBundle:  func(envID string) (string, bool) { return mgr.BundleHash(envID) },
		OnAdmit:         func(envID string) { mgr.Touch(context.Background(), envID) },
		OnActivity:      func(envID string) { mgr.Seen(envID) },
		Sessions:        sess,
		Models:          catalog,
		CallCredentials: credGW,
		GatewayTools:    hubTools,
		Spawn:           spawner.WorkerSpawn,
		Clock:           clk,
	}
	cfg.configureHub(&hubCfg)
	workers, err := hub.New(hubCfg)
	if err != nil {
		return err
	}
	closers.Push("worker hub", workers.Close)
	serving.Go(func() error {
		if err := workers.Serve(tunnels.Listener()); !errors.Is(err, hub.ErrClosed) {
			log.Error("worker hub", "err", err)
			return fmt.Errorf("worker hub: %w", err)
		}
		return nil
	})
	boot := bootstrap.New(bootstrap.Config{
		Tunnels: tunnels, Workers: workers, Credentials: workerCreds, Audit: auditFn,
		BundleDir: cfg.BundleDir, Log: log.With("subsystem", "bootstrap"),
		AdmitTimeout: cfg.Worker.AdmitTimeout.D(), RelaunchGrace: cfg.Worker.RelaunchGrace.D(),
		CommandTimeout: cfg.Box.CommandTimeout.D(), BootstrapTimeout: cfg.Box.BootstrapTimeout.D(), ReleaseTimeout: cfg.Box.ReleaseTimeout.D(),
		Keepalive: tunnel.KeepaliveConfig{Interval: cfg.Tunnel.KeepaliveInterval.D(), Timeout: cfg.Tunnel.KeepaliveTimeout.D()},
		Clock:     clk,
	})
	closers.Push("bootstrap", boot.Close)
	mgr = envs.New(envs.Config{
		DB: db, Profiles: profStore, Providers: registry, GatewayID: gatewayID,
		Log: log.With("subsystem", "envs"), SweepInterval: cfg.Sweep.D(),
		LifecycleInterval: cfg.Lifecycle.D(), Bootstrapper: boot,
		TunnelStatus: func(envID string) string { return string(tunnels.Status(envID)) },
		Clock:        clk,
		// each environment holds one worker: beyond capacity.maxWorkers, a new one is refused up front
		MaxEnvironments: workers.Capacity().MaxWorkers,
		OnRefused:       workers.CountRejection,
		// an environment whose session has a turn in flight is working, whatever passes through
		Busy: func(envID string) bool { return envBusy != nil && envBusy(envID) },
	})
	closers.Push("environments", mgr.Close)
	boot.SetEnvs(mgr)

	placements := placement.NewPlacements(db)
	placements.Clock = clk
	// placement changes are on the gateway-wide feed
	placements.Notify = sess.Notify
	var dispatcher *placement.Dispatcher // built below; turns call it only after Run has started
	turnSvc, err = turns.New(ctx, turns.Config{Clock: clk, DB: db, Sessions: sess, Catalog: catalog, DataDir: dataDir,
		Log: log.With("subsystem", "turns"), Workers: workers, Placements: placements, ExtraTools: extraTools,
		AfterWorkerTurn: func(id string) { dispatcher.AfterTurn(id) },
		Redispatch: func(ctx context.Context, id string) error {
			// an OCC agent's session goes back to a worker only through activateRevision (a fresh
			// lease of the profile would make its model calls with the catalog's credentials)
			if c := occCompute.Load(); c != nil {
				only, err := c.WorkerOnly(ctx, id)
				if err != nil {
					return err
				}
				if only {
					return fmt.Errorf("OCC agent session (its next activateRevision places it): %w", turns.ErrWorkerOnly)
				}
			}
			return dispatcher.Redispatch(ctx, id)
		},
		// an OCC agent's session runs only on its activated revision's worker
		WorkerOnly: func(ctx context.Context, id string) (bool, error) {
			if c := occCompute.Load(); c != nil {
				return c.WorkerOnly(ctx, id)
			}
			return false, nil
		},
	})
	if err != nil {
		return err
	}
	closers.Push("turns", turnSvc.Close)
	publisher, err := publish.New(publish.Config{Credentials: creds, Log: log.With("subsystem", "publish")})
	if err != nil {
		return err
	}
	dispatcher = placement.NewDispatcher(placement.DispatchConfig{
		Placements: placements, Sessions: sess, Envs: mgr, Boot: boot, Admitted: workers.Admitted,
		Busy: func(id string) bool {
			if turnSvc.Busy(id) {
				return true
			}
			p, err := placements.Get(context.Background(), id)
			return err == nil && p.TurnRunID != ""
		},
		DataDir: dataDir, Log: log.With("subsystem", "dispatch"),
		Compression: stream.Compression(cfg.Sync.Compression), Channels: cfg.Sync.Channels, CheckpointKeep: cfg.Sync.CheckpointKeep,
		ReserveFreeBytes: cfg.Sync.ReserveFreeBytes, ReserveFreePercent: cfg.Sync.ReserveFreePercent,
		SyncTimeout: cfg.Box.SyncTimeout.D(), ReconcileTimeout: cfg.Box.ReconcileTimeout.D(),
		SnapshotAuthor:    gitsync.Identity{Name: cfg.Sync.SnapshotAuthor.Name, Email: cfg.Sync.SnapshotAuthor.Email},
		MaxAllowedSecrets: cfg.Sync.MaxAllowedSecrets,
		Publisher:         publisher,
		Secrets: func(ctx context.Context) (map[string]string, error) {
			v, err := creds.Values(ctx)
			if err == nil {
				publish.SecretValues(v)     // a git credential's token alone
				v["@gateway-token"] = token // the API bearer token ("@": no stored credential has that name)
			}
			return v, err
		},
		// an OCC revision's environment takes only its agent's session (occ.Compute routes it)
		Reserved: func(e envs.Environment) bool { return occ.ReservedEnvironment(e.IdempotencyKey) },
		Clock:    clk,
	})
	closers.Push("dispatcher", dispatcher.Close)
	// a move holds its environment at most as long as its longest step may take, and then some
	moveHold := max(orDefault(cfg.Box.SyncTimeout, 30*time.Minute), orDefault(cfg.Box.ReconcileTimeout, 10*time.Minute)) + 10*time.Minute
	envBusy = func(envID string) bool {
		return envInUse(placements.ServedBy, turnSvc.Busy, envID, clk.Now(), moveHold)
	}
	spawner.Start(agents.Deps{DB: db, Sessions: sess, Turns: turnSvc, Dispatcher: dispatcher, Placements: placements,
		Envs: mgr, Admitted: workers.Admitted, DataDir: dataDir, Log: log.With("subsystem", "agents"), Clock: clk})

	reg.MustRegister(newStateCollector(db, "openclaw_environments", "Environments by state.", "state", stateNames(envs.AllStates),
		`SELECT state, COUNT(*) FROM environments GROUP BY state`))
	reg.MustRegister(newStateCollector(db, "openclaw_sessions", "Sessions by placement state (local: on the gateway).", "placement", stateNames(placement.AllStates),
		`SELECT COALESCE(p.state, 'local'), COUNT(*) FROM sessions s LEFT JOIN placements p ON p.session_id = s.id GROUP BY 1`))
	reg.MustRegister(tunnels.Collectors()...)
	reg.MustRegister(catalog.Collectors()...)
	reg.MustRegister(mgr.Collectors()...)
	reg.MustRegister(turnSvc.Collectors()...)
	reg.MustRegister(dispatcher.Collectors()...)

	// Sign-in: refused authentications of every door go to one log, aggregated per source and
	// minute; the Control UI signs in with one-time codes for browser sessions (gateway/auth).
	proxies, err := auth.ParseProxies(cfg.TrustedProxies)
	if err != nil {
		return fmt.Errorf("config: trustedProxies: %w", err)
	}
	refusals := auth.NewRefusals(log.With("subsystem", "auth"), clk, proxies...)
	runOwned(ctx, &closers, "refused-authentication log", refusals.Run)
	var cert *certificate
	if cfg.TLS.Enabled() {
		if cert, err = loadCertificate(cfg.TLS); err != nil {
			return fmt.Errorf("config: %w", err)
		}
		runOwned(ctx, &closers, "TLS reload", func(ctx context.Context) { cert.reloadOnHangup(ctx, log.With("subsystem", "tls")) })
	}
	browser, err := auth.OpenBrowser(ctx, auth.BrowserConfig{DB: db, Token: token, Idle: cfg.UI.SessionIdle.D(),
		Lifetime: cfg.UI.SessionLifetime.D(), TrustedProxies: proxies, Refusals: refusals, Clock: clk, Log: log.With("subsystem", "auth")})
	if err != nil {
		return err
	}
	controlUI, err := ui.New(ui.Config{Sessions: browser, Log: log.With("subsystem", "ui")})
	if err != nil {
		return err
	}
	boxAccess, err := boxaccess.New(cfg.BoxAccess, boxaccess.Deps{Envs: mgr, Dial: boot.Dial, Audit: auditFn,
		StartTimeout: cfg.Box.CommandTimeout.D(), Log: log.With("subsystem", "boxaccess")})
	if err != nil {
		return fmt.Errorf("config boxAccess: %w", err)
	}
	var ready atomic.Bool
	info, _ := version.Get()
	// session rm (/api/v1) and sessions.delete (OpenClaw's clients)
	remover := turns.NewRemover(turns.RemoverConfig{Turns: turnSvc, Dispatcher: dispatcher, Envs: mgr, PullBackWait: cfg.Box.ReconcileTimeout.D(),
		AlsoDelete: []func(context.Context, *sql.Tx, string) error{spawner.DeleteTx}})
	// OpenClaw's own clients: the protocol v4 endpoint on WebSocket upgrades of "/".
	ocDevices := openclaw.NewDevices(db, clk.Now)
	var ocTrace io.Writer
	if f := cfg.OpenClawClients.TraceFile; f != "" {
		tf, err := os.OpenFile(f, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
		if err != nil {
			return fmt.Errorf("config openclawClients.traceFile: %w", err)
		}
		closers.Push("openclaw trace", func(context.Context) error { return tf.Close() })
		ocTrace = tf
	}
	ocSrv, err := newOpenClawDoor(openClawDeps{token: token, sessions: sess, turns: turnSvc, catalog: catalog, envs: mgr, profiles: profStore,
		placements: placements, dispatcher: dispatcher, dataDir: dataDir, tunnel: func(envID string) string { return string(tunnels.Status(envID)) },
		version: info.Version, log: log.With("subsystem", "openclaw"), trace: ocTrace, signedIn: browser.SignedIn,
		maxConns: cfg.OpenClawClients.MaxConnections, maxPerDev: cfg.OpenClawClients.MaxConnectionsPerDevice, devices: ocDevices,
		removeSession: func(ctx context.Context, id string) error {
			_, err := remover.Remove(ctx, id, turns.RemoveRefuseHeld)
			return err
		},
		refuse: func(r *http.Request, why string) { refusals.Refuse(r, "openclaw", why) }})
	if err != nil {
		return err
	}
	var ocUI *openclaw.ControlUI
	if cfg.ControlUI.OpenClawRoot != "" {
		if ocUI, err = openclaw.NewControlUI(openclaw.ControlUIConfig{Root: cfg.ControlUI.OpenClawRoot, BasePath: cfg.ControlUI.BasePath,
			SignedIn: browser.SignedIn, LoginURL: "/login", Version: info.Version}); err != nil {
			return fmt.Errorf("config: %w", err)
		}
		log.Info("OpenClaw Control UI served", "path", ocUI.BasePath()+"/", "root", cfg.ControlUI.OpenClawRoot)
	}
	srv := api.New(api.Config{
		Token: token, DB: db, Profiles: profStore, Envs: mgr, Registry: reg,
		Log: log.With("subsystem", "api"), GatewayID: gatewayID, Version: info.Version, Ready: ready.Load, Bootstrap: true,
		AllowedHosts: cfg.AllowedHosts, UI: controlUI, Browser: browser, Refusals: refusals,
		Transport: &api.Transport{Listen: cfg.Listen, Loopback: ListenIsLoopback(cfg.Listen), TLS: cert != nil, TrustedProxies: len(proxies)},
		Served: func(ctx context.Context, envID string) []string {
			ps, _ := placements.ServedBy(ctx, envID)
			ids := make([]string, 0, len(ps))
			for _, p := range ps {
				ids = append(ids, p.SessionID)
			}
			return ids
		},
		Mount: []func(g *echo.Group){
			func(g *echo.Group) { openclaw.RegisterDevicesAPI(g, ocDevices, ocSrv) },
			func(g *echo.Group) {
				sessions.RegisterAPI(g, sess, sessions.WithDispatch(func(ctx context.Context, id, profile, class string) error {
					_, err := dispatcher.Dispatch(ctx, id, profile, class)
					return err
				}), sessions.WithTargetCheck(dispatcher.CheckTarget))
			},
			func(g *echo.Group) { inference.RegisterAPI(g, catalog, creds) },
			func(g *echo.Group) { turns.RegisterAPI(g, turnSvc) },
			func(g *echo.Group) {
				turns.RegisterRemoveAPI(g, remover)
			},
			func(g *echo.Group) { placement.RegisterDispatchAPI(g, dispatcher) },
			func(g *echo.Group) { agents.RegisterAPI(g, spawner) },
			func(g *echo.Group) { boxaccess.RegisterAPI(g, boxAccess) },
		},
		WorkerInfo: func(envID string) api.WorkerInfo {
			bp := workers.Backpressure(envID)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			it, err := workers.InferenceTotals(ctx, envID)
			cancel()
			if err != nil {
				log.Warn("inference totals", "env", envID, "err", err)
			}
			return api.WorkerInfo{Admitted: workers.Admitted(envID), TunnelStatus: string(tunnels.Status(envID)), TunnelEpoch: tunnels.Epoch(envID),
				Backpressure: bp.Active, Queued: bp.Queued, CapacityRejections: bp.Rejected, Inference: api.InferenceTotals(it),
				Shedding: (*api.Shedding)(bp.Shedding)}
		},
	})
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen %s: %w", cfg.Listen, err)
	}
	warnCleartext(log, cfg.Listen, cert != nil, len(proxies))
	// /mcp: the MCP server over streamable HTTP, driving this gateway's own API on loopback
	// (over TLS with the listener's own certificate pinned, when it serves TLS).
	mcpClient := api.NewClient(mcp.LoopbackURL(ln.Addr()), token)
	if cert != nil {
		ln = tls.NewListener(ln, cert.serverConfig())
		mcpClient.BaseURL = "https" + strings.TrimPrefix(mcpClient.BaseURL, "http")
		mcpClient.HTTP = cert.pinnedClient()
	}
	mcpCfg := cfg.MCP.Config(mcpClient)
	if mcpCfg.Roots, err = roots.Narrow("mcp.workspaceRoots", cfg.MCP.WorkspaceRoots); err != nil {
		ln.Close()
		return fmt.Errorf("config: %w", err)
	}
	if mcpCfg.DefaultProfile == "" {
		mcpCfg.DefaultProfile = cfg.Agents.DefaultProfile
	}
	mcpCfg.Log = log.With("subsystem", "mcp")
	mcpCfg.Registry = reg
	mcpSrv, err := mcp.New(mcpCfg)
	if err != nil {
		ln.Close()
		return err
	}
	srv.Echo.Any("/mcp", echo.WrapHandler(auth.Door("mcp", refusals, mcpSrv.HTTPHandler(token, dataDir))))
	// /occ/v1/: OCC's Compute side, behind its own token (docs/occ.md). Each side registers its
	// Driver on occSrv (see the gateway/occ package comment).
	occCfg := cfg.OCC
	occCfg.SetDefaults()
	if _, err := occ.EnsureToken(dataDir); err != nil {
		ln.Close()
		return err
	}
	occSrv := occ.NewServer(occ.ServerConfig{DataDir: dataDir, Log: log.With("subsystem", "occ"), MaxBody: occCfg.MaxRequestBytes})
	compute, err := occ.NewCompute(occ.ComputeDeps{
		DB: db, Config: occCfg, Profiles: profStore, Providers: registry, Envs: mgr, Admitted: workers.Admitted,
		RevokeWorkerCredentials: workerCreds.RevokeEnv,
		RevokeCredentialSources: credGW.RevokeRevision,
		HasSources:              credGW.HasSources,
		TunnelStatus:            func(envID string) string { return string(tunnels.Status(envID)) },
		ReadWorkerLog: func(ctx context.Context, env envs.Environment, maxBytes int) ([]byte, error) {
			return readWorkerLog(ctx, boot, env, maxBytes, cfg.Box.CommandTimeout.D())
		},
		CreateSession: func(ctx context.Context, title string) (string, error) {
			// the agent's workspace: a gateway-owned directory, synced out to each revision's box
			ws, err := occ.NewAgentWorkspace(dataDir)
			if err != nil {
				return "", err
			}
			s, err := sess.Create(ctx, sessions.CreateParams{Title: title, Workspace: ws})
			return s.ID, err
		},
		Router: dispatcher,
		ModelKnown: func(model string) bool {
			_, err := catalog.Resolve(model)
			return err == nil
		},
		GatewayCommit: info.Commit, Log: log.With("subsystem", "occ"), Clock: clk,
	})
	if err != nil {
		ln.Close()
		return err
	}
	occCompute.Store(compute)
	occSrv.RegisterCompute(compute.Driver())
	credGW.SetRevisions(compute)
	occSrv.RegisterCredentialGateway(credGW.Driver())
	srv.Echo.Any("/occ/v1/*", echo.WrapHandler(auth.Door("occ", refusals, occSrv)))
	if deps.OnAPI != nil {
		deps.OnAPI(srv)
	}
	// Streams and long polls lift the read and write deadlines for themselves (api.Server.streams).
	httpSrv := &http.Server{Handler: withOpenClaw(srv, ocSrv, ocUI, cfg.AllowedHosts), ReadHeaderTimeout: 10 * time.Second, ReadTimeout: APIReadTimeout,
		WriteTimeout: APIWriteTimeout, IdleTimeout: APIIdleTimeout}
	serve := func(name string, srv *http.Server, ln net.Listener) {
		closers.Push(name, srv.Shutdown)
		serving.Go(func() error {
			if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
				log.Error(name, "err", err)
				return fmt.Errorf("%s: %w", name, err)
			}
			return nil
		})
	}
	serve("http server", httpSrv, ln)
	// closed before the http server: OpenClaw clients get the protocol's shutdown event
	closers.Push("openclaw clients", ocSrv.Close)
	// closed before the http server: its open /mcp streams end first
	closers.Push("mcp", func(context.Context) error { mcpSrv.Close(); return nil })
	// closed before the http server too: an open log follow or shell ends at once
	closers.Push("box access", boxAccess.Close)
	if cfg.MetricsListen != "" {
		mln, err := net.Listen("tcp", cfg.MetricsListen)
		if err != nil {
			return fmt.Errorf("metricsListen %s: %w", cfg.MetricsListen, err)
		}
		metricsSrv := &http.Server{Handler: api.New(api.Config{DB: db, Registry: reg, PublicMetrics: true, AllowedHosts: cfg.AllowedHosts,
			Log: log.With("subsystem", "metrics")}), ReadHeaderTimeout: 10 * time.Second, ReadTimeout: APIReadTimeout,
			WriteTimeout: APIWriteTimeout, IdleTimeout: APIIdleTimeout}
		serve("metrics server", metricsSrv, mln)
		log.Info("metrics listening", "listen", mln.Addr().String())
	}

	if err := mgr.Start(ctx); err != nil {
		return err
	}
	if err := dispatcher.Resume(ctx); err != nil {
		return err
	}
	pruneCtx, stopPrune := context.WithCancel(ctx)
	pruneDone := make(chan struct{})
	go func() {
		defer close(pruneDone)
		runRetention(pruneCtx, cfg.Retention, db, workerCreds, workers, log.With("subsystem", "retention"))
	}()
	closers.Push("retention", func(ctx context.Context) error {
		stopPrune()
		select {
		case <-pruneDone:
			return nil
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	})
	ready.Store(true)
	addr := ln.Addr().String()
	log.Info("gateway ready", "listen", addr, "dataDir", dataDir, "version", info.Version)
	if deps.OnReady != nil {
		deps.OnReady(addr)
	}

	<-servingCtx.Done() // ctx ended, or a server failed (it logged why)
	if ctx.Err() != nil {
		log.Info("gateway stopping")
	}
	ready.Store(false)
	drainCtx, cancel := context.WithTimeout(context.Background(), DrainTimeout)
	defer cancel()
	closeErr := closers.Close(drainCtx)
	serveErr := serving.Wait()
	stopped = true
	log.Info("gateway stopped")
	return errors.Join(closeErr, serveErr)
}

// Timeouts of the API server's connections (streams and long polls lift the first two).
const (
	APIReadTimeout  = time.Minute
	APIWriteTimeout = 2 * time.Minute
	APIIdleTimeout  = 2 * time.Minute
)

// EnsureGatewayID returns this gateway's stable id, generating it on first start.
func EnsureGatewayID(ctx context.Context, db *store.DB) (string, error) {
	var id string
	err := db.InTx(ctx, func(tx *sql.Tx) error {
		err := tx.QueryRowContext(ctx, `SELECT value FROM gateway_meta WHERE key='gateway_id'`).Scan(&id)
		if err == nil {
			return nil
		}
		if !errors.Is(err, sql.ErrNoRows) {
			return err
		}
		id = "gw_" + ids.Hex(6)
		_, err = tx.ExecContext(ctx, `INSERT INTO gateway_meta(key, value) VALUES('gateway_id', ?)`, id)
		return err
	})
	return id, err
}

// readWorkerLog returns at most maxBytes of the end of an environment's worker log on its box.
func readWorkerLog(ctx context.Context, boot *bootstrap.Bootstrapper, env envs.Environment, maxBytes int, timeout time.Duration) ([]byte, error) {
	if timeout <= 0 {
		timeout = time.Minute
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	c, err := boot.Dial(ctx, env)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	logPath := path.Join(env.WorkerHome, bootstrap.StateDir(env.ID), "worker.log")
	res, err := bootstrap.Run(ctx, c, fmt.Sprintf("tail -c %d %s 2>/dev/null || true", maxBytes, untrusted.Quote(logPath)))
	if err != nil {
		return nil, err
	}
	return []byte(res.Stdout), nil
}

// envInUse reports whether an environment is in use by a session, so that the lifetime policy
// does not stop it for idleness: a session on it runs a turn, or a session is moving onto it or
// off it (provisioning, syncing, starting, draining, reconciling: the environment is ready but not
// yet attached, or no longer, while the move works on its box). A move counts for moveHold after
// its last transition: one stuck past its longest step does not keep a paid machine forever.
func envInUse(servedBy func(context.Context, string) ([]placement.Placement, error), turnBusy func(string) bool, envID string, now time.Time, moveHold time.Duration) bool {
	ps, err := servedBy(context.Background(), envID)
	if err != nil {
		return false
	}
	for _, p := range ps {
		if turnBusy(p.SessionID) || p.TurnRunID != "" {
			return true
		}
		if p.State != placement.Active && now.Sub(store.ParseTime(p.UpdatedAt)) < moveHold {
			return true
		}
	}
	return false
}

package gateway

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/openclaw/cloudworkers/gateway/api"
	"github.com/openclaw/cloudworkers/gateway/bootstrap"
	"github.com/openclaw/cloudworkers/gateway/envs"
	"github.com/openclaw/cloudworkers/gateway/placement"
	"github.com/openclaw/cloudworkers/gateway/store"
	"github.com/openclaw/cloudworkers/internal/clock"
	"github.com/openclaw/cloudworkers/internal/ids"
	"github.com/openclaw/cloudworkers/internal/shutdown"
	"github.com/openclaw/cloudworkers/internal/untrusted"
	"github.com/openclaw/cloudworkers/internal/version"
	"github.com/openclaw/cloudworkers/providers"
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
	g := &components{cfg: cfg, deps: deps, log: deps.Log, clk: clock.Or(deps.Clock), closers: &shutdown.Stack{}}
	if g.log == nil {
		g.log = slog.Default()
	}
	g.info, _ = version.Get()
	lock, err := g.openDataDir()
	if err != nil {
		return err
	}
	defer lock.Release()

	// Every long-lived component is pushed on closers once it has started, and every serving
	// goroutine runs in serving; a server that fails stops the gateway. On the way out, whatever
	// the way, the components are closed in reverse start order under DrainTimeout, and then the
	// serving goroutines (which end with their components) are waited for.
	serving, servingCtx := errgroup.WithContext(ctx)
	g.serving = serving
	stop := func() error {
		g.ready.Store(false)
		dctx, cancel := context.WithTimeout(context.Background(), DrainTimeout)
		defer cancel()
		return errors.Join(g.closers.Close(dctx), serving.Wait())
	}
	for _, step := range []func(context.Context) error{
		g.openStore, g.buildWorkerSide, g.buildSessionSide, // the engine, floor by floor
		g.buildSignIn, g.buildOpenClawDoor, g.buildAPI, g.listen, g.buildMCP, g.buildOCC, // the doors
		g.serve,
	} {
		if err := step(ctx); err != nil {
			if serr := stop(); serr != nil {
				g.log.Warn("gateway stop after a failed start", "err", serr)
			}
			return err
		}
	}
	g.ready.Store(true)
	addr := g.ln.Addr().String()
	g.log.Info("gateway ready", "listen", addr, "dataDir", g.dataDir, "version", g.info.Version)
	if deps.OnReady != nil {
		deps.OnReady(addr)
	}
	<-servingCtx.Done() // ctx ended, or a server failed (it logged why)
	if ctx.Err() != nil {
		g.log.Info("gateway stopping")
	}
	err = stop()
	g.log.Info("gateway stopped")
	return err
}

// openDataDir makes the data dir, tightens its access, and locks it for this gateway.
func (g *components) openDataDir() (*Lock, error) {
	dataDir, err := filepath.Abs(g.cfg.DataDir)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return nil, fmt.Errorf("create data dir: %w", err)
	}
	if tightened, err := TightenDataDir(dataDir); err != nil {
		return nil, err
	} else if len(tightened) > 0 {
		g.log.Warn("data dir: access by other users removed", "dataDir", dataDir, "paths", tightened)
	}
	g.dataDir = dataDir
	return LockDataDir(dataDir)
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

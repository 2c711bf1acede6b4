package gateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"golang.org/x/sync/errgroup"

	"github.com/openclaw/cloudworkers/internal/clock"
	"github.com/openclaw/cloudworkers/internal/shutdown"
	"github.com/openclaw/cloudworkers/internal/version"
)

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

package gateway

// The gateway's own small parts that Run and the wiring use: what cmd/openclaw hands in, the
// gateway's id, the worker log reader of OCC, the in-use rule of the lifetime policy, timeouts.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"path"
	"time"

	"github.com/openclaw/cloudworkers/gateway/api"
	"github.com/openclaw/cloudworkers/gateway/bootstrap"
	"github.com/openclaw/cloudworkers/gateway/envs"
	"github.com/openclaw/cloudworkers/gateway/placement"
	"github.com/openclaw/cloudworkers/gateway/store"
	"github.com/openclaw/cloudworkers/internal/clock"
	"github.com/openclaw/cloudworkers/internal/ids"
	"github.com/openclaw/cloudworkers/internal/untrusted"
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

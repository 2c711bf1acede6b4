package gateway

import (
	"context"
	"log/slog"
	"time"

	"github.com/openclaw/cloudworkers/gateway/hub"
	"github.com/openclaw/cloudworkers/gateway/store"
	"github.com/openclaw/cloudworkers/internal/clock"
)

// pruneOnce deletes the rows that fell out of retention: audit rows, dead worker credentials and
// ended inference calls (each table by its writer).
func pruneOnce(ctx context.Context, r RetentionConfig, now time.Time, db *store.DB, creds *hub.Credentials, workers *hub.Server, log *slog.Logger) {
	audit, err := db.PruneAudit(ctx, now.Add(-orDefault(r.Audit, DefaultAuditRetention)))
	if err != nil {
		log.Warn("prune audit", "err", err)
	}
	dead, err := creds.Prune(ctx, now.Add(-orDefault(r.Credentials, DefaultCredentialRetention)))
	if err != nil {
		log.Warn("prune worker credentials", "err", err)
	}
	if _, err := creds.PruneKeys(ctx); err != nil {
		log.Warn("prune worker key bindings", "err", err)
	}
	calls, err := workers.PruneCalls(ctx, now.Add(-orDefault(r.InferenceCalls, DefaultInferenceCallRetention)))
	if err != nil {
		log.Warn("prune inference calls", "err", err)
	}
	if audit+dead+calls > 0 {
		log.Info("pruned rows out of retention", "audit", audit, "credentials", dead, "inferenceCalls", calls)
	}
}

// runRetention prunes at start and then every retention interval until ctx ends.
func runRetention(ctx context.Context, clk clock.Clock, r RetentionConfig, db *store.DB, creds *hub.Credentials, workers *hub.Server, log *slog.Logger) {
	t := clk.NewTicker(orDefault(r.Interval, DefaultRetentionInterval))
	defer t.Stop()
	for {
		pruneOnce(ctx, r, clk.Now(), db, creds, workers, log)
		select {
		case <-ctx.Done():
			return
		case <-t.C():
		}
	}
}

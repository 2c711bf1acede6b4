package store_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/openclaw/cloudworkers/gateway/store"
	"github.com/openclaw/cloudworkers/gateway/store/storetest"
)

// PruneAudit deletes the rows older than the cutoff, in batches, and no others.
func TestPruneAudit(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	db := storetest.Open(t)
	const old = store.PruneBatch*2 + 7
	if err := db.InTx(ctx, func(tx *sql.Tx) error {
		for range old {
			if _, err := tx.ExecContext(ctx, `INSERT INTO audit(at, kind, detail) VALUES(?, 'x', 'old')`,
				store.FormatTime(time.Now().Add(-40*24*time.Hour))); err != nil {
				return err
			}
		}
		return store.Audit(ctx, tx, time.Now(), "x", "", "new")
	}); err != nil {
		t.Fatal(err)
	}
	n, err := db.PruneAudit(ctx, time.Now().Add(-30*24*time.Hour))
	if err != nil || n != old {
		t.Fatalf("PruneAudit = %d, %v; want %d", n, err, old)
	}
	rows, err := db.ListAudit(ctx, "", 10)
	if err != nil || len(rows) != 1 || rows[0].Detail != "new" {
		t.Fatalf("left %+v, %v; want the new row", rows, err)
	}
}

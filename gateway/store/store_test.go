package store_test

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/openclaw/cloudworkers/gateway/store"
	"github.com/openclaw/cloudworkers/gateway/store/storetest"
)

func TestOpenMigratesAndIsIdempotent(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "gateway.db")
	db, err := store.Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	var mode string
	if err := db.R.QueryRowContext(ctx, `PRAGMA journal_mode`).Scan(&mode); err != nil || mode != "wal" {
		t.Fatalf("journal_mode %q %v", mode, err)
	}
	var sync int
	if err := db.W.QueryRowContext(ctx, `PRAGMA synchronous`).Scan(&sync); err != nil || sync != 2 {
		t.Fatalf("synchronous %d %v, want 2 (FULL)", sync, err)
	}
	var n1 int
	_ = db.R.QueryRowContext(ctx, `SELECT COUNT(*) FROM schema_migrations`).Scan(&n1)
	db.Close()
	db, err = store.Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var n2 int
	_ = db.R.QueryRowContext(ctx, `SELECT COUNT(*) FROM schema_migrations`).Scan(&n2)
	if n1 == 0 || n1 != n2 {
		t.Fatalf("migrations applied %d then %d", n1, n2)
	}
	// the read pool cannot write
	if _, err := db.R.ExecContext(ctx, `INSERT INTO gateway_meta(key,value) VALUES('x','y')`); err == nil {
		t.Fatal("read pool accepted a write")
	}
}

func TestInTxRollsBackOnError(t *testing.T) {
	ctx := context.Background()
	db := storetest.Open(t)
	boom := errors.New("boom")
	err := db.InTx(ctx, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `INSERT INTO gateway_meta(key,value) VALUES('a','b')`); err != nil {
			return err
		}
		if err := store.Audit(ctx, tx, time.Now(), "test", "", "x"); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("InTx returned %v", err)
	}
	var n int
	_ = db.R.QueryRowContext(ctx, `SELECT COUNT(*) FROM gateway_meta WHERE key='a'`).Scan(&n)
	audit, _ := db.ListAudit(ctx, "", 10)
	if n != 0 || len(audit) != 0 {
		t.Fatalf("half-written transaction: meta=%d audit=%d", n, len(audit))
	}
}

package store_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/openclaw/cloudworkers/gateway/store/storetest"
)

// Concurrent GroupTx callers share transactions, yet each one's failure undoes only its own
// writes and is returned to it alone; every success is stored.
func TestGroupTxIsolatesEachCallersFailure(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	db := storetest.Open(t)
	const callers = 200
	errBad := errors.New("refused")
	errs := make([]error, callers)
	var wg sync.WaitGroup
	for i := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = db.GroupTx(ctx, func(tx *sql.Tx) error {
				if _, err := tx.ExecContext(ctx, `INSERT INTO gateway_meta(key, value) VALUES(?, 'x')`, fmt.Sprintf("k%03d", i)); err != nil {
					return err
				}
				if i%3 == 0 {
					return errBad // after writing: the write must be undone
				}
				return nil
			})
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if want := i%3 == 0; errors.Is(err, errBad) != want || (!want && err != nil) {
			t.Fatalf("caller %d: %v (refused: %v)", i, err, want)
		}
	}
	rows, err := db.R.QueryContext(ctx, `SELECT key FROM gateway_meta WHERE key LIKE 'k%'`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	stored := map[string]bool{}
	for rows.Next() {
		var k string
		if err := rows.Scan(&k); err != nil {
			t.Fatal(err)
		}
		stored[k] = true
	}
	for i := range callers {
		if k := fmt.Sprintf("k%03d", i); stored[k] == (i%3 == 0) {
			t.Fatalf("row %s stored=%v; only the callers that succeeded may be stored", k, stored[k])
		}
	}
}

// A caller whose context has ended gets its error and writes nothing; the others commit.
func TestGroupTxCancelledCaller(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	db := storetest.Open(t)
	done, stop := context.WithCancel(ctx)
	stop()
	err := db.GroupTx(done, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(done, `INSERT INTO gateway_meta(key, value) VALUES('gone', 'x')`)
		return err
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled caller: %v, want context.Canceled", err)
	}
	if err := db.GroupTx(ctx, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO gateway_meta(key, value) VALUES('kept', 'x')`)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := db.R.QueryRowContext(ctx, `SELECT COUNT(*) FROM gateway_meta WHERE key IN ('gone','kept')`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("%d rows (%v), want only the live caller's", n, err)
	}
}

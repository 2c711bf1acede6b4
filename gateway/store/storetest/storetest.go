// Package storetest opens gateway databases for tests.
package storetest

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/openclaw/cloudworkers/gateway/store"
)

// Open opens (and migrates) a gateway database in t's temp dir, closed when t ends.
func Open(t testing.TB) *store.DB {
	t.Helper()
	db, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "gateway.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

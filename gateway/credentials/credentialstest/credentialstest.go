// Package credentialstest opens credential stores for tests.
package credentialstest

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/openclaw/cloudworkers/gateway/credentials"
	"github.com/openclaw/cloudworkers/gateway/store"
	"github.com/openclaw/cloudworkers/internal/testrig/testenv"
)

// Open opens (and migrates) a gateway database in dir, closed when t ends, and the credential
// store on it whose key file lives in dir, as a gateway on data dir dir does.
func Open(t testing.TB, dir string) (*credentials.Store, *store.DB) {
	t.Helper()
	db, err := store.Open(testenv.Context(t, 30*time.Second), filepath.Join(dir, "gateway.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	s, err := credentials.Open(db, dir)
	if err != nil {
		t.Fatal(err)
	}
	return s, db
}

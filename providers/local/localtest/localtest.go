// Package localtest runs an in-process local box (providers/local) for the length of a test.
package localtest

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/openclaw/cloudworkers/internal/testrig/testenv"
	"github.com/openclaw/cloudworkers/providers/local"
)

// readyWait bounds how long Start waits for the box to listen.
const readyWait = 30 * time.Second

// Box is a running local box: its state and its directory (the box user's HOME).
type Box struct {
	local.State
	Dir string
}

// Start serves a local box in this process until the test ends; an error from the box fails
// the test. Its directory is short and traversable by other users (0711), to stay within the
// unix socket path limit and to serve tests whose box side runs as another user.
func Start(t testing.TB) Box {
	t.Helper()
	return StartConfig(t, local.BoxConfig{})
}

// StartConfig is Start with cfg; Start sets cfg.Dir when it is empty, and cfg.Ready.
func StartConfig(t testing.TB, cfg local.BoxConfig) Box {
	t.Helper()
	if cfg.Dir == "" {
		cfg.Dir = filepath.Join(testenv.PublicDir(t, "lb"), "box")
	}
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan local.State, 1)
	cfg.Ready = func(st local.State) { ready <- st }
	errc := make(chan error, 1)
	go func() { errc <- local.Serve(ctx, cfg) }()
	t.Cleanup(func() {
		cancel()
		if err := <-errc; err != nil {
			t.Errorf("local box: %v", err)
		}
	})
	timeout := time.NewTimer(readyWait)
	defer timeout.Stop()
	select {
	case st := <-ready:
		return Box{State: st, Dir: cfg.Dir}
	case err := <-errc:
		t.Fatalf("local box: %v", err)
	case <-timeout.C:
		t.Fatalf("local box not ready after %v", readyWait)
	}
	return Box{}
}

package bootstrap

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/openclaw/cloudworkers/gateway/tunnel"
	"github.com/openclaw/cloudworkers/gateway/tunnel/tunneltest"
)

// TestRunHonoursContextOnSilentBox: a box that completes the handshake and never answers a
// channel open cannot hold Run (nor the teardown that calls it) past its context.
func TestRunHonoursContextOnSilentBox(t *testing.T) {
	s, ep := tunneltest.StartLoopback(t, tunneltest.NoChannels)
	tctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := tunnel.DialBox(tctx, tunnel.Target{EnvironmentID: "env_x", Host: ep.Host, Port: ep.Port, User: "u",
		KeyPath: ep.KeyPath, HostKeys: []string{ep.HostKey}, SocketPath: "s"}, 5*time.Second, tunnel.KeepaliveConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel2 := context.WithTimeout(tctx, 200*time.Millisecond)
	defer cancel2()
	errc := make(chan error, 1)
	go func() { _, err := Run(ctx, c, "true"); errc <- err }()
	select {
	case err = <-errc:
	case <-tctx.Done():
		t.Fatal("Run on a silent box did not return after its context ended")
	}
	if !errors.Is(err, context.DeadlineExceeded) || s.Opens.Load() != 1 {
		t.Fatalf("Run on a silent box: %v (opens %d), want the context's deadline", err, s.Opens.Load())
	}
	// a context already done runs nothing on the box
	if _, err := Run(ctx, c, "true"); !errors.Is(err, context.DeadlineExceeded) || s.Opens.Load() != 1 {
		t.Fatalf("Run with a done context: %v (opens %d)", err, s.Opens.Load())
	}
}

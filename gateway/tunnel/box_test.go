package tunnel

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openclaw/cloudworkers/gateway/tunnel/tunneltest"
	"github.com/openclaw/cloudworkers/internal/clock"
)

// silentTarget starts a hostile server in mode and returns a Target that pins its host key.
func silentTarget(t *testing.T, mode tunneltest.Mode) (Target, *tunneltest.SilentBox) {
	t.Helper()
	s, ep := tunneltest.StartLoopback(t, mode)
	return Target{EnvironmentID: "env_silent", Host: ep.Host, Port: ep.Port, User: "u", KeyPath: ep.KeyPath,
		HostKeys: []string{ep.HostKey}, SocketPath: testSocket}, s
}

// TestDialBoxClosesWhenKeepalivesGoUnanswered: a box that completes the handshake and then
// answers nothing has its connection closed by the keepalive, so nothing waits on it forever.
func TestDialBoxClosesWhenKeepalivesGoUnanswered(t *testing.T) {
	tg, _ := silentTarget(t, tunneltest.Stalled)
	ctx := testContext(t)
	clk := clock.NewManual(time.Now())
	c, err := DialBox(ctx, tg, 5*time.Second, KeepaliveConfig{Interval: 10 * time.Second, Timeout: 30 * time.Second, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = c.Wait(); close(done) }()
	// The keepalive's interval, then its unanswered request's timeout, pass on the clock.
	for _, d := range []time.Duration{10 * time.Second, 30 * time.Second} {
		if err := clk.WaitTimers(ctx, 1); err != nil {
			t.Fatalf("keepalive never waited on the clock: %v", err)
		}
		select {
		case <-done:
			t.Fatal("connection closed before the keepalive timed out")
		default:
		}
		clk.Advance(d)
	}
	select {
	case <-done:
	case <-ctx.Done():
		c.Close()
		t.Fatal("a connection whose keepalives go unanswered stayed open")
	}
}

// TestCloseOnDoneUnblocksChannelOpen: a channel open the box never answers returns once the
// caller's context ends.
func TestCloseOnDoneUnblocksChannelOpen(t *testing.T) {
	tg, s := silentTarget(t, tunneltest.NoChannels)
	c, err := DialBox(testContext(t), tg, 5*time.Second, KeepaliveConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(testContext(t), 200*time.Millisecond)
	defer cancel()
	stop := CloseOnDone(ctx, c)
	defer stop()
	_, err = c.NewSession()
	if err == nil || ctx.Err() == nil {
		t.Fatalf("NewSession on a silent box: err %v, ctx %v", err, ctx.Err())
	}
	if s.Opens.Load() != 1 || !errors.Is(ctx.Err(), context.DeadlineExceeded) {
		t.Fatalf("opens %d, ctx %v", s.Opens.Load(), ctx.Err())
	}
}

// TestKeepaliveSparesAPeerThatKeepsSending: a keepalive reply queued behind a bulk transfer is
// late, but while the box keeps sending (its window adjustments of an upload) the connection
// stays; once it falls silent for the timeout, it is closed.
func TestKeepaliveSparesAPeerThatKeepsSending(t *testing.T) {
	tg, _ := silentTarget(t, tunneltest.Stalled)
	ctx := testContext(t)
	clk := clock.NewManual(time.Now())
	c, err := Dial(ctx, tg, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var sending atomic.Bool
	sending.Store(true)
	done := make(chan error, 1)
	go func() { done <- keepalive(ctx, clk, c, 10*time.Second, 30*time.Second, sending.Load) }()
	for _, d := range []time.Duration{10 * time.Second, 30 * time.Second, 30 * time.Second} {
		if err := clk.WaitTimers(ctx, 1); err != nil {
			t.Fatalf("keepalive never waited on the clock: %v", err)
		}
		clk.Advance(d)
	}
	if err := clk.WaitTimers(ctx, 1); err != nil { // still waiting for the reply
		t.Fatalf("the keepalive gave up on a peer that is sending: %v", err)
	}
	select {
	case err := <-done:
		t.Fatalf("the keepalive ended while the peer was sending: %v", err)
	default:
	}
	sending.Store(false)
	clk.Advance(30 * time.Second)
	select {
	case err := <-done:
		if !errors.Is(err, errKeepaliveTimeout) {
			t.Fatalf("keepalive of a silent peer: %v, want a timeout", err)
		}
	case <-ctx.Done():
		t.Fatal("a peer silent past the timeout was kept")
	}
}

package hub_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/openclaw/cloudworkers/gateway/hub"
	"github.com/openclaw/cloudworkers/internal/clock"
	"github.com/openclaw/cloudworkers/internal/watchdog"
	"github.com/openclaw/cloudworkers/protocol"
)

// forever is a timeout the manual clock of a test never reaches: it isolates the other one.
const forever = 1 << 20 * time.Hour

// admitRaw admits a hand-driven connection for envA on a hub whose deadlines run on clk.
func admitRaw(t *testing.T, clk clock.Clock, heartbeat, write time.Duration) (*harness, *websocket.Conn) {
	t.Helper()
	h := newHarness(t, func(c *hub.Config) { c.DeadlineClock, c.HeartbeatTimeout, c.WriteTimeout = clk, heartbeat, write })
	c := rawConn(t, h)
	sendFrame(t, c, connectFrame(t, envA, h.mint(envA, bundleA, time.Hour, nil), bundleA))
	if f := recvFrame(t, c); !f.OK {
		t.Fatalf("connect: %+v", f.Error)
	}
	recvChan(t, "admission", h.admits)
	return h, c
}

// A worker that stops reading (its TCP window full) blocks the hub's write; the watchdog cuts the
// connection once that write has been blocked for WriteTimeout on the deadline clock, and the
// write returns the watchdog's timeout. Nothing else (heartbeats, the read loop) is held up.
func TestHostileWorkerThatStopsReadingIsCut(t *testing.T) {
	ctx := testContext(t)
	clk := clock.NewManual(time.Now())
	h, _ := admitRaw(t, clk, forever, 10*time.Second) // the raw peer never reads again
	// One frame far larger than the socket buffers: its write blocks until the peer reads.
	written := make(chan error, 1)
	go func() { written <- h.srv.Shutdown(ctx, envA, strings.Repeat("x", 8<<20)) }()
	var waited time.Duration
	var err error
	for done := false; !done; {
		select {
		case err = <-written:
			done = true
		default:
			if clk.WaitTimers(ctx, 1) != nil {
				t.Fatal("the write to a peer that stopped reading was never cut")
			}
			clk.Advance(time.Second)
			waited += time.Second
		}
	}
	var te *watchdog.TimeoutError
	if !errors.As(err, &te) || te.Op != "write" || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("blocked write returned %v, want the watchdog's write timeout", err)
	}
	if waited < 10*time.Second {
		t.Fatalf("cut after %v on the deadline clock, before the write timeout (10s)", waited)
	}
	if got := recvChan(t, "disconnect of the worker that stopped reading", h.departs); got != envA {
		t.Fatalf("OnDisconnect(%q)", got)
	}
	if h.srv.Admitted(envA) {
		t.Fatal("worker still admitted after its write was cut")
	}
}

// Shutdown, as a release calls it, holds no longer than its context: a worker that stopped
// reading has its connection cut when the context ends, whatever WriteTimeout says.
func TestShutdownOfAWorkerThatStopsReadingEndsWithItsContext(t *testing.T) {
	ctx := testContext(t)
	h, _ := admitRaw(t, clock.NewManual(time.Now()), forever, 10*time.Minute) // the deadline clock never moves
	sctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	written := make(chan error, 1)
	go func() { written <- h.srv.Shutdown(sctx, envA, strings.Repeat("x", 8<<20)) }()
	select {
	case err := <-written:
		if err == nil {
			t.Fatal("a shutdown the worker never read reported success")
		}
	case <-ctx.Done():
		t.Fatal("Shutdown to a worker that stopped reading outlived its context")
	}
	if got := recvChan(t, "disconnect of the worker that stopped reading", h.departs); got != envA {
		t.Fatalf("OnDisconnect(%q)", got)
	}
}

// A worker that heartbeats stays admitted however long the deadline clock runs; once it goes
// silent it is cut after HeartbeatTimeout of silence, not before.
func TestHostileSilentWorkerIsCutAtHeartbeatTimeout(t *testing.T) {
	const heartbeat = 30 * time.Second
	ctx := testContext(t)
	clk := clock.NewManual(time.Now())
	h, c := admitRaw(t, clk, heartbeat, forever)
	for i := range 9 { // 90s on the clock, a heartbeat every 10s
		if err := clk.WaitTimers(ctx, 1); err != nil {
			t.Fatal(err)
		}
		clk.Advance(heartbeat / 3)
		hb, _ := protocol.Request("h"+strconv.Itoa(i), protocol.MethodHeartbeat, nil)
		sendFrame(t, c, hb)
		if f := recvFrame(t, c); f.ID != hb.ID || !f.OK {
			t.Fatalf("heartbeat answered %+v", f)
		}
	}
	var silent time.Duration
	for done := false; !done; {
		select {
		case got := <-h.departs:
			if got != envA {
				t.Fatalf("OnDisconnect(%q)", got)
			}
			done = true
		default:
			if clk.WaitTimers(ctx, 1) != nil {
				t.Fatal("a silent worker was never cut")
			}
			clk.Advance(time.Second)
			silent += time.Second
		}
	}
	if silent < heartbeat {
		t.Fatalf("cut after %v of silence, before the heartbeat timeout %v", silent, heartbeat)
	}
	if _, _, err := c.Read(ctx); err == nil {
		t.Fatal("connection still open after the heartbeat timeout")
	}
}

package hub_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/openclaw/cloudworkers/gateway/hub"
	"github.com/openclaw/cloudworkers/internal/clock"
	"github.com/openclaw/cloudworkers/protocol"
)

// The backpressure an environment shows after a capacity-exceeded answer lasts a few seconds on
// the hub's clock, then clears: the test advances the clock instead of waiting.
func TestBackpressureHoldRunsOnTheHubClock(t *testing.T) {
	clk := clock.NewManual(time.Now())
	b := &slowBackend{release: make(chan struct{}), entered: make(chan uint64, 16)}
	h := newHarness(t, func(c *hub.Config) { c.Sessions = b; c.StreamQueue = 1; c.Clock = clk })
	c := rawConn(t, h)
	sendFrame(t, c, connectFrame(t, envA, h.mint(envA, bundleA, time.Hour, nil), bundleA))
	if f := recvFrame(t, c); !f.OK {
		t.Fatalf("connect: %+v", f.Error)
	}
	for i := range 3 { // one in service, one queued, one refused
		f, err := protocol.Request(fmt.Sprintf("s%d", i), protocol.MethodLiveEvent, protocol.LiveEventParams{
			Scope: protocol.Scope{SessionID: "slow", OwnerEpoch: 1, StreamKind: protocol.StreamLive, RunEpoch: 1, Seq: uint64(i + 1)},
			Event: protocol.LiveEvent{Type: protocol.LiveTextDelta, Delta: "x"}})
		if err != nil {
			t.Fatal(err)
		}
		sendFrame(t, c, f)
		if i == 0 {
			recvChan(t, "s0 in the backend", b.entered)
		}
	}
	if f := recvFrame(t, c); f.ID != "s2" || f.OK || f.Error.Code != protocol.CodeCapacityExceeded {
		t.Fatalf("answer %+v, want s2 refused with capacity-exceeded", f)
	}
	close(b.release)
	for range 2 {
		if f := recvFrame(t, c); !f.OK {
			t.Fatalf("queued answer %+v", f.Error)
		}
	}
	if bp := h.srv.Backpressure(envA); !bp.Active || bp.Queued != 0 || bp.Rejected != 1 {
		t.Fatalf("backpressure right after the refusal %+v, want active (held) with nothing queued", bp)
	}
	clk.Advance(time.Minute)
	if bp := h.srv.Backpressure(envA); bp.Active || bp.Rejected != 1 {
		t.Fatalf("backpressure once the hold passed on the clock %+v, want inactive", bp)
	}
}

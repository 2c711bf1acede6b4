package hub_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/openclaw/cloudworkers/gateway/hub"
	"github.com/openclaw/cloudworkers/protocol"
)

// TestWorkerCallsAreActivity: every allowed worker call but heartbeats and credential refreshes
// is reported as activity of its environment (what keeps its lease alive); refused calls are not.
func TestWorkerCallsAreActivity(t *testing.T) {
	var seen atomic.Int64
	h := newHarness(t, func(c *hub.Config) {
		c.OnActivity = func(env string) {
			if env == envA {
				seen.Add(1)
			}
		}
	})
	ctx := testContext(t)
	secret := h.mint(envA, bundleA, time.Hour, []string{protocol.MethodHeartbeat, protocol.MethodInferenceCredit})
	c := rawConn(t, h)
	sendFrame(t, c, connectFrame(t, envA, secret, bundleA))
	if res := recvFrame(t, c); !res.OK {
		t.Fatalf("connect: %+v", res)
	}
	if err := h.srv.WaitAdmitted(ctx, envA); err != nil {
		t.Fatal(err)
	}
	call := func(id, method string) {
		req, _ := protocol.Request(id, method, nil)
		sendFrame(t, c, req)
		if f := recvFrame(t, c); f.ID != id {
			t.Fatalf("%s: response %+v", method, f)
		}
	}
	call("h1", protocol.MethodHeartbeat)
	call("r1", protocol.MethodCredentialRefresh) // not granted: refused
	if n := seen.Load(); n != 0 {
		t.Fatalf("a heartbeat and a refused call counted %d times as activity", n)
	}
	call("c1", protocol.MethodInferenceCredit)
	call("c2", protocol.MethodInferenceCredit)
	if n := seen.Load(); n != 2 {
		t.Fatalf("two worker calls counted %d times as activity, want 2", n)
	}
}

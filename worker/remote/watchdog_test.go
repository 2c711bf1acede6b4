package remote_test

import (
	"context"
	"testing"
	"time"

	"github.com/openclaw/cloudworkers/internal/clock"
	"github.com/openclaw/cloudworkers/protocol"
	"github.com/openclaw/cloudworkers/worker/remote"
)

// A gateway that admits the worker and then never sends another frame (it answers no heartbeat)
// is cut by the connection's watchdog after three heartbeat intervals and a second of silence on
// the deadline clock, not before, and the worker connects again.
func TestRunCutsASilentGateway(t *testing.T) {
	const silence = 3*time.Minute + time.Second // the scripted gateway's interval is 60s
	ctx := testContext(t)
	g := newGateway(t, func(int) *protocol.Error { return nil })
	dclk := clock.NewManual(time.Unix(0, 0))
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- remote.Run(ctx, remote.Config{SocketPath: g.sock, EnvironmentID: "env_1", Credential: "cred", BundleHash: "h",
			BackoffMin: time.Millisecond, BackoffMax: time.Millisecond, DeadlineClock: dclk})
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	recv(t, ctx, "the first attempt", g.attempts)
	recv(t, ctx, "the admitted connection", g.conns)
	var waited time.Duration
	for reconnected := false; !reconnected; {
		select {
		case <-g.attempts:
			reconnected = true
		default:
			if err := dclk.WaitTimers(ctx, 1); err != nil {
				t.Fatal("the worker never cut a silent gateway:", err)
			}
			dclk.Advance(10 * time.Second)
			waited += 10 * time.Second
		}
	}
	if waited < silence {
		t.Fatalf("the worker cut the gateway after %v of silence, before %v", waited, silence)
	}
}

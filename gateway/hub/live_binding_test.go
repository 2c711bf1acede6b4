package hub_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/openclaw/cloudworkers/gateway/hub"
	"github.com/openclaw/cloudworkers/protocol"
)

// countingBindings counts the binding reads the hub asks of the session store.
type countingBindings struct {
	blockingContext
	reads *atomic.Int64
}

func (b countingBindings) WorkerBinding(ctx context.Context, id string) (protocol.Binding, error) {
	b.reads.Add(1)
	return b.blockingContext.WorkerBinding(ctx, id)
}

// liveFrame is a worker.live-event of session at owner epoch epoch, seq seq of run epoch 1.
func liveFrame(t *testing.T, id, session string, epoch, seq uint64) protocol.Frame {
	t.Helper()
	f, err := protocol.Request(id, protocol.MethodLiveEvent, protocol.LiveEventParams{
		Scope: protocol.Scope{SessionID: session, OwnerEpoch: epoch, StreamKind: protocol.StreamLive, RunEpoch: 1, Seq: seq},
		Event: protocol.LiveEvent{Type: protocol.LiveTextDelta, Delta: fmt.Sprint(seq)}})
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// The binding is read once per live stream, not once per event; an event sent after the session
// moved on (a new owner epoch) is still refused and stored nowhere, because the store checks the
// binding again in the transaction that would write it.
func TestLiveStreamReadsTheBindingOnceAndStillFencesAMove(t *testing.T) {
	var reads atomic.Int64
	x := newHostile(t, func(c *hub.Config) {
		c.Sessions = countingBindings{blockingContext: c.Sessions.(blockingContext), reads: &reads}
	})
	ctx := testContext(t)
	for seq := uint64(1); seq <= 10; seq++ {
		sendFrame(t, x.env, liveFrame(t, fmt.Sprint("l", seq), x.session, x.epoch, seq))
		if f := recvFrame(t, x.env); !f.OK {
			t.Fatalf("live event %d refused: %+v", seq, f.Error)
		}
	}
	if n := reads.Load(); n != 1 {
		t.Fatalf("%d binding reads for 10 live events of one stream, want 1", n)
	}
	// The session is taken over (as a dispatch elsewhere would): the worker's next event, of the
	// scope the stream already accepted, must not be written.
	if _, err := x.st.AdvanceOwnerEpoch(ctx, x.session); err != nil {
		t.Fatal(err)
	}
	sendFrame(t, x.env, liveFrame(t, "late", x.session, x.epoch, 11))
	if f := recvFrame(t, x.env); f.OK || f.Error.Code != protocol.CodeEpochMismatch {
		t.Fatalf("live event after the takeover answered %+v (%+v), want epoch-mismatch", f, f.Error)
	}
	if cur, err := x.st.LiveCursor(ctx, x.session); err != nil || cur != 10 {
		t.Fatalf("live cursor %d (%v) after the refused event, want 10", cur, err)
	}
	// A refusal forgets the stream's scope: the next event is checked against the binding again.
	sendFrame(t, x.env, liveFrame(t, "late2", x.session, x.epoch, 11))
	if f := recvFrame(t, x.env); f.OK || f.Error.Code != protocol.CodeEpochMismatch {
		t.Fatalf("second late event answered %+v, want epoch-mismatch", f)
	}
	if n := reads.Load(); n != 2 {
		t.Fatalf("%d binding reads after a refusal, want 2", n)
	}
}

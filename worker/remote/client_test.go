package remote_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/openclaw/cloudworkers/internal/clock"
	"github.com/openclaw/cloudworkers/protocol"
	"github.com/openclaw/cloudworkers/worker/remote"
)

// newClient starts a remote.Client of session ses_1 against g; edit adjusts its config.
func newClient(t *testing.T, g *gateway, edit func(*remote.ClientConfig)) *remote.Client {
	t.Helper()
	cfg := remote.ClientConfig{Config: remote.Config{SocketPath: g.sock, EnvironmentID: "env_1", Credential: "cred", BundleHash: "h",
		SessionID: "ses_1", OwnerEpoch: 1, BackoffMin: 10 * time.Millisecond, BackoffMax: 10 * time.Millisecond}, RunID: "run-1"}
	if edit != nil {
		edit(&cfg)
	}
	c, err := remote.NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// accept takes the client's next connection and answers its worker.resume with the live cursor acked.
func accept(t *testing.T, ctx context.Context, g *gateway, acked uint64) *gwConn {
	t.Helper()
	c := recv(t, ctx, "a connection", g.conns)
	f := recv(t, ctx, "worker.resume", c.frames)
	if f.Method != protocol.MethodResume {
		t.Fatalf("first request %q, want %s", f.Method, protocol.MethodResume)
	}
	res, _ := protocol.Response(f.ID, protocol.ResumeResult{SessionID: "ses_1", OwnerEpoch: 1,
		LiveAcked: protocol.StreamCursor{RunEpoch: 1, Seq: acked}})
	write(ctx, c.ws, res)
	return c
}

type liveFrame struct {
	id string
	p  protocol.LiveEventParams
}

// nextLive is the next worker.live-event the client sent on c.
func nextLive(t *testing.T, ctx context.Context, c *gwConn) liveFrame {
	t.Helper()
	f := recv(t, ctx, "a live event", c.frames)
	if f.Method != protocol.MethodLiveEvent {
		t.Fatalf("request %q, want %s", f.Method, protocol.MethodLiveEvent)
	}
	var p protocol.LiveEventParams
	if err := protocol.DecodeParams(f.Params, &p); err != nil {
		t.Fatal(err)
	}
	return liveFrame{id: f.ID, p: p}
}

func ackLive(ctx context.Context, c *gwConn, f liveFrame, acked uint64) {
	res, _ := protocol.Response(f.id, protocol.LiveEventResult{AckedSeq: acked})
	write(ctx, c.ws, res)
}

func live(t *testing.T, ctx context.Context, c *remote.Client, typ protocol.LiveEventType, delta string) uint64 {
	t.Helper()
	ev := protocol.LiveEvent{Type: typ, Delta: delta}
	if typ == protocol.LiveToolStart {
		ev = protocol.LiveEvent{Type: typ, ToolCallID: "call_1", ToolName: delta}
	}
	seq, err := c.Live(ctx, ev)
	if err != nil {
		t.Fatal(err)
	}
	return seq
}

func expectLive(t *testing.T, f liveFrame, seq uint64, typ protocol.LiveEventType, delta string) {
	t.Helper()
	got := f.p.Event.Delta
	if f.p.Event.Type == protocol.LiveToolStart {
		got = f.p.Event.ToolName
	}
	if f.p.Seq != seq || f.p.Event.Type != typ || got != delta {
		t.Fatalf("live event seq %d %s %q, want seq %d %s %q", f.p.Seq, f.p.Event.Type, got, seq, typ, delta)
	}
}

// Deltas queued while a live event is unacknowledged merge into one event, sent when the ACK
// arrives; a delta of another type, or any other event, ends the batch and keeps its place; a held
// delta goes at once when WaitLiveAcked asks for it.
func TestClientCoalescesDeltasWhileInFlight(t *testing.T) {
	ctx := testContext(t)
	g := newGateway(t, func(int) *protocol.Error { return nil })
	c := newClient(t, g, func(cfg *remote.ClientConfig) { cfg.LiveCoalesceInflight = 1 })
	gc := accept(t, ctx, g, 0)
	text, think := protocol.LiveTextDelta, protocol.LiveThinkingDelta

	if seq := live(t, ctx, c, text, "a"); seq != 1 {
		t.Fatalf("first delta seq %d", seq)
	}
	f1 := nextLive(t, ctx, gc) // nothing in flight: it goes once LiveCoalesceDelay has passed
	expectLive(t, f1, 1, text, "a")
	var batch strings.Builder
	for i := range 1000 {
		d := fmt.Sprintf("b%d.", i)
		batch.WriteString(d)
		if seq := live(t, ctx, c, text, d); seq != 2 {
			t.Fatalf("delta %q queued as seq %d while seq 1 is in flight, want 2 (merged)", d, seq)
		}
	}
	if seq := live(t, ctx, c, think, "t1"); seq != 3 {
		t.Fatalf("thinking delta seq %d, want 3 (another type starts an event)", seq)
	}
	if seq := live(t, ctx, c, think, "t2"); seq != 3 {
		t.Fatalf("second thinking delta seq %d, want 3", seq)
	}
	// seq 2 is no longer the tail, so it goes; seq 3 is held while anything is in flight.
	f2 := nextLive(t, ctx, gc)
	expectLive(t, f2, 2, text, batch.String())
	ackLive(ctx, gc, f1, 1)
	ackLive(ctx, gc, f2, 2)
	expectLive(t, nextLive(t, ctx, gc), 3, think, "t1t2")
	if st := c.Stats(); st.LiveMerged != 1000 {
		t.Fatalf("stats %+v, want 1000 deltas merged", st)
	}

	// A tool event is never merged or held and ends the batch before it.
	if seq := live(t, ctx, c, text, "e"); seq != 4 {
		t.Fatalf("delta after a sent one: seq %d, want 4", seq)
	}
	if seq := live(t, ctx, c, protocol.LiveToolStart, "bash"); seq != 5 {
		t.Fatalf("tool_start seq %d, want 5", seq)
	}
	if seq := live(t, ctx, c, text, "f"); seq != 6 {
		t.Fatalf("delta after tool_start seq %d, want 6", seq)
	}
	expectLive(t, nextLive(t, ctx, gc), 4, text, "e")
	expectLive(t, nextLive(t, ctx, gc), 5, protocol.LiveToolStart, "bash")

	// seq 6 is held (five in flight); WaitLiveAcked sends it without waiting for an ACK.
	waited := make(chan error, 1)
	go func() { waited <- c.WaitLiveAcked(ctx, 6) }()
	f6 := nextLive(t, ctx, gc)
	expectLive(t, f6, 6, text, "f")
	select {
	case err := <-waited:
		t.Fatalf("WaitLiveAcked returned %v before the ACK", err)
	default:
	}
	ackLive(ctx, gc, f6, 6)
	if err := recv(t, ctx, "WaitLiveAcked", waited); err != nil {
		t.Fatal(err)
	}
	if got := c.LiveAcked(); got != 6 {
		t.Fatalf("LiveAcked %d, want 6", got)
	}
}

// A delta at the size bound is not held, a delta that would pass the bound starts a new event, and
// a single delta bigger than the bound goes alone and whole.
func TestClientCoalescingKeepsTheBound(t *testing.T) {
	ctx := testContext(t)
	g := newGateway(t, func(int) *protocol.Error { return nil })
	c := newClient(t, g, func(cfg *remote.ClientConfig) { cfg.LiveCoalesceBytes, cfg.LiveCoalesceInflight = 8, 1 })
	gc := accept(t, ctx, g, 0)
	text := protocol.LiveTextDelta

	live(t, ctx, c, text, "a")
	f1 := nextLive(t, ctx, gc)
	expectLive(t, f1, 1, text, "a")
	steps := []struct {
		delta string
		seq   uint64
	}{
		{"12345", 2}, {"678", 2}, // 8 bytes: full, so it goes although seq 1 is in flight
		{"9", 3}, {"0123456789", 4}, {"x", 5},
	}
	for _, s := range steps {
		if seq := live(t, ctx, c, text, s.delta); seq != s.seq {
			t.Fatalf("delta %q: seq %d, want %d", s.delta, seq, s.seq)
		}
	}
	expectLive(t, nextLive(t, ctx, gc), 2, text, "12345678") // sent with seq 1 still unacknowledged
	expectLive(t, nextLive(t, ctx, gc), 3, text, "9")
	expectLive(t, nextLive(t, ctx, gc), 4, text, "0123456789")
	ackLive(ctx, gc, f1, 4)
	expectLive(t, nextLive(t, ctx, gc), 5, text, "x")
}

// With the default LiveCoalesceInflight (2), a delta goes at once while one event is in flight and
// is held while two are, until an ACK brings them down to one.
func TestClientHoldsAtTheDefaultInflight(t *testing.T) {
	ctx := testContext(t)
	g := newGateway(t, func(int) *protocol.Error { return nil })
	c := newClient(t, g, nil)
	gc := accept(t, ctx, g, 0)
	text := protocol.LiveTextDelta
	live(t, ctx, c, text, "a")
	f1 := nextLive(t, ctx, gc)
	expectLive(t, f1, 1, text, "a")
	if seq := live(t, ctx, c, text, "b"); seq != 2 {
		t.Fatalf("second delta seq %d, want 2", seq)
	}
	expectLive(t, nextLive(t, ctx, gc), 2, text, "b") // one in flight: not held
	var batch strings.Builder
	for i := range 1000 {
		d := fmt.Sprintf("c%d.", i)
		batch.WriteString(d)
		if seq := live(t, ctx, c, text, d); seq != 3 {
			t.Fatalf("delta %q queued as seq %d with two in flight, want 3 (held and merged)", d, seq)
		}
	}
	ackLive(ctx, gc, f1, 1)
	expectLive(t, nextLive(t, ctx, gc), 3, text, batch.String())
}

// noLive asserts that the client sends nothing on c for a while (a bounded wait: what it checks is
// that a held event stays held, not how fast anything is).
func noLive(t *testing.T, c *gwConn, why string) {
	t.Helper()
	select {
	case f := <-c.frames:
		t.Fatalf("%s: the client sent %s", why, f.Method)
	case <-time.After(150 * time.Millisecond):
	}
}

// With nothing in flight, a delta waits LiveCoalesceDelay (on the client's clock) for the deltas
// after it; an event of another kind, or WaitLiveAcked, sends it without waiting.
func TestClientHoldsADeltaForTheCoalesceDelay(t *testing.T) {
	ctx := testContext(t)
	g := newGateway(t, func(int) *protocol.Error { return nil })
	clk := clock.NewManual(time.Unix(0, 0))
	c := newClient(t, g, func(cfg *remote.ClientConfig) {
		cfg.Clock, cfg.LiveCoalesceInflight, cfg.LiveCoalesceDelay = clk, -1, 30*time.Millisecond
	})
	gc := accept(t, ctx, g, 0)
	text := protocol.LiveTextDelta
	for _, d := range []string{"a", "b", "c"} {
		if seq := live(t, ctx, c, text, d); seq != 1 {
			t.Fatalf("delta %q queued as seq %d within the delay, want 1 (merged)", d, seq)
		}
	}
	noLive(t, gc, "before the delay passed")
	clk.Advance(29 * time.Millisecond)
	noLive(t, gc, "1ms before the delay passed")
	clk.Advance(time.Millisecond)
	f1 := nextLive(t, ctx, gc)
	expectLive(t, f1, 1, text, "abc")
	ackLive(ctx, gc, f1, 1)

	// a tool event ends the hold: both go with the clock standing still
	live(t, ctx, c, text, "d")
	if seq := live(t, ctx, c, protocol.LiveToolStart, "grep"); seq != 3 {
		t.Fatalf("tool event seq %d, want 3", seq)
	}
	expectLive(t, nextLive(t, ctx, gc), 2, text, "d")
	expectLive(t, nextLive(t, ctx, gc), 3, protocol.LiveToolStart, "grep")

	// WaitLiveAcked sends a held delta at once
	seq := live(t, ctx, c, text, "e")
	acked := make(chan error, 1)
	go func() { acked <- c.WaitLiveAcked(ctx, seq) }()
	f4 := nextLive(t, ctx, gc)
	expectLive(t, f4, 4, text, "e")
	ackLive(ctx, gc, f4, 4)
	if err := recv(t, ctx, "WaitLiveAcked", acked); err != nil {
		t.Fatal(err)
	}
}

// Negative LiveCoalesceBytes turns merging off: every delta is its own event.
func TestClientCoalescingOff(t *testing.T) {
	ctx := testContext(t)
	g := newGateway(t, func(int) *protocol.Error { return nil })
	c := newClient(t, g, func(cfg *remote.ClientConfig) { cfg.LiveCoalesceBytes = -1 })
	gc := accept(t, ctx, g, 0)
	for i := range 5 {
		if seq := live(t, ctx, c, protocol.LiveTextDelta, fmt.Sprint(i)); seq != uint64(i+1) {
			t.Fatalf("delta %d: seq %d", i, seq)
		}
	}
	for i := range 5 {
		expectLive(t, nextLive(t, ctx, gc), uint64(i+1), protocol.LiveTextDelta, fmt.Sprint(i))
	}
}

// Across a dropped connection, a resync-required rewind and a capacity-exceeded rewind, the gateway
// sees every seq with one content only, and the distinct events, in seq order, carry every delta
// once and in order.
func TestClientNeverChangesASentEvent(t *testing.T) {
	ctx := testContext(t)
	g := newGateway(t, func(int) *protocol.Error { return nil })
	c := newClient(t, g, func(cfg *remote.ClientConfig) { cfg.LiveWindow, cfg.LiveCoalesceBytes = 4, 24 })
	const n = 1000 // at most 24 bytes per event: hundreds of events
	var want strings.Builder
	produced := make(chan error, 1)
	go func() {
		var last uint64
		for i := range n {
			seq, err := c.Live(ctx, protocol.LiveEvent{Type: protocol.LiveTextDelta, Delta: fmt.Sprintf("d%d.", i)})
			if err != nil {
				produced <- err
				return
			}
			last = seq
		}
		produced <- c.WaitLiveAcked(ctx, last)
	}()
	for i := range n {
		fmt.Fprintf(&want, "d%d.", i)
	}

	seen := map[uint64]string{} // seq → the content the gateway saw first
	var acked uint64
	frames := 0
	gc := accept(t, ctx, g, 0)
	for acked == 0 || len(joinSeen(seen, acked)) < want.Len() {
		f := nextLive(t, ctx, gc)
		frames++
		s, d := f.p.Seq, f.p.Event.Delta
		if prev, ok := seen[s]; ok && prev != d {
			t.Fatalf("seq %d sent as %q, then as %q", s, prev, d)
		}
		seen[s] = d
		switch {
		case frames == 20: // the connection drops with frames in flight, unacknowledged
			gc.ws.CloseNow()
			gc = accept(t, ctx, g, acked)
		case frames == 40: // as if it was lost: rewind the worker to the cursor
			e := &protocol.Error{Code: protocol.CodeResyncRequired, AckedSeq: acked, ExpectedSeq: acked + 1}
			write(ctx, gc.ws, protocol.ErrorResponse(f.id, e))
		case frames == 60:
			e := &protocol.Error{Code: protocol.CodeCapacityExceeded, Retryable: true, RetryAfterMs: 1}
			write(ctx, gc.ws, protocol.ErrorResponse(f.id, e))
		case s == acked+1:
			acked = s
			ackLive(ctx, gc, f, acked)
		case s <= acked:
			ackLive(ctx, gc, f, acked)
		default:
			e := &protocol.Error{Code: protocol.CodeResyncRequired, AckedSeq: acked, ExpectedSeq: acked + 1}
			write(ctx, gc.ws, protocol.ErrorResponse(f.id, e))
		}
	}
	if err := recv(t, ctx, "the producer", produced); err != nil {
		t.Fatal(err)
	}
	if got := joinSeen(seen, acked); got != want.String() {
		t.Fatalf("the acknowledged events carry\n%q\nwant\n%q", got, want.String())
	}
	st := c.Stats()
	if st.Connects < 2 || st.Resyncs < 1 || st.CapacityRetries < 1 {
		t.Fatalf("stats %+v: the drop, the resync and the capacity rewind did not all happen", st)
	}
	if st.LiveMerged == 0 || acked >= n {
		t.Fatalf("%d deltas went as %d events (%d merged): nothing was coalesced", n, acked, st.LiveMerged)
	}
}

// joinSeen concatenates the deltas of seqs 1..acked.
func joinSeen(seen map[uint64]string, acked uint64) string {
	var b strings.Builder
	for s := uint64(1); s <= acked; s++ {
		b.WriteString(seen[s])
	}
	return b.String()
}

package hub_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/openclaw/cloudworkers/gateway/hub"
	"github.com/openclaw/cloudworkers/gateway/sessions"
	"github.com/openclaw/cloudworkers/protocol"
	"github.com/openclaw/cloudworkers/worker/remote"
)

var _ hub.SessionBackend = (*sessions.Store)(nil)

func withSessions(t *testing.T, mods ...func(*hub.Config)) (*harness, *sessions.Store) {
	t.Helper()
	var st *sessions.Store
	h := newHarness(t, func(c *hub.Config) {
		var err error
		st, err = sessions.New(sessions.Config{DB: c.DB})
		if err != nil {
			t.Fatal(err)
		}
		c.Sessions = st
		for _, mod := range mods {
			mod(c)
		}
	})
	t.Cleanup(func() { _ = st.Close(context.Background()) })
	return h, st
}

// attachedSession creates a session attached to envA and subscribes to its live events.
func attachedSession(t *testing.T, ctx context.Context, st *sessions.Store) (sessions.Session, uint64, *sessions.Subscription[*sessions.LiveRecord]) {
	t.Helper()
	ses, err := st.Create(ctx, sessions.CreateParams{})
	if err != nil {
		t.Fatal(err)
	}
	epoch, err := st.Attach(ctx, ses.ID, envA)
	if err != nil {
		t.Fatal(err)
	}
	sub, err := st.Subscribe(ctx, ses.ID, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sub.Close)
	return ses, epoch, sub
}

func userMessage(text string) protocol.Message {
	return protocol.Message{Role: protocol.RoleUser, Content: []protocol.Content{{Type: protocol.ContentText, Text: text}}, Timestamp: 1}
}

// A worker client commits and streams live events while the tunnel drops repeatedly: every commit
// lands once, in order, and every live event reaches a subscriber once, in order.
func TestClientSurvivesTunnelDrops(t *testing.T) {
	h, st := withSessions(t)
	ctx := testContext(t)
	ses, epoch, sub := attachedSession(t, ctx, st)
	const commits, events = 20, 600
	var want strings.Builder
	for i := range events {
		fmt.Fprintf(&want, "d%d", i)
	}
	// The client merges deltas it has not sent yet: the subscriber reads until it has every byte.
	received := make(chan []*sessions.LiveRecord, 1)
	go func() {
		var got []*sessions.LiveRecord
		defer func() { received <- got }()
		for n := 0; n < want.Len(); {
			r, ok := <-sub.C()
			if !ok {
				t.Errorf("subscription ended: %v", sub.Err())
				return
			}
			got = append(got, r)
			n += len(r.Event.Delta)
		}
	}()
	cfg := h.workerConfig(envA, h.mint(envA, bundleA, time.Hour, nil), bundleA)
	cfg.SessionID, cfg.OwnerEpoch, cfg.DialTimeout = ses.ID, epoch, 2*time.Second
	c, err := remote.NewClient(remote.ClientConfig{Config: cfg, RunID: "run-1", LiveWindow: 16})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := range commits {
			if _, err := c.Commit(ctx, []protocol.Message{userMessage(fmt.Sprintf("m%d", i))}); err != nil {
				t.Errorf("commit %d: %v", i, err)
				return
			}
		}
	}()
	var last uint64
	for i := range events {
		seq, err := c.Live(ctx, protocol.LiveEvent{Type: protocol.LiveTextDelta, Delta: fmt.Sprintf("d%d", i)})
		if err != nil {
			t.Fatal(err)
		}
		last = seq
		if i%150 == 75 {
			h.dropTunnel()
			h.listen()
		}
	}
	if err := c.WaitLiveAcked(ctx, last); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	got := recvChan(t, "subscriber", received)
	var text strings.Builder
	for i, r := range got {
		if r.Seq != uint64(i+1) || r.Event.Type != protocol.LiveTextDelta {
			t.Fatalf("event %d: got seq %d %s, want seq %d text_delta", i, r.Seq, r.Event.Type, i+1)
		}
		text.WriteString(r.Event.Delta)
	}
	if text.String() != want.String() || uint64(len(got)) != last {
		t.Fatalf("subscriber got %d events (last seq %d) carrying\n%q\nwant every delta once, in order:\n%q",
			len(got), last, text.String(), want.String())
	}
	select {
	case r := <-sub.C():
		t.Fatalf("extra event %+v", r)
	default:
	}
	msgs, err := st.Context(ctx, ses.ID)
	if err != nil {
		t.Fatal(err)
	}
	if len(msgs) != commits {
		t.Fatalf("%d messages, want %d", len(msgs), commits)
	}
	for i, m := range msgs {
		if m.Text() != fmt.Sprintf("m%d", i) {
			t.Fatalf("message %d = %q", i, m.Text())
		}
	}
	if c.Stats().Connects < 2 {
		t.Fatalf("stats %+v: the tunnel drops did not reconnect", c.Stats())
	}
}

// slowBackend blocks live events of the session "slow" until released.
type slowBackend struct {
	release chan struct{}
	entered chan uint64 // seqs of the slow session as they reach the backend
}

func (b *slowBackend) WorkerBinding(context.Context, string) (protocol.Binding, error) {
	return protocol.Binding{EnvironmentID: envA, OwnerEpoch: 1}, nil
}
func (b *slowBackend) WorkerCommit(context.Context, protocol.TranscriptCommitParams) (protocol.TranscriptCommitResult, error) {
	return protocol.TranscriptCommitResult{}, nil
}
func (b *slowBackend) WorkerResume(context.Context, protocol.ResumeParams) (protocol.ResumeResult, error) {
	return protocol.ResumeResult{}, nil
}
func (b *slowBackend) WorkerLive(ctx context.Context, _ string, p protocol.LiveEventParams) (protocol.LiveEventResult, error) {
	if p.SessionID == "slow" {
		b.entered <- p.Seq
		select {
		case <-b.release:
		case <-ctx.Done():
			return protocol.LiveEventResult{}, ctx.Err()
		}
	}
	return protocol.LiveEventResult{AckedSeq: p.Seq}, nil
}

// A stream whose backend is stuck fills its bounded queue and is answered capacity-exceeded with
// retryAfterMs; another stream on the same connection is served meanwhile (no head-of-line
// blocking); the environment shows backpressure.
func TestStreamQueueBackpressureWithoutHeadOfLineBlocking(t *testing.T) {
	b := &slowBackend{release: make(chan struct{}), entered: make(chan uint64, 16)}
	h := newHarness(t, func(c *hub.Config) { c.Sessions = b; c.StreamQueue = 4; c.RetryAfter = 150 * time.Millisecond })
	c := rawConn(t, h)
	sendFrame(t, c, connectFrame(t, envA, h.mint(envA, bundleA, time.Hour, nil), bundleA))
	if f := recvFrame(t, c); !f.OK {
		t.Fatalf("connect: %+v", f.Error)
	}
	live := func(id, session string, seq uint64) protocol.Frame {
		f, err := protocol.Request(id, protocol.MethodLiveEvent, protocol.LiveEventParams{
			Scope: protocol.Scope{SessionID: session, OwnerEpoch: 1, StreamKind: protocol.StreamLive, RunEpoch: 1, Seq: seq},
			Event: protocol.LiveEvent{Type: protocol.LiveTextDelta, Delta: "x"}})
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	// One in service, four queued, the rest refused.
	sendFrame(t, c, live("s0", "slow", 1))
	recvChan(t, "s0 in the backend", b.entered)
	for i := 1; i < 10; i++ {
		sendFrame(t, c, live(fmt.Sprintf("s%d", i), "slow", uint64(i+1)))
	}
	refused := 0
	for range 5 {
		f := recvFrame(t, c)
		if f.OK || f.Error.Code != protocol.CodeCapacityExceeded || f.Error.RetryAfterMs != 150 || !f.Error.Retryable {
			t.Fatalf("answer %+v (%+v), want capacity-exceeded with retryAfterMs", f, f.Error)
		}
		refused++
	}
	if bp := h.srv.Backpressure(envA); !bp.Active || bp.Rejected != uint64(refused) {
		t.Fatalf("backpressure %+v, want active with %d rejections", bp, refused)
	}
	// The fast stream is answered while the slow one is stuck.
	sendFrame(t, c, live("f1", "fast", 1))
	if f := recvFrame(t, c); f.ID != "f1" || !f.OK {
		t.Fatalf("fast stream answer %+v", f)
	}
	close(b.release)
	got := map[string]bool{}
	for range 5 {
		f := recvFrame(t, c)
		if !f.OK {
			t.Fatalf("slow stream answer %+v", f.Error)
		}
		got[f.ID] = true
	}
	for i := range 5 {
		if !got[fmt.Sprintf("s%d", i)] {
			t.Fatalf("queued request s%d not answered: %v", i, got)
		}
	}
}

// Workers merge deltas into longer live events, but the gateway does not rely on their bound: a
// delta of any length within the frame limit is one event, stored and fanned out whole; a frame
// over the limit closes the connection (message too big) and nothing of it is stored.
func TestLongDeltaWithinFrameLimitAndHugeOneRefused(t *testing.T) {
	const limit = 128 << 10
	h, st := withSessions(t, func(c *hub.Config) { c.FrameLimit = limit })
	ctx := testContext(t)
	ses, epoch, sub := attachedSession(t, ctx, st)
	c := rawConn(t, h)
	sendFrame(t, c, connectFrame(t, envA, h.mint(envA, bundleA, time.Hour, nil), bundleA, func(a *protocol.Admission) {
		a.SessionID, a.OwnerEpoch = ses.ID, epoch
	}))
	if f := recvFrame(t, c); !f.OK {
		t.Fatalf("connect: %+v", f.Error)
	}
	live := func(id string, seq uint64, delta string) protocol.Frame {
		f, err := protocol.Request(id, protocol.MethodLiveEvent, protocol.LiveEventParams{
			Scope: protocol.Scope{SessionID: ses.ID, OwnerEpoch: epoch, StreamKind: protocol.StreamLive, RunEpoch: 1, Seq: seq},
			Event: protocol.LiveEvent{Type: protocol.LiveTextDelta, Delta: delta}})
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	long := strings.Repeat("long delta ", (limit/2)/len("long delta ")) // 64 KiB: 4× the client's bound
	sendFrame(t, c, live("l1", 1, long))
	if f := recvFrame(t, c); !f.OK {
		t.Fatalf("a %d-byte delta within the frame limit was refused: %+v", len(long), f.Error)
	}
	if r := recvChan(t, "the long event", sub.C()); r.Seq != 1 || r.Event.Delta != long {
		t.Fatalf("subscriber got seq %d with %d bytes, want seq 1 with the whole %d-byte delta", r.Seq, len(r.Event.Delta), len(long))
	}

	sendFrame(t, c, live("l2", 2, strings.Repeat("x", limit+1)))
	_, _, err := c.Read(ctx)
	if got := websocket.CloseStatus(err); got != websocket.StatusMessageTooBig {
		t.Fatalf("after a live event over the frame limit read = %v, want close status %v", err, websocket.StatusMessageTooBig)
	}
	if cur, err := st.LiveCursor(ctx, ses.ID); err != nil || cur != 1 {
		t.Fatalf("live cursor %d (%v) after the oversized event, want 1: nothing of it stored", cur, err)
	}
}

// A worker.resume names a session id of at most 128 bytes, checked before a stream is made for
// it: a worker cannot make the gateway keep (and echo back) ids of many megabytes.
func TestResumeRefusesAnOverlongSessionID(t *testing.T) {
	h, _ := withSessions(t)
	c := rawConn(t, h)
	sendFrame(t, c, connectFrame(t, envA, h.mint(envA, bundleA, time.Hour, nil), bundleA))
	if f := recvFrame(t, c); !f.OK {
		t.Fatalf("connect: %+v", f.Error)
	}
	f, err := protocol.Request("r1", protocol.MethodResume, protocol.ResumeParams{SessionID: strings.Repeat("s", 129), OwnerEpoch: 1})
	if err != nil {
		t.Fatal(err)
	}
	sendFrame(t, c, f)
	res := recvFrame(t, c)
	if res.OK || res.Error == nil || res.Error.Code != protocol.CodeInvalidFrame || len(res.Error.Message) > 200 {
		t.Fatalf("resume of a 129-byte session id: %+v, want a short invalid-frame", res.Error)
	}
}

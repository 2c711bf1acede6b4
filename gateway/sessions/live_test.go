package sessions

import (
	"errors"
	"path/filepath"
	"testing"

	"github.com/openclaw/cloudworkers/protocol"
)

func delta(s string) LiveEvent { return LiveEvent{Type: LiveTextDelta, Delta: s} }

// recv returns the items already delivered to sub, without waiting (publication is synchronous).
func recv[T any](t *testing.T, sub *Subscription[T]) []T {
	t.Helper()
	var out []T
	for {
		select {
		case it, ok := <-sub.C():
			if !ok {
				return out
			}
			out = append(out, it)
		default:
			return out
		}
	}
}

func TestLiveDedupeResyncAndFencing(t *testing.T) {
	ctx := testCtx(t)
	s := newStore(t)
	ses, _ := s.Create(ctx, CreateParams{})
	sub, err := s.Subscribe(ctx, ses.ID, 0)
	if err != nil {
		t.Fatal(err)
	}
	pub := func(owner, run, seq uint64) (uint64, error) {
		return s.PublishLive(ctx, LiveParams{SessionID: ses.ID, OwnerEpoch: owner, RunEpoch: run, RunID: "run1", Seq: seq, Event: delta("x")})
	}
	for seq := uint64(1); seq <= 3; seq++ {
		if acked, err := pub(1, 1, seq); err != nil || acked != seq {
			t.Fatalf("seq %d: acked %d, %v", seq, acked, err)
		}
	}
	// A resent seq is acknowledged (cumulatively) without being published again.
	if acked, err := pub(1, 1, 2); err != nil || acked != 3 {
		t.Fatalf("duplicate: acked %d, %v", acked, err)
	}
	// A gap asks the worker to resume at ackedSeq+1.
	_, err = pub(1, 1, 5)
	se := wantCode(t, err, CodeResyncRequired)
	if se.AckedSeq != 3 || se.ExpectedSeq != 4 {
		t.Fatalf("resync-required {ackedSeq %d, expectedSeq %d}, want {3, 4}", se.AckedSeq, se.ExpectedSeq)
	}
	// A new run epoch starts its own stream at seq 1; the old run's late events are fenced.
	if _, err := pub(1, 2, 2); CodeOf(err) != CodeResyncRequired {
		t.Fatalf("new run starting at seq 2: %v", err)
	}
	if acked, err := pub(1, 2, 1); err != nil || acked != 1 {
		t.Fatalf("new run seq 1: acked %d, %v", acked, err)
	}
	wantCode(t, func() error { _, err := pub(1, 1, 4); return err }(), protocol.CodeEpochMismatch)
	// A new owner fences the old one entirely.
	if _, err := s.AdvanceOwnerEpoch(ctx, ses.ID); err != nil {
		t.Fatal(err)
	}
	wantCode(t, func() error { _, err := pub(1, 2, 2); return err }(), protocol.CodeEpochMismatch)
	wantCode(t, func() error { _, err := pub(3, 1, 1); return err }(), protocol.CodeEpochMismatch)
	if acked, err := pub(2, 1, 1); err != nil || acked != 1 {
		t.Fatalf("new owner: acked %d, %v", acked, err)
	}
	// Invalid events are rejected before anything else.
	if _, err := s.PublishLive(ctx, LiveParams{SessionID: ses.ID, OwnerEpoch: 2, RunEpoch: 1, Seq: 2,
		Event: LiveEvent{Type: LiveToolStart, ToolName: "bash"}}); CodeOf(err) != protocol.CodeInvalidFrame {
		t.Fatalf("tool_start without toolCallId: %v", err)
	}

	var got []uint64
	for _, r := range recv(t, sub) {
		if r.Cursor != uint64(len(got)+1) {
			t.Fatalf("cursor %d at position %d", r.Cursor, len(got))
		}
		got = append(got, r.RunEpoch*100+r.Seq)
	}
	want := []uint64{101, 102, 103, 201, 101}
	if len(got) != len(want) {
		t.Fatalf("subscriber got %v (runEpoch*100+seq), want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("subscriber got %v, want %v", got, want)
		}
	}
}

func TestLiveCursorSurvivesReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "gw.db")
	ctx := testCtx(t)
	s1 := openStore(t, path, Config{})
	ses, _ := s1.Create(ctx, CreateParams{})
	for seq := uint64(1); seq <= 3; seq++ {
		if _, err := s1.PublishLive(ctx, LiveParams{SessionID: ses.ID, OwnerEpoch: 1, RunEpoch: 1, Seq: seq, Event: delta("x")}); err != nil {
			t.Fatal(err)
		}
	}
	_ = s1.Close(ctx)
	_ = s1.db.Close()

	s2 := openStore(t, path, Config{})
	sub, err := s2.Subscribe(ctx, ses.ID, 3)
	if err != nil {
		t.Fatal(err)
	}
	if sub.Missed != 0 {
		t.Fatalf("a subscriber resuming at the persisted cursor missed %d", sub.Missed)
	}
	// The worker resends its unacknowledged tail: seq 3 is acknowledged without a second publication.
	if acked, err := s2.PublishLive(ctx, LiveParams{SessionID: ses.ID, OwnerEpoch: 1, RunEpoch: 1, Seq: 3, Event: delta("x")}); err != nil || acked != 3 {
		t.Fatalf("resent seq 3 after restart: acked %d, %v", acked, err)
	}
	_, err = s2.PublishLive(ctx, LiveParams{SessionID: ses.ID, OwnerEpoch: 1, RunEpoch: 1, Seq: 5, Event: delta("x")})
	if se := wantCode(t, err, CodeResyncRequired); se.ExpectedSeq != 4 {
		t.Fatalf("expectedSeq %d after restart, want 4", se.ExpectedSeq)
	}
	if _, err := s2.PublishLive(ctx, LiveParams{SessionID: ses.ID, OwnerEpoch: 1, RunEpoch: 1, Seq: 4, Event: delta("x")}); err != nil {
		t.Fatal(err)
	}
	got := recv(t, sub)
	if len(got) != 1 || got[0].Seq != 4 || got[0].Cursor != 4 {
		t.Fatalf("after restart the subscriber got %+v, want only seq 4 at cursor 4", got)
	}
	// An older run epoch stays fenced after the restart.
	if _, err := s2.PublishLive(ctx, LiveParams{SessionID: ses.ID, OwnerEpoch: 1, RunEpoch: 2, Seq: 1, Event: delta("x")}); err != nil {
		t.Fatal(err)
	}
	_ = s2.Close(ctx)
	_ = s2.db.Close()
	s3 := openStore(t, path, Config{})
	_, err = s3.PublishLive(ctx, LiveParams{SessionID: ses.ID, OwnerEpoch: 1, RunEpoch: 1, Seq: 5, Event: delta("x")})
	wantCode(t, err, protocol.CodeEpochMismatch)
}

func TestSlowSubscriberIsDropped(t *testing.T) {
	const buffer, retention, events = 8, 50, 300
	ctx := testCtx(t)
	s := openStore(t, filepath.Join(t.TempDir(), "gw.db"), Config{SubscriberBuffer: buffer, Retention: retention})
	ses, _ := s.Create(ctx, CreateParams{})
	stalled, _ := s.Subscribe(ctx, ses.ID, 0)
	reader, _ := s.Subscribe(ctx, ses.ID, 0)
	var got []uint64
	for seq := uint64(1); seq <= events; seq++ {
		// PublishLive returning at all while stalled never reads is the "never blocks" property.
		if _, err := s.PublishLive(ctx, LiveParams{SessionID: ses.ID, OwnerEpoch: 1, RunEpoch: 1, Seq: seq, Event: delta("x")}); err != nil {
			t.Fatal(err)
		}
		select {
		case r := <-reader.C():
			got = append(got, r.Seq)
		default:
			t.Fatalf("seq %d was not delivered to the reading subscriber", seq)
		}
	}
	for i, seq := range got {
		if seq != uint64(i+1) {
			t.Fatalf("reader got seq %d at position %d", seq, i)
		}
	}
	if len(got) != events || len(recv(t, reader)) != 0 {
		t.Fatalf("reader got %d events, want exactly %d", len(got), events)
	}
	if n := len(recv(t, stalled)); n != buffer {
		t.Fatalf("stalled subscriber held %d events, want its buffer of %d", n, buffer)
	}
	if !errors.Is(stalled.Err(), ErrLagged) {
		t.Fatalf("stalled subscriber ended with %v, want ErrLagged", stalled.Err())
	}
	if reader.Err() != nil {
		t.Fatalf("reader ended: %v", reader.Err())
	}
	ls, _ := s.liveFor(ctx, ses.ID)
	ls.feed.mu.Lock()
	ringLen, subs := len(ls.feed.ring), len(ls.feed.subs)
	ls.feed.mu.Unlock()
	if ringLen != retention || subs != 1 {
		t.Fatalf("ring holds %d events (retention %d), %d subscribers (want 1)", ringLen, retention, subs)
	}
	// A late subscriber far behind the ring learns how many events it missed, then gets the retained ones.
	late, _ := s.Subscribe(ctx, ses.ID, 0)
	if late.Missed != events-retention || len(recv(t, late)) != retention {
		t.Fatalf("late subscriber: missed %d", late.Missed)
	}
	reader.Close()
	reader.Close()
	if !errors.Is(reader.Err(), ErrClosed) {
		t.Fatalf("closed subscriber ended with %v", reader.Err())
	}
}

func TestLiveEventValidate(t *testing.T) {
	tests := []struct {
		name string
		ev   LiveEvent
		ok   bool
	}{
		{"text", LiveEvent{Type: LiveTextDelta, Delta: "hi"}, true},
		{"thinking", LiveEvent{Type: LiveThinkingDelta, Delta: "hm"}, true},
		{"tool start", LiveEvent{Type: LiveToolStart, ToolCallID: "c1", ToolName: "bash", Args: []byte(`{"cmd":"ls"}`)}, true},
		{"tool update", LiveEvent{Type: LiveToolUpdate, ToolCallID: "c1", PartialResult: []byte(`"out"`)}, true},
		{"tool result", LiveEvent{Type: LiveToolResult, ToolCallID: "c1", Result: []byte(`{}`), IsError: true}, true},
		{"lifecycle end", LiveEvent{Type: LiveLifecycleEnd}, true},
		{"lifecycle error", LiveEvent{Type: LiveLifecycleError, Error: "boom"}, true},
		{"unknown type", LiveEvent{Type: "approval"}, false},
		{"text with tool field", LiveEvent{Type: LiveTextDelta, Delta: "x", ToolName: "bash"}, false},
		{"lifecycle start with delta", LiveEvent{Type: LiveLifecycleStart, Delta: "x"}, false},
		{"error without message", LiveEvent{Type: LiveLifecycleError}, false},
		{"args not JSON", LiveEvent{Type: LiveToolStart, ToolCallID: "c", ToolName: "n", Args: []byte(`{`)}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.ev.Validate(); (err == nil) != tt.ok {
				t.Fatalf("Validate = %v, want ok=%v", err, tt.ok)
			}
		})
	}
}

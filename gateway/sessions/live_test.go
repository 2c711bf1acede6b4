package sessions

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/openclaw/cloudworkers/protocol"
)

func delta(s string) protocol.LiveEvent {
	return protocol.LiveEvent{Type: protocol.LiveTextDelta, Delta: s}
}

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
		Event: protocol.LiveEvent{Type: protocol.LiveToolStart, ToolName: "bash"}}); CodeOf(err) != protocol.CodeInvalidFrame {
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

// reopen closes s and opens a new store over the same database, as after a gateway restart.
func reopen(t *testing.T, s *Store, path string, cfg Config) *Store {
	t.Helper()
	_ = s.Close(testCtx(t))
	_ = s.db.Close()
	return openStore(t, path, cfg)
}

// seqs returns the (runEpoch*100+seq) and cursor of each record.
func seqs(recs []*LiveRecord) (ids, cursors []uint64) {
	for _, r := range recs {
		ids, cursors = append(ids, r.RunEpoch*100+r.Seq), append(cursors, r.Cursor)
	}
	return ids, cursors
}

func countRows(t *testing.T, s *Store, id string) int {
	t.Helper()
	var n int
	if err := s.db.R.QueryRowContext(testCtx(t), `SELECT COUNT(*) FROM live_events WHERE session_id = ?`, id).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestLiveEventsReplayAfterRestart: events acknowledged before a restart are replayed, exactly once and
// unchanged, to a subscriber that resumes from any retained cursor; a resent event is not replayed
// again, and retention bounds both the table and the replay.
func TestLiveEventsReplayAfterRestart(t *testing.T) {
	const retention = 5
	path := filepath.Join(t.TempDir(), "gw.db")
	ctx := testCtx(t)
	cfg := Config{Retention: retention}
	s := openStore(t, path, cfg)
	ses, _ := s.Create(ctx, CreateParams{})
	all, err := s.Subscribe(ctx, ses.ID, 0)
	if err != nil {
		t.Fatal(err)
	}
	events := []protocol.LiveEvent{{Type: protocol.LiveLifecycleStart}, delta("a"), {Type: protocol.LiveToolStart, ToolCallID: "c1", ToolName: "bash",
		Args: []byte(`{"cmd":"ls"}`)}, {Type: protocol.LiveToolResult, ToolCallID: "c1", Result: []byte(`"ok"`), IsError: true}}
	for i, ev := range events {
		if _, err := s.PublishLive(ctx, LiveParams{SessionID: ses.ID, OwnerEpoch: 1, RunEpoch: 1, RunID: "r1", Seq: uint64(i + 1), Event: ev}); err != nil {
			t.Fatal(err)
		}
	}
	published := recv(t, all)

	s = reopen(t, s, path, cfg)
	for from := uint64(0); from <= 4; from++ {
		sub, err := s.Subscribe(ctx, ses.ID, from)
		if err != nil {
			t.Fatal(err)
		}
		got := recv(t, sub)
		if sub.Missed != 0 || len(got) != len(published[from:]) || (len(got) > 0 && !reflect.DeepEqual(got, published[from:])) {
			t.Fatalf("resuming after cursor %d: missed %d, got %+v, want %+v", from, sub.Missed, got, published[from:])
		}
		sub.Close()
	}
	sub, _ := s.Subscribe(ctx, ses.ID, 2)
	// The worker resends its tail (the ACK of seq 4 was lost in the crash), then continues.
	for _, seq := range []uint64{3, 4, 5} {
		if acked, err := s.PublishLive(ctx, LiveParams{SessionID: ses.ID, OwnerEpoch: 1, RunEpoch: 1, RunID: "r1", Seq: seq, Event: delta("b")}); err != nil || acked != max(seq, 4) {
			t.Fatalf("seq %d after restart: acked %d, %v", seq, acked, err)
		}
	}
	if ids, cursors := seqs(recv(t, sub)); !reflect.DeepEqual(ids, []uint64{103, 104, 105}) || !reflect.DeepEqual(cursors, []uint64{3, 4, 5}) {
		t.Fatalf("subscriber got seqs %v at cursors %v, want 103..105 at 3..5, each once", ids, cursors)
	}

	// Retention: only the newest events are kept, in SQLite as in memory.
	for seq := uint64(6); seq <= 12; seq++ {
		if _, err := s.PublishLive(ctx, LiveParams{SessionID: ses.ID, OwnerEpoch: 1, RunEpoch: 1, Seq: seq, Event: delta("c")}); err != nil {
			t.Fatal(err)
		}
	}
	if n := countRows(t, s, ses.ID); n != retention {
		t.Fatalf("live_events holds %d rows of the session, want %d", n, retention)
	}
	s = reopen(t, s, path, cfg)
	late, _ := s.Subscribe(ctx, ses.ID, 0)
	ids, cursors := seqs(recv(t, late))
	if late.Missed != 7 || !reflect.DeepEqual(cursors, []uint64{8, 9, 10, 11, 12}) || ids[0] != 108 {
		t.Fatalf("late subscriber after restart: missed %d, seqs %v at cursors %v; want 7 missed, cursors 8..12", late.Missed, ids, cursors)
	}
	// A smaller retention after a restart replays less and trims on the next event.
	s = reopen(t, s, path, Config{Retention: 2})
	late, _ = s.Subscribe(ctx, ses.ID, 0)
	if _, cursors := seqs(recv(t, late)); late.Missed != 10 || !reflect.DeepEqual(cursors, []uint64{11, 12}) {
		t.Fatalf("retention 2: missed %d, cursors %v", late.Missed, cursors)
	}
	if _, err := s.PublishLive(ctx, LiveParams{SessionID: ses.ID, OwnerEpoch: 1, RunEpoch: 1, Seq: 13, Event: delta("d")}); err != nil {
		t.Fatal(err)
	}
	if n := countRows(t, s, ses.ID); n != 2 {
		t.Fatalf("live_events holds %d rows after retention shrank to 2", n)
	}
}

// TestLiveAckedOnlyOnceStored: an event whose transaction fails is neither acknowledged nor
// published; its resend is, once. If the outcome of a commit is unknown to the store (it reported an
// error but the rows are there), the resend is acknowledged and the event published once.
func TestLiveAckedOnlyOnceStored(t *testing.T) {
	ctx := testCtx(t)
	s := newStore(t)
	ses, _ := s.Create(ctx, CreateParams{})
	sub, _ := s.Subscribe(ctx, ses.ID, 0)
	pub := func(seq uint64) (uint64, error) {
		return s.PublishLive(ctx, LiveParams{SessionID: ses.ID, OwnerEpoch: 1, RunEpoch: 1, RunID: "r", Seq: seq, Event: delta(fmt.Sprint(seq))})
	}
	exec := func(q string) {
		t.Helper()
		if _, err := s.db.W.ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	for seq := uint64(1); seq <= 2; seq++ {
		if _, err := pub(seq); err != nil {
			t.Fatal(err)
		}
	}
	exec(`CREATE TRIGGER fail_live BEFORE INSERT ON live_events WHEN NEW.seq = 3 BEGIN SELECT RAISE(ABORT, 'disk full'); END`)
	if acked, err := pub(3); err == nil || acked != 0 {
		t.Fatalf("seq 3 with a failing write: acked %d, %v; want an error", acked, err)
	}
	if n := countRows(t, s, ses.ID); n != 2 {
		t.Fatalf("%d rows after a failed write, want 2", n)
	}
	exec(`DROP TRIGGER fail_live`)
	if acked, err := pub(3); err != nil || acked != 3 {
		t.Fatalf("resent seq 3: acked %d, %v", acked, err)
	}

	// Seq 4 commits, but the store believes it failed (as after a commit error of unknown outcome).
	ls, _ := s.liveFor(ctx, ses.ID)
	err := s.db.InTx(ctx, func(tx *sql.Tx) error {
		rec := &LiveRecord{Cursor: 4, SessionID: ses.ID, RunEpoch: 1, RunID: "r", Seq: 4, At: s.now(), Event: delta("4")}
		if err := s.insertLiveEvent(ctx, tx, 1, rec); err != nil {
			return err
		}
		return s.writeCursor(ctx, tx, ses.ID, 1, 1, "r", 4, 4)
	})
	if err != nil {
		t.Fatal(err)
	}
	ls.stale = true
	for _, seq := range []uint64{4, 4, 5} {
		if acked, err := pub(seq); err != nil || acked != seq {
			t.Fatalf("seq %d: acked %d, %v", seq, acked, err)
		}
	}
	ids, cursors := seqs(recv(t, sub))
	if !reflect.DeepEqual(ids, []uint64{101, 102, 103, 104, 105}) || !reflect.DeepEqual(cursors, []uint64{1, 2, 3, 4, 5}) {
		t.Fatalf("subscriber got seqs %v at cursors %v, want 101..105 at 1..5, each once", ids, cursors)
	}
	for i, r := range recv(t, sub) {
		t.Fatalf("extra record %d: %+v", i, r)
	}
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

// A live event through an environment the session is not attached to, or of another lifecycle
// revision, is refused in the transaction that would write it, and nothing is stored.
// attachedStore is a store with one session attached to env_a, and its owner epoch.
func attachedStore(t *testing.T) (context.Context, *Store, Session, uint64) {
	t.Helper()
	ctx := testCtx(t)
	s := newStore(t)
	ses, _ := s.Create(ctx, CreateParams{})
	epoch, err := s.Attach(ctx, ses.ID, "env_a")
	if err != nil {
		t.Fatal(err)
	}
	return ctx, s, ses, epoch
}

func TestPublishLiveChecksTheBinding(t *testing.T) {
	ctx, s, ses, epoch := attachedStore(t)
	pub := func(env string, rev uint64) error {
		_, err := s.PublishLive(ctx, LiveParams{SessionID: ses.ID, EnvironmentID: env, OwnerEpoch: epoch, LifecycleRevision: rev,
			RunEpoch: 1, RunID: "r", Seq: 1, Event: delta("x")})
		return err
	}
	wantCode(t, pub("env_b", 0), protocol.CodeSessionNotAttached)
	wantCode(t, pub("env_a", ses.LifecycleRevision+1), protocol.CodeEpochMismatch)
	if cur, err := s.LiveCursor(ctx, ses.ID); err != nil || cur != 0 {
		t.Fatalf("live cursor %d (%v) after two refusals, want 0", cur, err)
	}
	if err := pub("env_a", 0); err != nil {
		t.Fatal(err)
	}
	if err := pub("env_a", ses.LifecycleRevision); err != nil { // the same seq again: acknowledged, not stored twice
		t.Fatal(err)
	}
	if cur, err := s.LiveCursor(ctx, ses.ID); err != nil || cur != 1 {
		t.Fatalf("live cursor %d (%v), want 1", cur, err)
	}
}

// A worker's live event over protocol.MaxLiveEventBytes is refused invalid-frame and neither
// stored nor counted: the gateway keeps the newest events of a session, in memory and in SQLite.
func TestPublishLiveRefusesAnOversizedEvent(t *testing.T) {
	ctx, s, ses, epoch := attachedStore(t)
	_, err := s.PublishLive(ctx, LiveParams{SessionID: ses.ID, EnvironmentID: "env_a", OwnerEpoch: epoch,
		RunEpoch: 1, RunID: "r", Seq: 1, Event: delta(strings.Repeat("x", protocol.MaxLiveEventBytes+1))})
	wantCode(t, err, protocol.CodeInvalidFrame)
	if cur, err := s.LiveCursor(ctx, ses.ID); err != nil || cur != 0 {
		t.Fatalf("live cursor %d (%v) after the refusal, want 0", cur, err)
	}
	// the largest event allowed is stored
	if _, err := s.PublishLive(ctx, LiveParams{SessionID: ses.ID, EnvironmentID: "env_a", OwnerEpoch: epoch,
		RunEpoch: 1, RunID: "r", Seq: 1, Event: delta(strings.Repeat("x", protocol.MaxLiveEventBytes))}); err != nil {
		t.Fatal(err)
	}
}

// TestLastRunEnd: the newest lifecycle end or error a run published is found by its type, not by
// text that a delta may carry (a worker's text is no lifecycle event).
func TestLastRunEnd(t *testing.T) {
	ctx := testCtx(t)
	s := newStore(t)
	ses, _ := s.Create(ctx, CreateParams{})
	if _, ok, err := s.LastRunEnd(ctx, ses.ID); ok || err != nil {
		t.Fatalf("a session with no run: %v %v", ok, err)
	}
	seq := uint64(0)
	pub := func(ev protocol.LiveEvent) {
		t.Helper()
		seq++
		if _, err := s.PublishLive(ctx, LiveParams{SessionID: ses.ID, OwnerEpoch: 1, RunEpoch: 1, RunID: "run1", Seq: seq, Event: ev}); err != nil {
			t.Fatal(err)
		}
	}
	pub(protocol.LiveEvent{Type: protocol.LiveLifecycleStart})
	pub(protocol.LiveEvent{Type: protocol.LiveLifecycleEnd, StoppedProcesses: 2})
	pub(delta(`{"type":"lifecycle_end","stoppedProcesses":99} "lifecycle_error`))
	ev, ok, err := s.LastRunEnd(ctx, ses.ID)
	if err != nil || !ok || ev.Type != protocol.LiveLifecycleEnd || ev.StoppedProcesses != 2 {
		t.Fatalf("LastRunEnd = %+v %v %v, want the end that stopped 2", ev, ok, err)
	}
}

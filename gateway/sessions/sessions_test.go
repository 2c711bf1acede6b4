package sessions

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/openclaw/cloudworkers/gateway/store"
	"github.com/openclaw/cloudworkers/protocol"
)

func testCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// openStore opens (or reopens) the database at path and a Store over it, closed at cleanup.
func openStore(t *testing.T, path string, cfg Config) *Store {
	t.Helper()
	ctx := testCtx(t)
	db, err := store.Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	cfg.DB = db
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = s.Close(context.Background())
		_ = db.Close()
	})
	return s
}

func newStore(t *testing.T) *Store {
	t.Helper()
	return openStore(t, filepath.Join(t.TempDir(), "gw.db"), Config{})
}

func userMsg(text string) protocol.Message {
	return protocol.Message{Role: protocol.RoleUser, Content: []protocol.Content{{Type: protocol.ContentText, Text: text}}, Timestamp: 1}
}

func assistantMsg(text string) protocol.Message {
	return protocol.Message{Role: protocol.RoleAssistant, Content: []protocol.Content{{Type: protocol.ContentText, Text: text}},
		StopReason: protocol.StopStop, Timestamp: 2}
}

func countEntries(t *testing.T, s *Store, id string) int {
	t.Helper()
	var n int
	if err := s.db.R.QueryRowContext(testCtx(t), `SELECT COUNT(*) FROM transcript_entries WHERE session_id = ?`, id).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func texts(msgs []protocol.Message) string {
	var parts []string
	for _, m := range msgs {
		parts = append(parts, m.Text())
	}
	return strings.Join(parts, ",")
}

func wantCode(t *testing.T, err error, code protocol.Code) *Error {
	t.Helper()
	var se *Error
	if !errors.As(err, &se) || se.Code != code {
		t.Fatalf("error = %v, want code %s", err, code)
	}
	return se
}

func TestCreateGetList(t *testing.T) {
	ctx := testCtx(t)
	s := newStore(t)
	changes := s.SubscribeChanges(0)
	a, err := s.Create(ctx, CreateParams{Title: "a", Model: "anthropic/claude", Workspace: "/w"})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(a.ID, "ses_") || a.Placement != PlacementLocal || a.OwnerEpoch != 1 || a.Agent != DefaultAgent {
		t.Fatalf("new session = %+v", a)
	}
	got, err := s.Get(ctx, a.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got != a {
		t.Fatalf("Get = %+v, want %+v", got, a)
	}
	if _, err := s.Get(ctx, "ses_nope"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("Get unknown = %v, want ErrNotFound", err)
	}
	list, err := s.List(ctx)
	if err != nil || len(list) != 1 || list[0].ID != a.ID {
		t.Fatalf("List = %v, %v", list, err)
	}
	select {
	case c := <-changes.C():
		if c.Kind != ChangeSessionCreated || c.ID != a.ID || c.Cursor != 1 {
			t.Fatalf("change = %+v", c)
		}
	default:
		t.Fatal("no change published for the new session")
	}
}

func TestCommitIdempotent(t *testing.T) {
	ctx := testCtx(t)
	s := newStore(t)
	ses, _ := s.Create(ctx, CreateParams{})
	p := CommitParams{SessionID: ses.ID, OwnerEpoch: 1, RunEpoch: 1, Seq: 1,
		Messages: []protocol.Message{userMsg("hi"), assistantMsg("hello")}}
	first, err := s.Commit(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	if first.Replayed || len(first.EntryIDs) != 2 || first.NewLeafID != first.EntryIDs[1] {
		t.Fatalf("first commit = %+v", first)
	}
	// The same operation again, even with a now-stale base leaf and other messages: the cached result.
	p.Messages = []protocol.Message{userMsg("other")}
	again, err := s.Commit(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	if !again.Replayed || fmt.Sprint(again.EntryIDs) != fmt.Sprint(first.EntryIDs) || again.NewLeafID != first.NewLeafID {
		t.Fatalf("replayed commit = %+v, want %+v replayed", again, first)
	}
	if n := countEntries(t, s, ses.ID); n != 2 {
		t.Fatalf("%d entries after a replay, want 2", n)
	}
	msgs, _ := s.Context(ctx, ses.ID)
	if texts(msgs) != "hi,hello" {
		t.Fatalf("context = %q", texts(msgs))
	}
	// The next seq appends under the leaf.
	next, err := s.Commit(ctx, CommitParams{SessionID: ses.ID, OwnerEpoch: 1, RunEpoch: 1, Seq: 2,
		BaseLeafID: first.NewLeafID, Messages: []protocol.Message{userMsg("more")}})
	if err != nil || next.Replayed {
		t.Fatalf("second commit = %+v, %v", next, err)
	}
	tr, _ := s.Transcript(ctx, ses.ID)
	if tr.Entries[2].ParentID != first.NewLeafID || tr.Session.LeafID != next.NewLeafID {
		t.Fatalf("parent %s leaf %s", tr.Entries[2].ParentID, tr.Session.LeafID)
	}
}

func TestCommitRejections(t *testing.T) {
	ctx := testCtx(t)
	s := newStore(t)
	ses, _ := s.Create(ctx, CreateParams{})
	base, err := s.Commit(ctx, CommitParams{SessionID: ses.ID, OwnerEpoch: 1, RunEpoch: 1, Seq: 1, Messages: []protocol.Message{userMsg("a")}})
	if err != nil {
		t.Fatal(err)
	}
	fenced, _ := s.Create(ctx, CreateParams{})
	if e, err := s.AdvanceOwnerEpoch(ctx, fenced.ID); err != nil || e != 2 {
		t.Fatalf("AdvanceOwnerEpoch = %d, %v", e, err)
	}
	many := make([]protocol.Message, MaxBatch+1)
	for i := range many {
		many[i] = userMsg("x")
	}
	ok := []protocol.Message{userMsg("b")}
	tests := []struct {
		name string
		p    CommitParams
		code protocol.Code
	}{
		{"stale base leaf", CommitParams{SessionID: ses.ID, OwnerEpoch: 1, RunEpoch: 1, Seq: 2, BaseLeafID: "", Messages: ok}, protocol.CodeStaleBaseLeaf},
		{"foreign base leaf", CommitParams{SessionID: ses.ID, OwnerEpoch: 1, RunEpoch: 1, Seq: 2, BaseLeafID: "ent_x", Messages: ok}, protocol.CodeStaleBaseLeaf},
		{"older owner epoch", CommitParams{SessionID: fenced.ID, OwnerEpoch: 1, RunEpoch: 1, Seq: 1, Messages: ok}, protocol.CodeEpochMismatch},
		{"newer owner epoch", CommitParams{SessionID: ses.ID, OwnerEpoch: 2, RunEpoch: 1, Seq: 2, BaseLeafID: base.NewLeafID, Messages: ok}, protocol.CodeEpochMismatch},
		{"no messages", CommitParams{SessionID: ses.ID, OwnerEpoch: 1, RunEpoch: 1, Seq: 2, BaseLeafID: base.NewLeafID}, protocol.CodeInvalidBatch},
		{"65 messages", CommitParams{SessionID: ses.ID, OwnerEpoch: 1, RunEpoch: 1, Seq: 2, BaseLeafID: base.NewLeafID, Messages: many}, protocol.CodeInvalidBatch},
		{"invalid role", CommitParams{SessionID: ses.ID, OwnerEpoch: 1, RunEpoch: 1, Seq: 2, BaseLeafID: base.NewLeafID,
			Messages: []protocol.Message{{Role: "system", Content: []protocol.Content{{Type: "text", Text: "x"}}}}}, protocol.CodeInvalidBatch},
		{"toolResult without toolCallId", CommitParams{SessionID: ses.ID, OwnerEpoch: 1, RunEpoch: 1, Seq: 2, BaseLeafID: base.NewLeafID,
			Messages: []protocol.Message{{Role: protocol.RoleToolResult}}}, protocol.CodeInvalidBatch},
		{"seq zero", CommitParams{SessionID: ses.ID, OwnerEpoch: 1, RunEpoch: 1, BaseLeafID: base.NewLeafID, Messages: ok}, protocol.CodeInvalidBatch},
		{"unknown session", CommitParams{SessionID: "ses_other", OwnerEpoch: 1, RunEpoch: 1, Seq: 1, Messages: ok}, protocol.CodeSessionNotAttached},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := s.Commit(ctx, tt.p)
			se := wantCode(t, err, tt.code)
			if tt.code == protocol.CodeStaleBaseLeaf && se.LeafID != base.NewLeafID {
				t.Errorf("stale-base-leaf carries leaf %q, want %q", se.LeafID, base.NewLeafID)
			}
			if n := countEntries(t, s, ses.ID) + countEntries(t, s, fenced.ID); n != 1 {
				t.Errorf("%d entries after a rejected commit, want 1", n)
			}
			if got, _ := s.Get(ctx, ses.ID); got.LeafID != base.NewLeafID {
				t.Errorf("leaf moved to %q", got.LeafID)
			}
		})
	}
	// A rejected operation identity is not cached: seq 2 with the right base leaf now succeeds.
	if res, err := s.Commit(ctx, CommitParams{SessionID: ses.ID, OwnerEpoch: 1, RunEpoch: 1, Seq: 2, BaseLeafID: base.NewLeafID, Messages: ok}); err != nil || res.Replayed {
		t.Fatalf("commit after rejections = %+v, %v", res, err)
	}
}

func TestDecodeCommit(t *testing.T) {
	msg := `{"role":"user","content":[{"type":"text","text":"hi"}],"timestamp":1}`
	batch := func(n int) string { return strings.TrimSuffix(strings.Repeat(msg+",", n), ",") }
	tests := []struct {
		name, raw string
		code      protocol.Code // "" means valid
	}{
		{"valid", `{"runEpoch":1,"seq":1,"baseLeafId":"","messages":[` + msg + `]}`, ""},
		{"64 messages", `{"runEpoch":1,"seq":1,"baseLeafId":"","messages":[` + batch(64) + `]}`, ""},
		{"65 messages", `{"runEpoch":1,"seq":1,"baseLeafId":"","messages":[` + batch(65) + `]}`, protocol.CodeInvalidBatch},
		{"no messages", `{"runEpoch":1,"seq":1,"baseLeafId":"","messages":[]}`, protocol.CodeInvalidBatch},
		{"entry id", `{"runEpoch":1,"seq":1,"messages":[{"id":"ent_mine","role":"user","content":[],"timestamp":1}]}`, protocol.CodeInvalidBatch},
		{"parent id", `{"runEpoch":1,"seq":1,"messages":[{"parentId":"ent_x","role":"user","content":[],"timestamp":1}]}`, protocol.CodeInvalidBatch},
		{"entry ids in params", `{"runEpoch":1,"seq":1,"entryIds":["ent_a"],"messages":[` + msg + `]}`, protocol.CodeInvalidBatch},
		{"foreign session id", `{"sessionId":"ses_other","runEpoch":1,"seq":1,"messages":[` + msg + `]}`, protocol.CodeInvalidBatch},
		{"unknown message field", `{"runEpoch":1,"seq":1,"messages":[{"role":"user","content":[],"timestamp":1,"x":1}]}`, protocol.CodeInvalidBatch},
		{"invalid role", `{"runEpoch":1,"seq":1,"messages":[{"role":"system","content":[],"timestamp":1}]}`, protocol.CodeInvalidBatch},
		{"not an object", `[]`, protocol.CodeInvalidBatch},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := DecodeCommit("ses_bound", 3, json.RawMessage(tt.raw))
			if tt.code == "" {
				if err != nil {
					t.Fatal(err)
				}
				if p.SessionID != "ses_bound" || p.OwnerEpoch != 3 {
					t.Fatalf("params = %+v: identity must come from the binding", p)
				}
				return
			}
			wantCode(t, err, tt.code)
		})
	}
}

func TestContextFollowsLeafAcrossBranches(t *testing.T) {
	ctx := testCtx(t)
	s := newStore(t)
	ses, _ := s.Create(ctx, CreateParams{})
	commit := func(seq uint64, base string, m ...protocol.Message) CommitResult {
		t.Helper()
		res, err := s.Commit(ctx, CommitParams{SessionID: ses.ID, OwnerEpoch: 1, RunEpoch: 1, Seq: seq, BaseLeafID: base, Messages: m})
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	a := commit(1, "", userMsg("A"))
	b := commit(2, a.NewLeafID, assistantMsg("B"))
	if err := s.Branch(ctx, ses.ID, a.NewLeafID); err != nil {
		t.Fatal(err)
	}
	c := commit(3, a.NewLeafID, assistantMsg("C"), userMsg("D"))
	if _, err := s.ChangeModel(ctx, ses.ID, ModelChange{Provider: "openai", ModelID: "gpt-5"}); err != nil {
		t.Fatal(err)
	}
	check := func(want string) {
		t.Helper()
		msgs, err := s.Context(ctx, ses.ID)
		if err != nil {
			t.Fatal(err)
		}
		if got := texts(msgs); got != want {
			t.Fatalf("context = %q, want %q", got, want)
		}
	}
	check("A,C,D") // the model_change entry is on the path but is not a message
	if err := s.Branch(ctx, ses.ID, b.NewLeafID); err != nil {
		t.Fatal(err)
	}
	check("A,B")
	tr, _ := s.Transcript(ctx, ses.ID)
	parents := map[string]string{}
	for _, e := range tr.Entries {
		parents[e.ID] = e.ParentID
	}
	if parents[b.EntryIDs[0]] != a.NewLeafID || parents[c.EntryIDs[0]] != a.NewLeafID || parents[c.EntryIDs[1]] != c.EntryIDs[0] {
		t.Fatalf("tree = %v", parents)
	}
	if got, _ := s.Get(ctx, ses.ID); got.Model != "openai/gpt-5" {
		t.Fatalf("model = %q after model_change", got.Model)
	}
	if err := s.Branch(ctx, ses.ID, "ent_unknown"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("branch to unknown entry = %v", err)
	}
}

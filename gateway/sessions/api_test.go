package sessions

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/coder/websocket"
	"github.com/coder/websocket/wsjson"
	"github.com/labstack/echo/v4"

	"github.com/openclaw/cloudworkers/gateway/store"
	"github.com/openclaw/cloudworkers/protocol"
	"github.com/openclaw/cloudworkers/providers"
)

func newAPIServer(t *testing.T, s *Store) string {
	t.Helper()
	e := echo.New()
	RegisterAPI(e.Group("/api/v1"), s)
	srv := httptest.NewServer(e)
	t.Cleanup(srv.Close)
	return srv.URL + "/api/v1"
}

func doJSON(t *testing.T, method, url, body string, out any) int {
	t.Helper()
	req, _ := http.NewRequestWithContext(testCtx(t), method, url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if out != nil {
		if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
			t.Fatal(err)
		}
	}
	return resp.StatusCode
}

func dialWS(t *testing.T, ctx context.Context, url string) *websocket.Conn {
	t.Helper()
	conn, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(url, "http"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.CloseNow() })
	return conn
}

func TestHTTPSessions(t *testing.T) {
	s := newStore(t)
	base := newAPIServer(t, s)
	var ses Session
	ws := t.TempDir()
	if code := doJSON(t, http.MethodPost, base+"/sessions", `{"title":"t","model":"openai/gpt-5","workspace":"`+ws+`"}`, &ses); code != http.StatusCreated || ses.Workspace != ws {
		t.Fatalf("POST /sessions = %d", code)
	}
	if code := doJSON(t, http.MethodPost, base+"/sessions", ``, nil); code != http.StatusCreated {
		t.Fatalf("POST /sessions without body = %d", code)
	}
	var errBody struct {
		Error struct{ Code string } `json:"error"`
	}
	if code := doJSON(t, http.MethodPost, base+"/sessions", `{"leafId":"x"}`, &errBody); code != http.StatusBadRequest {
		t.Fatalf("POST /sessions with unknown field = %d", code)
	}
	var list []Session
	if code := doJSON(t, http.MethodGet, base+"/sessions", "", &list); code != http.StatusOK || len(list) != 2 {
		t.Fatalf("GET /sessions = %d, %d sessions", code, len(list))
	}
	if code := doJSON(t, http.MethodGet, base+"/sessions/ses_nope", "", &errBody); code != http.StatusNotFound || errBody.Error.Code != "not-found" {
		t.Fatalf("GET unknown session = %d %+v", code, errBody)
	}
	ctx := testCtx(t)
	if _, err := s.Commit(ctx, CommitParams{SessionID: ses.ID, OwnerEpoch: 1, RunEpoch: 1, Seq: 1,
		Messages: []protocol.Message{userMsg("a"), assistantMsg("b")}}); err != nil {
		t.Fatal(err)
	}
	var tr Transcript
	if code := doJSON(t, http.MethodGet, base+"/sessions/"+ses.ID+"/transcript", "", &tr); code != http.StatusOK {
		t.Fatalf("GET transcript = %d", code)
	}
	if len(tr.Entries) != 2 || tr.Entries[1].ParentID != tr.Entries[0].ID || tr.Session.LeafID != tr.Entries[1].ID {
		t.Fatalf("transcript = %+v", tr)
	}
	if code := doJSON(t, http.MethodGet, base+"/sessions/ses_nope/stream", "", &errBody); code != http.StatusNotFound {
		t.Fatalf("stream of unknown session = %d", code)
	}
}

func TestStreamReplaysThenFollows(t *testing.T) {
	ctx := testCtx(t)
	s := newStore(t)
	base := newAPIServer(t, s)
	ses, _ := s.Create(ctx, CreateParams{})
	pub := func(seq uint64, ev protocol.LiveEvent) {
		t.Helper()
		if _, err := s.PublishLive(ctx, LiveParams{SessionID: ses.ID, OwnerEpoch: 1, RunEpoch: 1, RunID: "r", Seq: seq, Event: ev}); err != nil {
			t.Fatal(err)
		}
	}
	pub(1, protocol.LiveEvent{Type: protocol.LiveLifecycleStart})
	pub(2, delta("hel"))
	pub(3, delta("lo"))
	conn := dialWS(t, ctx, base+"/sessions/"+ses.ID+"/stream?cursor=1")
	read := func() StreamMessage {
		t.Helper()
		var m StreamMessage
		if err := wsjson.Read(ctx, conn, &m); err != nil {
			t.Fatal(err)
		}
		return m
	}
	for _, want := range []uint64{2, 3} {
		if m := read(); m.Type != "live" || m.LiveRecord == nil || m.Cursor != want || m.Event.Type != protocol.LiveTextDelta {
			t.Fatalf("replayed %+v, want cursor %d", m, want)
		}
	}
	// The subscription exists once the handshake completed, so this event is followed live.
	pub(4, protocol.LiveEvent{Type: protocol.LiveToolStart, ToolCallID: "c1", ToolName: "bash", Args: json.RawMessage(`{"cmd":"ls"}`)})
	if m := read(); m.Cursor != 4 || m.Event.ToolName != "bash" || !bytes.Equal(m.Event.Args, []byte(`{"cmd":"ls"}`)) {
		t.Fatalf("followed %+v", m)
	}
	// The store closing ends the stream with a close frame.
	_ = s.Close(ctx)
	var m StreamMessage
	err := wsjson.Read(ctx, conn, &m)
	var ce websocket.CloseError
	if !errors.As(err, &ce) || ce.Reason != CloseReasonClosed {
		t.Fatalf("after store close: %v", err)
	}
}

func TestStreamLaggedClose(t *testing.T) {
	ctx := testCtx(t)
	s := openStore(t, t.TempDir()+"/gw.db", Config{SubscriberBuffer: 2})
	ses, _ := s.Create(ctx, CreateParams{})
	for seq := uint64(1); seq <= 3; seq++ {
		if _, err := s.PublishLive(ctx, LiveParams{SessionID: ses.ID, OwnerEpoch: 1, RunEpoch: 1, Seq: seq, Event: delta("x")}); err != nil {
			t.Fatal(err)
		}
	}
	// Subscribe directly and never read: the fan-out drops it; its replay stays readable.
	sub, _ := s.Subscribe(ctx, ses.ID, 0)
	for seq := uint64(4); seq <= 6; seq++ {
		if _, err := s.PublishLive(ctx, LiveParams{SessionID: ses.ID, OwnerEpoch: 1, RunEpoch: 1, Seq: seq, Event: delta("x")}); err != nil {
			t.Fatal(err)
		}
	}
	if got := recv(t, sub); len(got) != 5 || !errors.Is(sub.Err(), ErrLagged) {
		t.Fatalf("got %d items then %v; want replay 3 + buffer 2, then ErrLagged", len(got), sub.Err())
	}
}

func TestEventsFeed(t *testing.T) {
	ctx := testCtx(t)
	s := newStore(t)
	base := newAPIServer(t, s)
	conn := dialWS(t, ctx, base+"/events")
	ses, _ := s.Create(ctx, CreateParams{})
	s.Notify("environment.updated", "env_1")
	for _, want := range []string{ChangeSessionCreated + " " + ses.ID, "environment.updated env_1"} {
		var m ChangeMessage
		if err := wsjson.Read(ctx, conn, &m); err != nil {
			t.Fatal(err)
		}
		if m.Type != "change" || m.Change == nil || m.Kind+" "+m.ID != want {
			t.Fatalf("change %+v, want %s", m, want)
		}
	}
}

// TestCreateRefusesBadInput: a workspace that is not a clean absolute path, does not exist or is
// not a directory, a non-git directory with git, an unknown profile or a class the profile has not
// are refused with 400 naming the field, before a session row is written or a target dispatched.
func TestCreateRefusesBadInput(t *testing.T) {
	s := newStore(t)
	dispatched := 0
	e := echo.New()
	RegisterAPI(e.Group("/api/v1"), s,
		WithDispatch(func(context.Context, string, string, string) error { dispatched++; return nil }),
		WithTargetCheck(func(_ context.Context, profile, class string) error {
			switch {
			case profile != "good":
				return fmt.Errorf("profile %q: %w", profile, store.ErrNotFound)
			case class != "":
				return providers.Fieldf("machineClass", "provider local of profile good has no machine classes")
			}
			return nil
		}))
	srv := httptest.NewServer(e)
	t.Cleanup(srv.Close)
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	plain := filepath.Join(dir, "plain")
	if err := os.Mkdir(plain, 0o755); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "missing")
	cases := []struct{ name, body, field, says string }{
		{"missing workspace", `{"workspace":"` + missing + `"}`, "workspace", "does not exist"},
		{"missing workspace for a worker", `{"workspace":"` + missing + `","target":{"kind":"profile","profileId":"good"}}`, "workspace", "does not exist"},
		{"a file", `{"workspace":"` + file + `"}`, "workspace", "is not a directory"},
		{"relative", `{"workspace":"src/project"}`, "workspace", "absolute"},
		{"unclean", `{"workspace":"` + plain + `/../plain"}`, "workspace", "clean"},
		{"not git", `{"workspace":"` + plain + `","git":true}`, "git", "not a git work tree"},
		{"git without workspace", `{"git":true}`, "workspace", "required"},
		{"unknown profile", `{"workspace":"` + plain + `","target":{"kind":"profile","profileId":"nope"}}`, "target.profileId", "nope"},
		{"bad class", `{"workspace":"` + plain + `","target":{"kind":"profile","profileId":"good","machineClass":"big"}}`, "target.machineClass", "no machine classes"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var body struct {
				Error struct{ Code, Message, Field string } `json:"error"`
			}
			code := doJSON(t, http.MethodPost, srv.URL+"/api/v1/sessions", c.body, &body)
			if code != http.StatusBadRequest || body.Error.Field != c.field || !strings.Contains(body.Error.Message, c.says) {
				t.Fatalf("%s: %d %+v, want 400 on %s saying %q", c.body, code, body.Error, c.field, c.says)
			}
		})
	}
	if list, err := s.List(testCtx(t)); err != nil || len(list) != 0 || dispatched != 0 {
		t.Fatalf("after refused requests: %d sessions (%v), %d dispatched", len(list), err, dispatched)
	}
	if _, err := exec.LookPath("git"); err == nil {
		cmd := exec.Command("git", "init", "-q", plain)
		cmd.Env = append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git init: %v %s", err, out)
		}
		var ses Session
		if code := doJSON(t, http.MethodPost, srv.URL+"/api/v1/sessions", `{"workspace":"`+plain+`","git":true,"target":{"kind":"profile","profileId":"good"}}`, &ses); code != http.StatusCreated || dispatched != 1 {
			t.Fatalf("git work tree on a good profile: %d, %d dispatched", code, dispatched)
		}
	}
}

package mcp

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/openclaw/cloudworkers/gateway/api"
	"github.com/openclaw/cloudworkers/internal/testrig/testenv"
)

// connect serves s in memory and returns a client session of the SDK's own client.
func connect(t *testing.T, s *Server) *mcp.ClientSession {
	t.Helper()
	ctx := testenv.Context(t, 30*time.Second)
	ct, st := mcp.NewInMemoryTransports()
	ss, err := s.MCP().Connect(ctx, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test"}, nil).Connect(ctx, ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.Close(); _ = ss.Wait(); s.Close() })
	return cs
}

func text(res *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

// A gateway that refuses everything, or answers garbage, or is gone: every tool answers a tool
// error that names the gateway's code and message (or the failure), and the server lives on.
func TestToolErrorsCarryTheGatewaysCode(t *testing.T) {
	refuse := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusConflict)
		_, _ = w.Write([]byte(`{"error":{"code":"capacity","message":"profile local is at maxEnvironments 1"}}`))
	}))
	t.Cleanup(refuse.Close)
	garbage := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte(`{"id": [not json`))
	}))
	t.Cleanup(garbage.Close)
	gone := httptest.NewServer(http.NotFoundHandler())
	goneURL := gone.URL
	gone.Close()

	ws := t.TempDir()
	calls := []struct {
		tool string
		args map[string]any
	}{
		{"dispatch", map[string]any{"workspace": ws, "task": "t", "profile": "local"}},
		{"status", map[string]any{"sessionId": "ses_1"}},
		{"send", map[string]any{"sessionId": "ses_1", "message": "m"}},
		{"pullback", map[string]any{"sessionId": "ses_1"}},
		{"list_sessions", map[string]any{}},
		{"list_environments", map[string]any{}},
		{"destroy_environment", map[string]any{"environmentId": "env_1"}},
	}
	for _, gwc := range []struct{ name, url, want string }{
		{"refusing", refuse.URL, "capacity"},
		{"garbage", garbage.URL, "decode reply"},
		{"gone", goneURL, "is `openclaw gateway` running?"},
	} {
		t.Run(gwc.name, func(t *testing.T) {
			s, err := New(Config{Client: api.NewClient(gwc.url, "tok")})
			if err != nil {
				t.Fatal(err)
			}
			cs := connect(t, s)
			ctx := testenv.Context(t, 30*time.Second)
			for _, c := range calls {
				res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: c.tool, Arguments: c.args})
				if err != nil {
					t.Fatalf("%s: protocol error %v, want a tool error", c.tool, err)
				}
				if !res.IsError || !strings.Contains(text(res), gwc.want) {
					t.Fatalf("%s: isError %v, %q; want a tool error with %q", c.tool, res.IsError, text(res), gwc.want)
				}
				if gwc.name == "refusing" && !strings.Contains(text(res), "profile local is at maxEnvironments 1") {
					t.Fatalf("%s: %q lacks the gateway's message", c.tool, text(res))
				}
			}
			if _, err := cs.ListTools(ctx, nil); err != nil {
				t.Fatalf("server gone after the errors: %v", err)
			}
		})
	}
}

// Bad arguments are refused before the gateway is asked, naming what was wrong.
func TestBadArgumentsNameTheField(t *testing.T) {
	var asked atomic.Bool
	gw := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { asked.Store(true) }))
	t.Cleanup(gw.Close)
	s, err := New(Config{Client: api.NewClient(gw.URL, "tok")})
	if err != nil {
		t.Fatal(err)
	}
	cs := connect(t, s)
	ctx := testenv.Context(t, 30*time.Second)
	for _, tc := range []struct {
		tool string
		args map[string]any
		want string
	}{
		{"dispatch", map[string]any{"workspace": "", "task": "t", "profile": "p"}, "workspace is required"},
		{"dispatch", map[string]any{"workspace": "rel/dir", "task": "t", "profile": "p"}, `workspace "rel/dir" must be an absolute path`},
		{"dispatch", map[string]any{"workspace": "/abs", "task": "  ", "profile": "p"}, "task is required"},
		{"dispatch", map[string]any{"workspace": "/abs", "task": "t"}, "profile is required"},
		{"dispatch", map[string]any{"task": "t"}, "workspace"},                    // schema: required
		{"dispatch", map[string]any{"workspace": 7, "task": "t"}, "workspace"},    // schema: type
		{"dispatch", map[string]any{"workspace": "/a", "task": "t", "x": 1}, "x"}, // schema: unknown
		{"send", map[string]any{"sessionId": "ses_1", "message": ""}, "message is required"},
		{"status", map[string]any{"sessionId": ""}, "sessionId is required"},
		{"list_sessions", map[string]any{"limit": 100000}, "limit must be within 0..500"},
		{"destroy_environment", map[string]any{"environmentId": ""}, "environmentId is required"},
	} {
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: tc.tool, Arguments: tc.args})
		var msg string
		switch {
		case err != nil:
			msg = err.Error()
		case res.IsError:
			msg = text(res)
		default:
			t.Fatalf("%s %v: accepted", tc.tool, tc.args)
		}
		if !strings.Contains(msg, tc.want) {
			t.Fatalf("%s %v: %q, want it to name %q", tc.tool, tc.args, msg, tc.want)
		}
	}
	if asked.Load() {
		t.Fatal("the gateway was asked about a call refused for its arguments")
	}
}

// Resource URIs that try to name another path, or no session, are not found, and the gateway
// is never asked.
func TestResourceURIsAreStrict(t *testing.T) {
	for _, uri := range []string{
		"openclaw://sessions//diff",
		"openclaw://sessions/a/b/diff",
		"openclaw://sessions/%2e%2e%2fx/diff",
		"openclaw://sessions/a%2Fb/diff",
		"openclaw://sessions/a%5Cb/diff",
		"openclaw://sessions/a?x=1/diff",
		"openclaw://other/ses_1/diff",
		"openclaw://sessions/ses_1/diffs",
	} {
		if id, err := sessionOf(uri, diffSuffix); err == nil {
			t.Errorf("%s: accepted as session %q", uri, id)
		}
	}
	if id, err := sessionOf("openclaw://sessions/ses_1/diff", diffSuffix); err != nil || id != "ses_1" {
		t.Fatalf("good URI: %q %v", id, err)
	}
}

// /mcp opens with the operator token or the MCP token of the data dir, not with anything else;
// a rotated MCP token stops the old one at once; a token file too short is not a token.
func TestHTTPTokens(t *testing.T) {
	dir := t.TempDir()
	s, err := New(Config{Client: api.NewClient("127.0.0.1:1", "tok")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	const operator = "operator-token-0123456789abcdef0123456789abcdef"
	srv := httptest.NewServer(s.HTTPHandler(operator, dir))
	t.Cleanup(srv.Close)
	status := func(token string) int {
		t.Helper()
		req, _ := http.NewRequestWithContext(testenv.Context(t, 10*time.Second), http.MethodPost, srv.URL,
			strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if got := status(""); got != http.StatusUnauthorized {
		t.Fatalf("no token: %d", got)
	}
	if got := status(operator); got != http.StatusOK {
		t.Fatalf("operator token: %d", got)
	}
	if got := status("ocmcp_guess"); got != http.StatusUnauthorized {
		t.Fatalf("no MCP token file, a guess: %d", got)
	}
	tok, err := EnsureToken(dir, false)
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(filepath.Join(dir, TokenFile)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("token file mode: %v %v", fi, err)
	}
	if again, _ := EnsureToken(dir, false); again != tok {
		t.Fatal("EnsureToken without rotate changed the token")
	}
	if got := status(tok); got != http.StatusOK {
		t.Fatalf("MCP token: %d", got)
	}
	rotated, err := EnsureToken(dir, true)
	if err != nil || rotated == tok {
		t.Fatalf("rotate: %v", err)
	}
	if got := status(tok); got != http.StatusUnauthorized {
		t.Fatalf("the rotated-out MCP token: %d", got)
	}
	if got := status(rotated); got != http.StatusOK {
		t.Fatalf("the new MCP token: %d", got)
	}
	if err := os.WriteFile(filepath.Join(dir, TokenFile), []byte("short\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got := status("short"); got != http.StatusUnauthorized {
		t.Fatalf("a token file too short opened /mcp: %d", got)
	}
}

func TestConfigValidateNamesTheField(t *testing.T) {
	c := api.NewClient("127.0.0.1:1", "t")
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{}, "Client"},
		{Config{Client: c, MaxBackground: -1}, "mcp.maxBackground"},
		{Config{Client: c, CallTimeout: time.Millisecond}, "mcp.callTimeout"},
		{Config{Client: c, MaxResourceBytes: 10}, "mcp.maxResourceBytes"},
		{Config{Client: c, SessionTimeout: time.Millisecond}, "mcp.sessionTimeout"},
	} {
		if _, err := New(tc.cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want an error naming %s", tc.cfg, err, tc.want)
		}
	}
}

// The dispatch schema an agent reads: required fields, plain booleans with their defaults.
func TestDispatchSchema(t *testing.T) {
	s, err := New(Config{Client: api.NewClient("127.0.0.1:1", "t")})
	if err != nil {
		t.Fatal(err)
	}
	cs := connect(t, s)
	tools, err := cs.ListTools(testenv.Context(t, 10*time.Second), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tl := range tools.Tools {
		if tl.Name != "dispatch" {
			continue
		}
		var sc struct {
			Required   []string `json:"required"`
			Properties map[string]struct {
				Type        any             `json:"type"`
				Default     json.RawMessage `json:"default"`
				Description string          `json:"description"`
			} `json:"properties"`
		}
		b, _ := json.Marshal(tl.InputSchema)
		if err := json.Unmarshal(b, &sc); err != nil {
			t.Fatal(err)
		}
		if strings.Join(sc.Required, ",") != "workspace,task" {
			t.Fatalf("required %v", sc.Required)
		}
		w := sc.Properties["wait"]
		if w.Type != "boolean" || string(w.Default) != "true" || w.Description == "" {
			t.Fatalf("wait: %s", b)
		}
		return
	}
	t.Fatal("no dispatch tool")
}

// The gateway config's mcp section: zero is the default, a bad value names its setting.
func TestSettingsValidate(t *testing.T) {
	if err := (Settings{}).Validate(); err != nil {
		t.Fatalf("zero settings: %v", err)
	}
	for _, tc := range []struct {
		st   Settings
		want string
	}{
		{Settings{MaxBackground: -1}, "mcp.maxBackground"},
		{Settings{MaxBackground: 5000}, "mcp.maxBackground"},
		{Settings{CallTimeout: -1}, "mcp.callTimeout"},
		{Settings{SessionTimeout: 10}, "mcp.sessionTimeout"},
		{Settings{MaxResourceBytes: -5}, "mcp.maxResourceBytes"},
		{Settings{MaxAnswerBytes: 100 << 20}, "mcp.maxAnswerBytes"},
	} {
		if err := tc.st.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want an error naming %s", tc.st, err, tc.want)
		}
	}
}

// A worker's answer of any size reaches the agent cut at the bound, at a rune boundary, saying
// where the rest is.
func TestAnswerIsBounded(t *testing.T) {
	long := strings.Repeat("é", 1000) // 2000 bytes
	got := clip(long, 1025, "ses_1")
	head, tail, ok := strings.Cut(got, "\n[answer cut at 1025 bytes (mcp.maxAnswerBytes): read the resource openclaw://sessions/ses_1/transcript.jsonl for the rest]")
	if !ok || tail != "" || len(head) != 1024 || !utf8.ValidString(head) {
		t.Fatalf("clip: %d bytes head, valid %v, %q", len(head), utf8.ValidString(head), got[len(got)-120:])
	}
	if clip("short", 1024, "ses_1") != "short" {
		t.Fatal("a short answer was changed")
	}
}

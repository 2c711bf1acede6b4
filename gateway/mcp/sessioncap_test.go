package mcp

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/openclaw/cloudworkers/gateway/api"
	"github.com/openclaw/cloudworkers/internal/testrig/testenv"
)

// bearer adds a bearer token to every request of the SDK client.
type bearer struct {
	token string
	next  http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.next.RoundTrip(r)
}

// capRig is an MCP server behind /mcp with session caps, over a fake gateway whose session
// ses_block answers only when released: a status call on it is a call in flight.
type capRig struct {
	t        *testing.T
	s        *Server
	url      string
	operator string
	mcpToken string
	entered  chan struct{} // one value per status call on ses_block that reached the gateway
	release  chan struct{} // closed: the blocked calls answer
	clients  []*mcp.ClientSession
	reg      *prometheus.Registry
}

// metric is the value of the series name (with the label cap, when given) on the rig's registry.
func (r *capRig) metric(name, capKey string) float64 {
	r.t.Helper()
	mfs, err := r.reg.Gather()
	if err != nil {
		r.t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if capKey != "" && (len(m.GetLabel()) != 1 || m.GetLabel()[0].GetValue() != capKey) {
				continue
			}
			if m.GetGauge() != nil {
				return m.GetGauge().GetValue()
			}
			return m.GetCounter().GetValue()
		}
	}
	r.t.Fatalf("no series %s{cap=%q}", name, capKey)
	return 0
}

func newCapRig(t *testing.T, perToken, total int, log *slog.Logger) *capRig {
	t.Helper()
	r := &capRig{t: t, operator: "operator-token-0123456789abcdef0123456789abcdef",
		entered: make(chan struct{}, 16), release: make(chan struct{})}
	fake := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if strings.Contains(req.URL.Path, "ses_block") {
			r.entered <- struct{}{}
			select {
			case <-r.release:
			case <-req.Context().Done():
				return
			}
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		_, _ = w.Write([]byte(`{"error":{"code":"not-found","message":"no such session"}}`))
	}))
	t.Cleanup(fake.Close)
	r.reg = prometheus.NewRegistry()
	s, err := New(Config{Client: api.NewClient(fake.URL, "tok"), MaxSessionsPerToken: perToken, MaxSessions: total, Log: log, Registry: r.reg})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if r.mcpToken, err = EnsureToken(dir, false); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(s.HTTPHandler(r.operator, dir))
	t.Cleanup(srv.Close)
	t.Cleanup(s.Close)
	// first (cleanups run last in, first out): answer the blocked calls, then end the clients
	t.Cleanup(func() {
		select {
		case <-r.release:
		default:
			close(r.release)
		}
		for _, cs := range r.clients {
			_ = cs.Close()
		}
	})
	r.s, r.url = s, srv.URL
	return r
}

// connect opens a session of the SDK's own client with token.
func (r *capRig) connect(token string) (*mcp.ClientSession, error) {
	ctx := testenv.Context(r.t, 30*time.Second)
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "cap-test"}, nil).Connect(ctx, &mcp.StreamableClientTransport{
		Endpoint: r.url, HTTPClient: &http.Client{Transport: bearer{token, http.DefaultTransport}}}, nil)
	if err == nil {
		r.clients = append(r.clients, cs)
	}
	return cs, err
}

// busy starts a status call on ses_block in cs and returns once the gateway holds it; the
// call's result arrives on the returned channel after release.
func (r *capRig) busy(cs *mcp.ClientSession) <-chan error {
	r.t.Helper()
	done := make(chan error, 1)
	go func() {
		_, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "status", Arguments: map[string]any{"sessionId": "ses_block"}})
		done <- err
	}()
	select {
	case <-r.entered:
	case err := <-done:
		r.t.Fatalf("blocking call returned early: %v", err)
	case <-testenv.Context(r.t, 30*time.Second).Done():
		r.t.Fatal("blocking call never reached the gateway")
	}
	return done
}

// sdkSessions counts the initialized sessions the SDK server holds (a request without a session
// id that is not an initialize, such as the client's server/discover, gets a session of its own
// for the length of that request only).
func (r *capRig) sdkSessions() int {
	n := 0
	for ss := range r.s.MCP().Sessions() {
		if ss.InitializeParams() != nil {
			n++
		}
	}
	return n
}

// initialize posts a raw initialize and returns its status and body.
func (r *capRig) initialize(token string) (int, string) {
	r.t.Helper()
	req, _ := http.NewRequestWithContext(testenv.Context(r.t, 10*time.Second), http.MethodPost, r.url,
		strings.NewReader(`{"jsonrpc":"2.0","id":7,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		r.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, string(b)
}

// TestSessionCapEvictsOldestIdle: 200 sessions past a cap of 64 all open, each evicting the
// session idle the longest (of its token under the per-token cap, of any token under the
// gateway-wide one); the sessions held never exceed the cap; a session in the middle of a call is
// never evicted and its call completes; an evicted session's next call gets an error saying why
// it was closed, naming the cap.
func TestSessionCapEvictsOldestIdle(t *testing.T) {
	for _, tc := range []struct {
		name            string
		perToken, total int
		alternate       bool // sessions alternate between the MCP and the operator token
		key, cap        string
	}{
		{"per token", 64, 256, false, "mcp.maxSessionsPerToken", "mcp.maxSessionsPerToken = 64"},
		{"gateway-wide", 64, 64, true, "mcp.maxSessions", "mcp.maxSessions = 64"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newCapRig(t, tc.perToken, tc.total, nil)
			held, err := r.connect(r.mcpToken)
			if err != nil {
				t.Fatal(err)
			}
			done := r.busy(held)
			var all []*mcp.ClientSession
			for i := range 200 {
				tok := r.mcpToken
				if tc.alternate && i%2 == 1 {
					tok = r.operator
				}
				cs, err := r.connect(tok)
				if err != nil {
					t.Fatalf("session %d: %v", i, err)
				}
				all = append(all, cs)
				// The client may still be sending its initialized notification: a session with a
				// POST in flight is never evicted, so the next one waits until only the held call
				// is in flight (else which session goes first depends on that timing).
				testenv.Eventually(t, "the new session to be idle", func() bool { return r.s.caps.inFlight() <= 1 })
				if n, m := r.s.caps.tracked(), r.sdkSessions(); n > 64 || m > 64 {
					t.Fatalf("after session %d: %d tracked, %d held by the SDK, cap 64", i, n, m)
				}
			}
			ctx := testenv.Context(t, 30*time.Second)
			// The newest 63 live (with the busy one: 64); the older ones were evicted, oldest first.
			for i, cs := range all {
				_, err := cs.ListTools(ctx, nil)
				switch {
				case i >= 200-63 && err != nil:
					t.Fatalf("recent session %d: %v", i, err)
				case i < 200-63 && (err == nil || !strings.Contains(err.Error(), "closed to make room") || !strings.Contains(err.Error(), tc.cap)):
					t.Fatalf("evicted session %d: %v, want an error naming %s", i, err, tc.cap)
				}
			}
			close(r.release)
			if err := <-done; err != nil {
				t.Fatalf("the busy session's call: %v", err)
			}
			if _, err := held.ListTools(ctx, nil); err != nil {
				t.Fatalf("the busy session was evicted: %v", err)
			}
			if n := r.metric("openclaw_mcp_sessions_evicted_total", tc.key); n != 200-63 {
				t.Fatalf("%v evictions counted, want %d", n, 200-63)
			}
			if n := r.metric("openclaw_mcp_sessions", ""); n != 64 {
				t.Fatalf("openclaw_mcp_sessions %v, want 64", n)
			}
		})
	}
}

// TestSessionCapRefusesWhenAllBusy: when every session under a full cap is in a call, a new
// session is refused with 429 and a JSON-RPC error naming the cap and its config key, per token
// and gateway-wide; the refusals are logged once, not once each.
func TestSessionCapRefusesWhenAllBusy(t *testing.T) {
	var logs bytes.Buffer
	r := newCapRig(t, 2, 3, slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo})))
	clock := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	r.s.caps.mu.Lock()
	r.s.caps.now = func() time.Time { return clock }
	r.s.caps.mu.Unlock()
	for _, tok := range []string{r.mcpToken, r.mcpToken, r.operator} {
		cs, err := r.connect(tok)
		if err != nil {
			t.Fatal(err)
		}
		r.busy(cs)
	}
	for _, c := range []struct {
		name, token, key string
	}{
		{"per token", r.mcpToken, "mcp.maxSessionsPerToken = 2"},
		{"gateway-wide", r.operator, "mcp.maxSessions = 3"},
	} {
		t.Run(c.name, func(t *testing.T) {
			for range 50 {
				status, body := r.initialize(c.token)
				var msg struct {
					ID    int `json:"id"`
					Error struct {
						Message string `json:"message"`
					} `json:"error"`
				}
				if err := json.Unmarshal([]byte(body), &msg); err != nil || status != http.StatusTooManyRequests ||
					msg.ID != 7 || !strings.Contains(msg.Error.Message, c.key) || !strings.Contains(msg.Error.Message, "in the middle of a call") {
					t.Fatalf("initialize past the cap: %d %s", status, body)
				}
			}
			if _, err := r.connect(c.token); err == nil {
				t.Fatal("the SDK client connected past the cap")
			}
			if n := r.sdkSessions(); n != 3 {
				t.Fatalf("%d sessions held, want the 3 busy ones", n)
			}
		})
	}
	if n := strings.Count(logs.String(), "MCP sessions refused"); n != 1 {
		t.Fatalf("%d refusal lines for 102 refusals, want 1:\n%s", n, logs.String())
	}
	// a minute later the next refusal writes the next line, with the count since the last
	r.s.caps.mu.Lock()
	clock = clock.Add(time.Minute)
	r.s.caps.mu.Unlock()
	if status, _ := r.initialize(r.mcpToken); status != http.StatusTooManyRequests {
		t.Fatalf("status %d", status)
	}
	if n := strings.Count(logs.String(), "MCP sessions refused"); n != 2 || !strings.Contains(logs.String(), "refused=102") {
		t.Fatalf("%d refusal lines after a minute, want 2, the second counting 102:\n%s", n, logs.String())
	}
	if a, b := r.metric("openclaw_mcp_sessions_refused_total", "mcp.maxSessionsPerToken"), r.metric("openclaw_mcp_sessions_refused_total", "mcp.maxSessions"); a+b != 103 || a < 52 || b < 51 {
		t.Fatalf("refusals counted %v per token, %v gateway-wide; want 103 in all", a, b)
	}
	// The SDK's per-session INFO lines (connected, initialized) are not at INFO.
	if strings.Contains(logs.String(), "session connected") || strings.Contains(logs.String(), "session initialized") {
		t.Fatalf("per-session INFO lines:\n%s", logs.String())
	}
}

// The caps' settings: zero is the default (64 per token, 256 in all), a bad value names its key.
func TestSessionCapSettings(t *testing.T) {
	c := Settings{}.Config(api.NewClient("127.0.0.1:1", "t"))
	c.setDefaults()
	if c.MaxSessionsPerToken != DefaultMaxSessionsPerToken || c.MaxSessions != DefaultMaxSessions {
		t.Fatalf("defaults: %d per token, %d in all", c.MaxSessionsPerToken, c.MaxSessions)
	}
	for _, tc := range []struct {
		st   Settings
		want string
	}{
		{Settings{MaxSessionsPerToken: -1}, "mcp.maxSessionsPerToken"},
		{Settings{MaxSessionsPerToken: 5000}, "mcp.maxSessionsPerToken"},
		{Settings{MaxSessions: -1}, "mcp.maxSessions"},
		{Settings{MaxSessionsPerToken: 100, MaxSessions: 50}, "mcp.maxSessions"},
		{Settings{MaxSessions: 100000}, "mcp.maxSessions"},
	} {
		if err := tc.st.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want an error naming %s", tc.st, err, tc.want)
		}
	}
	if err := (Settings{MaxSessionsPerToken: 500}).Validate(); err != nil {
		t.Errorf("a per-token cap above the default total raises the total's default: %v", err)
	}
}

// inFlight counts the POSTs in flight over every tracked session.
func (c *sessionCaps) inFlight() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, s := range c.live {
		n += s.busy
	}
	return n
}

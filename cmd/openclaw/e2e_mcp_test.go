package main_test

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/openclaw/cloudworkers/gateway/mcp"
	"github.com/openclaw/cloudworkers/internal/testrig/testenv"
)

// mcpScript is one worker turn: edit a tracked file, commit it, answer.
const mcpScript = `[
  {"text": "Editing.", "toolCalls": [{"name": "edit", "arguments": {"path": "README.md", "edits": [{"oldText": "hello", "newText": "hello from the worker"}]}}]},
  {"toolCalls": [{"name": "exec", "arguments": {"command": "git add README.md && git -c user.name=w -c user.email=w@example.com commit -qm 'worker edit'"}}]},
  {"text": "Committed the edit on the worker."}
]`

// mcpGateway starts a gateway whose scripted model runs mcpScript, with a git workspace.
func mcpGateway(t *testing.T) (*gw, string) {
	t.Helper()
	root := t.TempDir()
	cfg := fastWorkerConfig + scriptedModels(t, root, map[string]string{"mcp": mcpScript})
	g := startGateway(t, filepath.Join(root, "data"), cfg)
	ws := filepath.Join(root, "repo")
	userWorkspace(t, ws, true)
	return g, ws
}

// progressLog collects the progress notifications a client receives.
type progressLog struct {
	mu   sync.Mutex
	msgs []string
	more chan struct{} // closed and replaced at each message
}

func newProgressLog() *progressLog { return &progressLog{more: make(chan struct{})} }

func (p *progressLog) handle(_ context.Context, req *sdk.ProgressNotificationClientRequest) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.msgs = append(p.msgs, req.Params.Message)
	close(p.more)
	p.more = make(chan struct{})
}

// waitFor waits until a message containing each of subs has arrived.
func (p *progressLog) waitFor(ctx context.Context, t *testing.T, subs ...string) {
	t.Helper()
	for {
		p.mu.Lock()
		missing := ""
		for _, s := range subs {
			if !slices.ContainsFunc(p.msgs, func(m string) bool { return strings.Contains(m, s) }) {
				missing = s
				break
			}
		}
		more, msgs := p.more, append([]string(nil), p.msgs...)
		p.mu.Unlock()
		if missing == "" {
			return
		}
		select {
		case <-more:
		case <-ctx.Done():
			t.Fatalf("no progress notification containing %q; got:\n  %s", missing, strings.Join(msgs, "\n  "))
		}
	}
}

func mcpClient(p *progressLog) *sdk.Client {
	return sdk.NewClient(&sdk.Implementation{Name: "openclaw-e2e", Version: "test"}, &sdk.ClientOptions{ProgressNotificationHandler: p.handle})
}

// checkMCP drives one MCP session against g: list the tools, refuse a bad workspace, dispatch a
// task on a git workspace with progress, and read the transcript and diff resources.
func checkMCP(t *testing.T, ctx context.Context, cs *sdk.ClientSession, p *progressLog, ws string) {
	t.Helper()
	tools, err := cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tl := range tools.Tools {
		names = append(names, tl.Name)
		if tl.Description == "" {
			t.Errorf("tool %s has no description", tl.Name)
		}
		if tl.Name == "dispatch" {
			schema, _ := json.Marshal(tl.InputSchema)
			for _, want := range []string{`"workspace"`, `"task"`, `"profile"`, `"machineClass"`, `"model"`, `"wait"`, `"required":["workspace","task"]`} {
				if !strings.Contains(string(schema), want) {
					t.Errorf("dispatch input schema lacks %s: %s", want, schema)
				}
			}
		}
	}
	slices.Sort(names)
	want := []string{"destroy_environment", "dispatch", "list_environments", "list_sessions", "pullback", "send", "status"}
	if !slices.Equal(names, want) {
		t.Fatalf("tools %v, want %v", names, want)
	}

	// A workspace that does not exist: a tool error naming it, and the server lives on.
	bad := filepath.Join(filepath.Dir(ws), "no-such-repo")
	res, err := cs.CallTool(ctx, &sdk.CallToolParams{Name: "dispatch", Arguments: map[string]any{"workspace": bad, "task": "x", "profile": "local"}})
	if err != nil {
		t.Fatalf("dispatch with a bad workspace: protocol error %v, want a tool error", err)
	}
	if !res.IsError || !strings.Contains(toolText(res), bad) || !strings.Contains(toolText(res), "invalid-field") {
		t.Fatalf("dispatch with a bad workspace: isError %v, %q; want a tool error naming %s and the gateway's code", res.IsError, toolText(res), bad)
	}
	// A relative workspace is refused before the gateway is asked.
	res, err = cs.CallTool(ctx, &sdk.CallToolParams{Name: "dispatch", Arguments: map[string]any{"workspace": "repo", "task": "x", "profile": "local"}})
	if err != nil || !res.IsError || !strings.Contains(toolText(res), `"repo" must be an absolute path`) {
		t.Fatalf("dispatch with a relative workspace: %v %+v", err, res)
	}

	params := &sdk.CallToolParams{Name: "dispatch", Arguments: map[string]any{"workspace": ws, "task": "make the greeting come from the worker", "profile": "local"}}
	params.SetProgressToken("dispatch-1")
	res, err = cs.CallTool(ctx, params)
	if err != nil {
		t.Fatalf("dispatch: %v", err)
	}
	if res.IsError {
		t.Fatalf("dispatch: tool error %s", toolText(res))
	}
	var out mcp.DispatchResult
	b, _ := json.Marshal(res.StructuredContent)
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatalf("dispatch result %s: %v", b, err)
	}
	if out.Answer != "Committed the edit on the worker." || out.TurnStatus != "done" || out.State != "local" || out.EnvironmentID == "" {
		t.Fatalf("dispatch result: %s", b)
	}
	if !strings.HasPrefix(out.Branch, "openclaw/") || len(out.Commits) != 1 || out.Commits[0].Subject != "worker edit" ||
		!slices.Contains(out.Files, mcp.ChangedFile{Status: "M", Path: "README.md"}) {
		t.Fatalf("dispatch result lacks the worker's branch, commit and file: %s", b)
	}
	// The user's repository holds the branch with the worker's commit; its checkout is untouched.
	if got := testenv.Git(t, ws, "log", "-1", "--format=%s", out.Branch); got != "worker edit" {
		t.Fatalf("branch %s in the user's repository: last commit %q", out.Branch, got)
	}
	if got, _ := os.ReadFile(filepath.Join(ws, "README.md")); string(got) != "hello\n" {
		t.Fatalf("the user's checkout was written: README.md %q", got)
	}
	p.waitFor(ctx, t, "placement requested → provisioning", "→ active", "tool edit", "tool exec", "turn done", "→ local")

	diff, err := cs.ReadResource(ctx, &sdk.ReadResourceParams{URI: "openclaw://sessions/" + out.SessionID + "/diff"})
	if err != nil {
		t.Fatalf("read the diff: %v", err)
	}
	if len(diff.Contents) != 1 || !strings.Contains(diff.Contents[0].Text, "+hello from the worker") || !strings.Contains(diff.Contents[0].Text, "-hello") {
		t.Fatalf("diff resource: %+v", diff.Contents)
	}
	tr, err := cs.ReadResource(ctx, &sdk.ReadResourceParams{URI: "openclaw://sessions/" + out.SessionID + "/transcript.jsonl"})
	if err != nil {
		t.Fatalf("read the transcript: %v", err)
	}
	lines := strings.Split(strings.TrimSpace(tr.Contents[0].Text), "\n")
	if len(lines) < 4 { // the task, two tool calls with their results, the answer
		t.Fatalf("transcript has %d lines:\n%s", len(lines), tr.Contents[0].Text)
	}
	for i, l := range lines {
		var e struct{ ID, Type string }
		if err := json.Unmarshal([]byte(l), &e); err != nil || e.ID == "" || e.Type == "" || (i == 0) != (e.Type == "session") {
			t.Fatalf("transcript line %d %q: %v (want the session header first, then entries)", i, l, err)
		}
	}
	// status agrees, and an unknown session is a tool error naming it.
	res, err = cs.CallTool(ctx, &sdk.CallToolParams{Name: "status", Arguments: map[string]any{"sessionId": out.SessionID}})
	if err != nil || res.IsError || !strings.Contains(toolText(res), "Committed the edit on the worker.") {
		t.Fatalf("status: %v %s", err, toolText(res))
	}
	res, err = cs.CallTool(ctx, &sdk.CallToolParams{Name: "status", Arguments: map[string]any{"sessionId": "ses_nope"}})
	if err != nil || !res.IsError || !strings.Contains(toolText(res), "ses_nope") || !strings.Contains(toolText(res), "not-found") {
		t.Fatalf("status of an unknown session: %v %s", err, toolText(res))
	}
}

func toolText(res *sdk.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*sdk.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

// `openclaw mcp` over stdio, driven by the SDK's own client: initialize, list the tools, dispatch
// a task to a local-box worker with progress, and a tool error for a bad workspace.
func TestMCPStdioDispatch(t *testing.T) {
	g, ws := mcpGateway(t)
	ctx := testenv.Context(t, 3*time.Minute)
	p := newProgressLog()
	cmd := exec.Command(openclawBin, "mcp", "--gateway", g.addr, "--data-dir", g.dataDir)
	cmd.Stderr = &testenv.Buffer{}
	cs, err := mcpClient(p).Connect(ctx, &sdk.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatalf("connect to openclaw mcp: %v", err)
	}
	t.Cleanup(func() {
		_ = cs.Close()
		if t.Failed() {
			t.Logf("openclaw mcp stderr:\n%s", cmd.Stderr)
		}
	})
	if got := cs.InitializeResult().ServerInfo.Name; got != "openclaw" {
		t.Fatalf("server name %q", got)
	}
	checkMCP(t, ctx, cs, p, ws)
}

// bearer adds a bearer token to each request.
type bearer struct {
	token string
	next  http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.next.RoundTrip(r)
}

// The gateway's /mcp over streamable HTTP with the narrower MCP token: the same tools; the token
// opens /mcp and not /api/v1; no token or a wrong one is refused.
func TestMCPHTTPDispatch(t *testing.T) {
	g, ws := mcpGateway(t)
	ctx := testenv.Context(t, 3*time.Minute)
	out, err := exec.Command(openclawBin, "mcp", "token", "--data-dir", g.dataDir).Output()
	if err != nil {
		t.Fatalf("openclaw mcp token: %v", err)
	}
	tok := strings.TrimSpace(string(out))
	if fi, err := os.Stat(filepath.Join(g.dataDir, mcp.TokenFile)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("MCP token file: %v %v, want mode 0600", fi.Mode(), err)
	}
	endpoint := "http://" + g.addr + "/mcp"
	for _, tc := range []struct{ name, token string }{{"no token", ""}, {"wrong token", strings.Repeat("x", 64)}} {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, endpoint, strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}`))
		req.Header.Set("Content-Type", "application/json")
		if tc.token != "" {
			req.Header.Set("Authorization", "Bearer "+tc.token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("%s: /mcp answered %d, want 401", tc.name, resp.StatusCode)
		}
	}
	// A page reaching the gateway by another name (DNS rebinding) is refused before the token is read.
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, endpoint, strings.NewReader(`{}`))
	req.Host = "rebind.example"
	req.Header.Set("Authorization", "Bearer "+tok)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMisdirectedRequest {
		t.Fatalf("/mcp with Host rebind.example: %d, want 421", resp.StatusCode)
	}
	// The MCP token does not open the operator's API.
	req, _ = http.NewRequestWithContext(ctx, http.MethodGet, "http://"+g.addr+"/api/v1/credentials", nil)
	req.Header.Set("Authorization", "Bearer "+tok)
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("the MCP token on /api/v1/credentials: %d, want 401", resp.StatusCode)
	}

	p := newProgressLog()
	hc := &http.Client{Transport: bearer{token: tok, next: http.DefaultTransport}}
	cs, err := mcpClient(p).Connect(ctx, &sdk.StreamableClientTransport{Endpoint: endpoint, HTTPClient: hc, MaxRetries: -1}, nil)
	if err != nil {
		t.Fatalf("connect to /mcp: %v", err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	checkMCP(t, ctx, cs, p, ws)

	// A rotated token stops the old one at once.
	if err := exec.Command(openclawBin, "mcp", "token", "--rotate", "--data-dir", g.dataDir).Run(); err != nil {
		t.Fatal(err)
	}
	old := mcpClient(newProgressLog())
	if cs2, err := old.Connect(ctx, &sdk.StreamableClientTransport{Endpoint: endpoint, HTTPClient: hc, MaxRetries: -1}, nil); err == nil {
		_ = cs2.Close()
		t.Fatal("the rotated-out MCP token still opens /mcp")
	}
	// A client still connected (its standalone SSE stream open) does not hold up the gateway's stop.
	g.stop()
}

// dispatch with wait: false returns the session id at once; status follows it to the end of its
// turn on the worker, and pullback brings the commit home.
func TestMCPDispatchNoWaitThenPullback(t *testing.T) {
	g, ws := mcpGateway(t)
	ctx := testenv.Context(t, 3*time.Minute)
	cmd := exec.Command(openclawBin, "mcp", "--gateway", g.addr, "--data-dir", g.dataDir, "--profile", "local")
	cs, err := mcpClient(newProgressLog()).Connect(ctx, &sdk.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	call := func(tool string, args map[string]any) mcp.DispatchResult {
		t.Helper()
		res, err := cs.CallTool(ctx, &sdk.CallToolParams{Name: tool, Arguments: args})
		if err != nil || res.IsError {
			t.Fatalf("%s: %v %s", tool, err, toolText(res))
		}
		var out mcp.DispatchResult
		b, _ := json.Marshal(res.StructuredContent)
		if err := json.Unmarshal(b, &out); err != nil {
			t.Fatal(err)
		}
		return out
	}
	// no profile: the server's --profile
	d := call("dispatch", map[string]any{"workspace": ws, "task": "edit the greeting", "wait": false})
	if d.SessionID == "" || d.State != "dispatching" || d.Answer != "" {
		t.Fatalf("dispatch without wait: %+v", d)
	}
	var st mcp.DispatchResult
	for st = call("status", map[string]any{"sessionId": d.SessionID}); st.TurnStatus != "done"; st = call("status", map[string]any{"sessionId": d.SessionID}) {
		if st.TurnStatus == "failed" || st.State == "failed" {
			t.Fatalf("status: %+v", st)
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the dispatched turn did not end: %+v", st)
		case <-time.After(100 * time.Millisecond): // polling the tool, as an agent would
		}
	}
	if st.State != "active" || st.Answer != "Committed the edit on the worker." || st.EnvironmentID == "" {
		t.Fatalf("status after the turn: %+v", st)
	}
	// a running turn's policy: an unknown one is refused before anything moves
	if res, err := cs.CallTool(ctx, &sdk.CallToolParams{Name: "pullback", Arguments: map[string]any{"sessionId": d.SessionID, "busy": "later"}}); err != nil ||
		!res.IsError || !strings.Contains(toolText(res), "busy") {
		t.Fatalf("pullback with busy \"later\": %v %s, want a tool error naming busy", err, toolText(res))
	}
	p := call("pullback", map[string]any{"sessionId": d.SessionID, "busy": "cancel"})
	if p.State != "local" || len(p.Commits) != 1 || p.Commits[0].Subject != "worker edit" || !strings.HasPrefix(p.Branch, "openclaw/") {
		t.Fatalf("pullback: %+v", p)
	}
}

// A bad mcp section stops the gateway at start, naming the setting.
func TestGatewayRefusesBadMCPSettings(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(cfg, []byte("mcp: {maxBackground: -1}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(openclawBin, "gateway", "--data-dir", filepath.Join(dir, "data"), "--listen", freeAddr(t), "--config", cfg).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "mcp.maxBackground") {
		t.Fatalf("gateway with mcp.maxBackground -1: %v\n%s", err, out)
	}
}

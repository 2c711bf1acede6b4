package main_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/openclaw/cloudworkers/gateway/placement"
	"github.com/openclaw/cloudworkers/gateway/turns"
)

// scrape reads the gateway's /metrics into series → value ("name{labels}" as Prometheus writes it).
func (g *gw) scrape() map[string]float64 {
	g.t.Helper()
	req, _ := http.NewRequestWithContext(g.ctx(), "GET", "http://"+g.addr+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+g.client.Token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		g.t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		g.t.Fatalf("GET /metrics: %d %s", resp.StatusCode, b)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			g.t.Fatalf("metrics line %q: %v", line, err)
		}
		out[line[:i]] = v
	}
	return out
}

// The metrics an operator watches move when a session is dispatched to a local box, runs a turn
// there and on the gateway, comes back, and when a model's provider refuses a call; the same run's
// JSON log has each key once per line, failures at WARN or ERROR, an access line per request,
// failed authentications at WARN (aggregated per source and minute) without the token, and no lost
// worker for a connection that ended normally.
func TestMetricsAndLogsOfASessionTurn(t *testing.T) {
	root := t.TempDir()
	// a provider that refuses every call: 429
	refusing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusTooManyRequests)
		_, _ = io.WriteString(w, `{"error":{"message":"slow down","type":"rate_limit_error"}}`)
	}))
	t.Cleanup(refusing.Close)
	script := filepath.Join(root, "script.json")
	if err := os.WriteFile(script, []byte(`[
  {"toolCalls": [{"name": "write", "arguments": {"path": "out.txt", "content": "from the worker\n"}}]},
  {"text": "Worker turn done."},
  {"text": "Local turn done."}
]`), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := fastWorkerConfig + "logFormat: json\n" + fmt.Sprintf(`models:
  default: demo/m
  providers:
    demo: {api: scripted, script: %s, models: [{id: m, cost: {input: 1000000, output: 2000000}}]}
    refusing: {api: openai-completions, baseUrl: %s, maxRetries: 0, models: [{id: x}]}
`, script, refusing.URL)
	g := startGateway(t, filepath.Join(root, "data"), cfg)
	before := g.scrape()

	ws := filepath.Join(root, "ws")
	userWorkspace(t, ws, false)
	id, envID := g.activeSession(ws, "", "local")
	e, err := g.client.Environment(g.ctx(), envID)
	if err != nil {
		t.Fatal(err)
	}
	pid := workerPID(t, e.Environment)
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
	active := g.scrape()
	g.runTurn(id, "write it", "worker")
	g.pullback(id)
	g.mustRest(id, placement.Local)
	g.runTurn(id, "and here", "local")
	if _, err := g.client.ProbeModel(g.ctx(), "refusing/x"); err != nil {
		t.Fatalf("probe: %v", err) // a probe reports a refusal in its body
	}
	// a turn whose provider refuses it fails
	failing := g.newSession(ws, "refusing/x")
	ft, code, err := g.send(failing, "hello")
	if err != nil {
		t.Fatalf("send: %d %v", code, err)
	}
	if ft = waitTurn(t, g, ft.RunID); ft.Status != turns.TurnFailed {
		t.Fatalf("turn on the refusing provider: %s (%s), want failed", ft.Status, ft.Error)
	}
	// two refused authentications: a wrong token, and none
	const presented = "not-the-token-5f3a9c"
	for _, auth := range []string{"Bearer " + presented, ""} {
		req, _ := http.NewRequestWithContext(g.ctx(), "GET", "http://"+g.addr+"/api/v1/sessions", nil)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("GET /api/v1/sessions with %q: %d, want 401", auth, resp.StatusCode)
		}
	}
	after := g.scrape()

	moved := func(series string, from, to map[string]float64, min float64) {
		t.Helper()
		if d := to[series] - from[series]; d < min {
			t.Errorf("%s moved by %v, want at least %v (before %v, after %v)", series, d, min, from[series], to[series])
		}
	}
	moved(`openclaw_sessions{placement="active"}`, before, active, 1)
	moved(`openclaw_sessions{placement="local"}`, active, after, 1)
	moved(`openclaw_turns_started_total{placement="worker"}`, before, after, 1)
	moved(`openclaw_turns_started_total{placement="local"}`, before, after, 1)
	moved(`openclaw_turns_finished_total{placement="worker",status="done"}`, before, after, 1)
	moved(`openclaw_turns_finished_total{placement="local",status="done"}`, before, after, 1)
	moved(`openclaw_turns_finished_total{placement="local",status="failed"}`, before, after, 1)
	moved(`openclaw_http_requests_total{method="GET",route="/api/v1/sessions",status="401"}`, before, after, 2)
	moved(`openclaw_inference_calls_total{model="demo/m",result="ok"}`, before, after, 3)
	moved(`openclaw_inference_tokens_total{direction="in",model="demo/m"}`, before, after, 1)
	moved(`openclaw_inference_tokens_total{direction="out",model="demo/m"}`, before, after, 1)
	moved(`openclaw_inference_cost_total{model="demo/m"}`, before, after, 1)
	moved(`openclaw_inference_calls_total{model="refusing/x",result="error"}`, before, after, 2)
	moved(`openclaw_provider_errors_total{code="429",model="refusing/x"}`, before, after, 2)
	moved(`openclaw_sync_bytes_total{direction="out"}`, before, after, float64(len("hello\n")))
	moved(`openclaw_sync_bytes_total{direction="in"}`, before, after, float64(len("from the worker\n")))
	// the wire carries at least the archive's frames and the manifests; both directions move
	moved(`openclaw_sync_wire_bytes_total{direction="out"}`, before, after, 1)
	moved(`openclaw_sync_wire_bytes_total{direction="in"}`, before, after, 1)
	moved(`openclaw_sync_duration_seconds_count{direction="out",result="ok"}`, before, after, 1)
	moved(`openclaw_sync_duration_seconds_count{direction="in",result="ok"}`, before, after, 1)
	moved(`openclaw_environment_provision_seconds_count{provider="local",result="ready"}`, before, after, 1)
	moved(`openclaw_http_requests_total{method="POST",route="/api/v1/sessions/:id/messages",status="202"}`, before, after, 2)
	moved(`openclaw_http_requests_total{method="GET",route="/metrics",status="200"}`, before, after, 1)
	if _, ok := after[`openclaw_tunnel_reconnects_total`]; !ok {
		t.Errorf("no openclaw_tunnel_reconnects_total series")
	}
	for s := range after {
		if strings.Contains(s, "route=\"/api/v1/sessions/ses_") {
			t.Errorf("a request was counted by its raw path, not its route: %s", s)
		}
	}

	g.stop() // the log is complete (and no longer written) once the gateway has exited
	checkLog(t, g.log.Bytes(), presented)
}

// logLine is one line of the gateway's JSON log.
type logLine map[string]any

func (l logLine) str(k string) string { s, _ := l[k].(string); return s }

// checkLog checks the JSON log of TestMetricsAndLogsOfASessionTurn's run.
func checkLog(t *testing.T, log []byte, presented string) {
	t.Helper()
	if strings.Contains(string(log), presented) {
		t.Errorf("the log holds the token a client presented (%s)", presented)
	}
	var lines []logLine
	for n, raw := range strings.Split(strings.TrimSpace(string(log)), "\n") {
		if dup := duplicateKey(raw); dup != "" {
			t.Errorf("log line %d has the key %q twice: %.300s", n+1, dup, raw)
		}
		var l logLine
		if err := json.Unmarshal([]byte(raw), &l); err != nil {
			t.Errorf("log line %d is not JSON: %v: %.300s", n+1, err, raw)
			continue
		}
		lines = append(lines, l)
	}
	count := func(f func(logLine) bool) int {
		n := 0
		for _, l := range lines {
			if f(l) {
				n++
			}
		}
		return n
	}
	for _, l := range lines {
		if l.str("level") == "INFO" && l.str("err") != "" {
			t.Errorf("a failure logged at INFO: %v", l)
		}
		if l.str("level") == "ERROR" {
			t.Errorf("an ERROR in a run without faults: %v", l)
		}
	}
	if n := count(func(l logLine) bool {
		return l.str("level") == "DEBUG" && l.str("msg") == "http" && l.str("method") == "POST" && l.str("route") == "/api/v1/sessions/:id/messages" && l["status"] != nil
	}); n != 3 {
		t.Errorf("%d access log lines of POST /api/v1/sessions/:id/messages, want 3 (one per message sent)", n)
	}
	// the two refusals come from one source within a minute: the first is logged with why, the
	// second counted and summarised when the window closes (here: at the gateway's stop)
	if n := count(func(l logLine) bool {
		return l.str("level") == "WARN" && l.str("msg") == "authentication failed" && l.str("path") == "/api/v1/sessions" && l.str("remote") != ""
	}); n != 1 {
		t.Errorf("%d WARN lines of failed authentication, want 1 (the first of the minute)", n)
	}
	if n := count(func(l logLine) bool {
		return l.str("level") == "WARN" && l.str("msg") == "authentication failed repeatedly" && l["refused"] == float64(2) && l.str("source") == "127.0.0.1"
	}); n != 1 {
		t.Errorf("%d WARN summaries of repeated failed authentication with refused=2, want 1", n)
	}
	if n := count(func(l logLine) bool { return l.str("level") == "WARN" && l.str("msg") == "turn failed" }); n != 1 {
		t.Errorf("%d WARN lines of a failed turn, want 1", n)
	}
	if n := count(func(l logLine) bool { return l.str("msg") == "worker disconnected" }); n == 0 {
		t.Errorf("no line of the worker's turn connection ending")
	}
	if n := count(func(l logLine) bool { return l.str("msg") == "worker connection lost" }); n != 0 {
		t.Errorf("a worker connection that ended normally logged as lost (%d lines)", n)
	}
}

// duplicateKey returns a key that one JSON object line (and its nested objects) holds twice.
func duplicateKey(line string) string {
	dec := json.NewDecoder(strings.NewReader(line))
	type frame struct {
		obj  bool
		keys map[string]bool
		key  bool // the next string token is a key
	}
	var stack []*frame
	for {
		tok, err := dec.Token()
		if err != nil {
			return ""
		}
		var top *frame
		if len(stack) > 0 {
			top = stack[len(stack)-1]
		}
		switch v := tok.(type) {
		case json.Delim:
			switch v {
			case '{':
				if top != nil && top.obj {
					top.key = true
				}
				stack = append(stack, &frame{obj: true, keys: map[string]bool{}, key: true})
			case '[':
				if top != nil && top.obj {
					top.key = true
				}
				stack = append(stack, &frame{})
			default:
				stack = stack[:len(stack)-1]
			}
		default:
			if top == nil || !top.obj {
				continue
			}
			if top.key {
				k, _ := v.(string)
				if top.keys[k] {
					return k
				}
				top.keys[k] = true
				top.key = false
			} else {
				top.key = true
			}
		}
	}
}

package main_test

import (
	"bufio"
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
// there and on the gateway, comes back, and when a model's provider refuses a call.
func TestMetricsMoveWithASessionTurn(t *testing.T) {
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
	cfg := fastWorkerConfig + fmt.Sprintf(`models:
  default: demo/m
  providers:
    demo: {api: scripted, script: %s, models: [{id: m, cost: {input: 1000000, output: 2000000}}]}
    refusing: {api: openai-completions, baseUrl: %s, maxRetries: 0, models: [{id: x}]}
`, script, refusing.URL)
	g := startGateway(t, filepath.Join(root, "data"), cfg)
	before := g.scrape()

	ws := filepath.Join(root, "ws")
	userWorkspace(t, ws, false)
	id := g.newSession(ws, "")
	g.dispatchTo(id, "local")
	v := g.mustRest(id, placement.Active)
	e, err := g.client.Environment(g.ctx(), v.Placement.EnvironmentID)
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
	moved(`openclaw_inference_calls_total{model="demo/m",result="ok"}`, before, after, 3)
	moved(`openclaw_inference_tokens_total{direction="in",model="demo/m"}`, before, after, 1)
	moved(`openclaw_inference_tokens_total{direction="out",model="demo/m"}`, before, after, 1)
	moved(`openclaw_inference_cost_total{model="demo/m"}`, before, after, 1)
	moved(`openclaw_inference_calls_total{model="refusing/x",result="error"}`, before, after, 1)
	moved(`openclaw_provider_errors_total{code="429",model="refusing/x"}`, before, after, 1)
	moved(`openclaw_sync_bytes_total{direction="out"}`, before, after, float64(len("hello\n")))
	moved(`openclaw_sync_bytes_total{direction="in"}`, before, after, float64(len("from the worker\n")))
	moved(`openclaw_sync_duration_seconds_count{direction="out",result="ok"}`, before, after, 1)
	moved(`openclaw_sync_duration_seconds_count{direction="in",result="ok"}`, before, after, 1)
	moved(`openclaw_environment_provision_seconds_count{provider="local"}`, before, after, 1)
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
}

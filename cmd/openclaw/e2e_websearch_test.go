package main_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/openclaw/cloudworkers/gateway/envs"
	"github.com/openclaw/cloudworkers/gateway/sessions"
	"github.com/openclaw/cloudworkers/gateway/turns"
)

// TestWebSearchRunsOnTheGateway: web_search is offered to turns in both placements; on a worker
// it runs on the gateway (worker.tool.call) with the gateway's credential, which never reaches the box.
func TestWebSearchRunsOnTheGateway(t *testing.T) {
	const secret = "brave-secret-3f9a1c"
	var hits atomic.Int32
	brave := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Subscription-Token") != secret || r.URL.Path != "/res/v1/web/search" {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		hits.Add(1)
		_ = json.NewEncoder(w).Encode(map[string]any{"web": map[string]any{"results": []map[string]string{
			{"title": "OpenClaw gateway", "url": "https://example.invalid/openclaw", "description": "result for " + r.URL.Query().Get("q")},
		}}})
	}))
	t.Cleanup(brave.Close)
	root := t.TempDir()
	script := filepath.Join(root, "script.json")
	if err := os.WriteFile(script, []byte(`[{"toolCalls":[{"name":"web_search","arguments":{"query":"cloud workers"}}]},{"text":"found it"}]`), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := fastWorkerConfig + fmt.Sprintf(`webSearch: {provider: brave, baseUrl: %s, credential: brave, maxResults: 3}
models:
  default: demo/demo
  providers:
    demo: {api: scripted, script: %s, models: [{id: demo}]}
`, brave.URL, script)
	g := startGateway(t, filepath.Join(root, "data"), cfg)
	set := exec.Command(openclawBin, "credential", "set", "brave", "--gateway", g.addr, "--data-dir", g.dataDir)
	set.Stdin = strings.NewReader(secret)
	if out, err := set.CombinedOutput(); err != nil {
		t.Fatalf("credential set: %v %s", err, out)
	}
	for _, worker := range []bool{false, true} {
		ws := filepath.Join(root, fmt.Sprintf("ws-%v", worker))
		if err := os.MkdirAll(ws, 0o755); err != nil {
			t.Fatal(err)
		}
		s, err := g.client.CreateSession(g.ctx(), sessions.CreateRequest{CreateParams: sessions.CreateParams{Workspace: ws}})
		if err != nil {
			t.Fatal(err)
		}
		if worker {
			if out, err := exec.Command(openclawBin, "session", "dispatch", s.ID, "--profile", "local", "--gateway", g.addr, "--data-dir", g.dataDir).CombinedOutput(); err != nil {
				t.Fatalf("dispatch: %v %s", err, out)
			}
		}
		turn, err := g.client.SendMessage(g.ctx(), s.ID, turns.SendRequest{Text: "search"})
		if err != nil {
			t.Fatal(err)
		}
		if got := waitTurn(t, g, turn.RunID); got.Status != turns.TurnDone || got.Placement != map[bool]string{false: "local", true: "worker"}[worker] {
			t.Fatalf("turn %+v", got)
		}
		tr, err := g.client.Transcript(g.ctx(), s.ID)
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := json.Marshal(tr)
		if !strings.Contains(string(raw), "result for cloud workers") || strings.Contains(string(raw), secret) {
			t.Fatalf("worker=%v: transcript lacks the search result or holds the secret: %s", worker, raw)
		}
		if worker {
			p, err := g.client.Placement(g.ctx(), s.ID)
			if err != nil {
				t.Fatal(err)
			}
			e, _ := g.envByID(p.Placement.EnvironmentID)
			if out, _ := exec.Command("grep", "-rl", secret, e.WorkerHome).Output(); len(out) > 0 {
				t.Fatalf("the credential reached the box: %s", out)
			}
		}
	}
	if hits.Load() != 2 {
		t.Fatalf("search API called %d times, want 2", hits.Load())
	}
	g.stop()
}

func (g *gw) envByID(id string) (envs.Environment, error) {
	v, err := g.client.Environment(g.ctx(), id)
	return v.Environment, err
}

package main_test

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// pollAPI asks cond (which reads the API: no event announces what it waits for) every 50ms until it
// holds, failing the test with what() after d.
func waitUntil(t testing.TB, d time.Duration, what func() string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(d); !cond(); time.Sleep(50 * time.Millisecond) { // polling interval
		if time.Now().After(deadline) {
			t.Fatal(what())
		}
	}
}

// apiError is the error body the API answers a refused request with.
type apiError struct{ Code, Message, Field string }

// postRaw posts body (JSON, as given) to path with the gateway's token and returns the status and
// the API's error (zero on success).
func (g *gw) postRaw(path, body string) (int, apiError) {
	g.t.Helper()
	req, _ := http.NewRequest("POST", "http://"+g.addr+path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+g.client.Token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		g.t.Fatal(err)
	}
	var eb struct {
		Error apiError `json:"error"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&eb)
	resp.Body.Close()
	return resp.StatusCode, eb.Error
}

// startAgents starts a gateway on agentsConfig(maxEnvs, extra, scripts) in a fresh directory, its
// environments destroyed at cleanup, and makes the user's workspace; it returns both.
func startAgents(t *testing.T, maxEnvs int, extra string, scripts map[string]string) (*gw, string) {
	t.Helper()
	root := t.TempDir()
	g := startGateway(t, filepath.Join(root, "data"), agentsConfig(t, root, maxEnvs, extra, scripts))
	t.Cleanup(func() { destroyAll(g) })
	ws := filepath.Join(root, "user")
	if err := os.MkdirAll(ws, 0o755); err != nil {
		t.Fatal(err)
	}
	return g, ws
}

// must returns v, failing the test given to it on err: must(g.client.Turns(ctx, id))(g.t).
func must[T any](v T, err error) func(testing.TB) T {
	return func(t testing.TB) T {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
}

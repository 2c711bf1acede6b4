package main_test

import (
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/openclaw/cloudworkers/internal/testrig/testenv"
)

// TestGatewayMCPSessionCap: the gateway's mcp.maxSessionsPerToken reaches /mcp: with a cap of 2 a
// third session evicts the first (idle), whose next request gets 404 naming the cap, while the
// second goes on; a cap below the per-token one is refused at start naming mcp.maxSessions.
func TestGatewayMCPSessionCap(t *testing.T) {
	g := startGateway(t, filepath.Join(t.TempDir(), "data"), "mcp: {maxSessionsPerToken: 2, maxSessions: 2}\n")
	post := func(sid, body string) (int, string, string) {
		t.Helper()
		req, _ := http.NewRequestWithContext(testenv.Context(t, 10*time.Second), http.MethodPost, "http://"+g.addr+"/mcp", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("Authorization", "Bearer "+g.client.Token)
		if sid != "" {
			req.Header.Set("Mcp-Session-Id", sid)
			req.Header.Set("Mcp-Protocol-Version", "2025-06-18")
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		return resp.StatusCode, resp.Header.Get("Mcp-Session-Id"), string(b)
	}
	const initialize = `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`
	const ping = `{"jsonrpc":"2.0","id":2,"method":"ping"}`
	var ids []string
	for i := range 3 {
		status, sid, body := post("", initialize)
		if status != http.StatusOK || sid == "" {
			t.Fatalf("initialize %d: %d %q %s", i, status, sid, body)
		}
		ids = append(ids, sid)
	}
	if status, _, body := post(ids[0], ping); status != http.StatusNotFound || !strings.Contains(body, "closed to make room") || !strings.Contains(body, "mcp.maxSessionsPerToken = 2") {
		t.Fatalf("the evicted session's ping: %d %s", status, body)
	}
	for _, sid := range ids[1:] {
		if status, _, body := post(sid, ping); status != http.StatusOK {
			t.Fatalf("session %s: %d %s", sid, status, body)
		}
	}

	dir := t.TempDir()
	cfg := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(cfg, []byte("mcp: {maxSessionsPerToken: 8, maxSessions: 4}\nworkspaces: {roots: ["+os.TempDir()+"]}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(openclawBin, "gateway", "--data-dir", filepath.Join(dir, "data"), "--listen", freeAddr(t), "--config", cfg).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "mcp.maxSessions") {
		t.Fatalf("gateway with mcp.maxSessions below the per-token cap: %v\n%s", err, out)
	}
}

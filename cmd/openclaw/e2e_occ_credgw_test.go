package main_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/openclaw/cloudworkers/gateway/api"
	"github.com/openclaw/cloudworkers/gateway/envs"
	"github.com/openclaw/cloudworkers/gateway/inference/inferencetest"
	"github.com/openclaw/cloudworkers/gateway/placement"
	"github.com/openclaw/cloudworkers/gateway/turns"
)

// cgOK calls a credential-gateway method requiring a 200.
func (g *gw) cgOK(method string, in any, out any) {
	g.t.Helper()
	if st, raw := g.occSide("credential-gateway", method, in, out); st != 200 {
		g.t.Fatalf("credential-gateway %s = %d %s", method, st, raw)
	}
}

// The OCC credential gateway and the revision routing on a real gateway: a source registered for
// a namespace and attached to a revision is the key a worker turn of that revision sends to the
// provider (a loopback server speaking the Anthropic wire format); the gateway has no Anthropic
// credential of its own, and the value is nowhere in clear (database, WAL, log). The agent's
// session is placed on a revision's environment by activateRevision: a second revision prepared
// while the first serves leaves the turns on the first until it is activated, then the session
// moves with its workspace. stopRevision brings the session and its workspace home and releases
// the box, keeping the session, its transcript and the attachments: the revision prepared and
// activated again serves with the same source. While the session is on no worker (before the
// first activation, after the stop, after its worker was lost) a message to it is refused: its
// turns never run on the gateway, nor on a lease made outside OCC. Withdrawn, the revision's next turn is refused
// before the provider sees it; the source is then removed, twice.
func TestOCCCredentialSourceReachesTheRevisionsModelCalls(t *testing.T) {
	root := t.TempDir()
	provider := inferencetest.NewServer(t, func(_ int, w http.ResponseWriter, _ *http.Request) {
		inferencetest.AnthropicText(w, "all done")
	})
	cfg := fastWorkerConfig + "models:\n  default: anthropic/m\n  providers:\n    anthropic: {api: anthropic-messages, baseUrl: " +
		provider.URL + ", models: [{id: m}]}\n"
	g := startGateway(t, filepath.Join(root, "data"), cfg)
	t.Cleanup(func() { destroyAll(g) })
	key := "sk-ant-e2e-" + strings.Repeat("7c", 12)

	namespace := map[string]any{"id": "ns_c", "name": "team-c", "status": "ready"}
	g.occOK("ensureNamespace", map[string]any{"namespace": namespace}, nil)
	g.occOK("bindAgent", map[string]any{"namespace": namespace, "agent": map[string]any{"id": "agent_c"}}, nil)
	ses := occAgentSession(t, g, "agent_c")
	src := map[string]any{"id": "src_c", "type": "anthropic"}
	var st struct{ State string }
	g.cgOK("registerSource", map[string]any{"namespace": namespace, "source": src,
		"input": map[string]any{"type": "anthropic", "config": map[string]any{}, "secrets": map[string]any{"apiKey": key}}}, &st)
	if st.State != "ready" {
		t.Fatalf("registerSource = %+v", st)
	}
	attach := func(revID string) map[string]any {
		t.Helper()
		revCtx := map[string]any{"namespace": namespace, "revision": occRevision("ns_c", "agent_c", revID, nil)["revision"], "sources": []any{src}}
		var atts []struct{ SourceID, Ref string }
		g.cgOK("attachForRevision", revCtx, &atts)
		if len(atts) != 1 || atts[0].SourceID != "src_c" || atts[0].Ref == "" {
			t.Fatalf("attachForRevision = %+v, want one ref for src_c", atts)
		}
		return revCtx
	}
	ready := func(r occReadiness) bool { return r.Ready || r.RuntimeFailure != nil }
	prepare := func(rev map[string]any) envs.Environment {
		t.Helper()
		if r := g.occPrepareUntil(rev, ready); !r.Ready {
			t.Fatalf("prepareRevision = %+v", r)
		}
		id := rev["revision"].(map[string]any)["id"].(string)
		return g.occEnv("ns_c", "agent_c", id)
	}
	onEnv := func(envID string) placementView {
		t.Helper()
		v := g.placement(ses)
		if v.Placement.State != placement.Active || v.Placement.EnvironmentID != envID {
			t.Fatalf("the agent's session is not active on %s:\n%s", envID, v)
		}
		return v
	}
	turn := func(wantCalls int) {
		t.Helper()
		g.waitUnheld(ses)
		g.runTurn(ses, "hello", "worker")
		reqs := provider.Requests()
		if len(reqs) != wantCalls || reqs[len(reqs)-1].APIKey() != key {
			t.Fatalf("the provider saw %d requests (last key %q), want %d, the last with the revision's source", len(reqs), lastKey(reqs), wantCalls)
		}
	}

	// the first revision: prepared, activated, its environment takes the agent's turns
	rev := occRevision("ns_c", "agent_c", "rev_c", nil)
	revCtx := attach("rev_c")
	env := prepare(rev)
	if v := g.placement(ses); v.Placement.State != placement.Local {
		t.Fatalf("the agent's session moved before activation:\n%s", v)
	}
	// the agent's turns never run on the gateway (the catalog's credentials would make them)
	workerOnly := func(when string) {
		t.Helper()
		if _, code, err := g.send(ses, "on the gateway?"); code != http.StatusConflict || err == nil || !strings.Contains(err.Error(), "run only on a worker") {
			t.Fatalf("a message to the agent's session %s: %d %v, want 409 naming that its turns run only on a worker", when, code, err)
		}
	}
	workerOnly("before activation")
	start := time.Now()
	for range 2 {
		g.occOK("activateRevision", rev, nil)
	}
	t.Logf("first activation (dispatch onto rev_c's environment): %s", time.Since(start).Round(time.Millisecond))
	box := onEnv(env.ID).Placement.BoxWorkspace
	turn(1)
	var sts []struct{ SourceID, State string }
	g.cgOK("attachmentStatus", revCtx, &sts)
	if len(sts) != 1 || sts[0].State != "ready" {
		t.Fatalf("attachmentStatus = %+v", sts)
	}
	for _, f := range []string{"gateway.db", "gateway.db-wal"} {
		if b, _ := os.ReadFile(filepath.Join(g.dataDir, f)); bytes.Contains(b, []byte(key)) {
			t.Fatalf("%s holds the source's value in clear", f)
		}
	}
	if strings.Contains(g.log.String(), key) {
		t.Fatal("the gateway log carries the source's value")
	}
	// the worker's work on the box (what a tool call would have written)
	occWrite(t, filepath.Join(box, "notes.txt"), "written on rev_c's box\n")

	// a second revision prepared while the first serves: the turns stay on the first until the
	// second is activated, then the session moves onto it with its workspace
	rev2 := occRevision("ns_c", "agent_c", "rev_c2", nil)
	rev2Ctx := attach("rev_c2")
	env2 := prepare(rev2)
	if env2.ID == env.ID {
		t.Fatalf("rev_c2 was given rev_c's environment %s", env.ID)
	}
	onEnv(env.ID)
	turn(2)
	g.waitUnheld(ses)
	start = time.Now()
	g.occOK("activateRevision", rev2, nil)
	t.Logf("second activation (pull-back from rev_c, dispatch onto rev_c2): %s", time.Since(start).Round(time.Millisecond))
	box2 := onEnv(env2.ID).Placement.BoxWorkspace
	if got := readFile(t, filepath.Join(box2, "notes.txt")); got != "written on rev_c's box\n" {
		t.Fatalf("the workspace on rev_c2's box has notes.txt %q", got)
	}
	turn(3)
	if e := g.envNow(env.ID); e.State != envs.Attached {
		t.Fatalf("rev_c's environment is %s after the move, want still attached (reserved until rev_c is stopped or retired)", e.State)
	}

	// stop: the session comes home with the box's work, the box is released, the session, its
	// transcript and the attachments stay; prepared and activated again, the revision serves with
	// the same source and the same workspace
	occWrite(t, filepath.Join(box2, "notes.txt"), "written on rev_c2's box\n")
	g.waitUnheld(ses)
	start = time.Now()
	for range 2 {
		g.occOK("stopRevision", rev2, nil)
	}
	t.Logf("stop (pull-back, teardown): %s", time.Since(start).Round(time.Millisecond))
	v := g.placement(ses)
	if v.Placement.State != placement.Local {
		t.Fatalf("after stopRevision the agent's session is not home:\n%s", v)
	}
	home, err := g.client.Session(g.ctx(), ses)
	if err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, filepath.Join(home.Workspace, "notes.txt")); got != "written on rev_c2's box\n" {
		t.Fatalf("the agent's workspace after stop has notes.txt %q, want the box's last write", got)
	}
	if e := g.envNow(env2.ID); e.State != envs.Destroyed {
		t.Fatalf("rev_c2's environment is %s after stopRevision, want destroyed (released)", e.State)
	}
	if n := len(g.turns(ses)); n != 3 {
		t.Fatalf("the agent's session has %d turns after stop, want its 3", n)
	}
	workerOnly("after stop")
	if n := len(provider.Requests()); n != 3 {
		t.Fatalf("the provider saw %d requests, want still 3", n)
	}
	g.cgOK("attachmentStatus", rev2Ctx, &sts)
	if len(sts) != 1 || sts[0].State != "ready" {
		t.Fatalf("attachmentStatus after stop = %+v, want the attachment kept", sts)
	}
	env3 := prepare(rev2)
	if env3.ID == env2.ID {
		t.Fatalf("rev_c2 prepared after stop reuses its released environment %s", env2.ID)
	}
	g.occOK("activateRevision", rev2, nil)
	box3 := onEnv(env3.ID).Placement.BoxWorkspace
	if got := readFile(t, filepath.Join(box3, "notes.txt")); got != "written on rev_c2's box\n" {
		t.Fatalf("the workspace on rev_c2's new box has notes.txt %q", got)
	}
	turn(4)

	withdraw := map[string]any{"namespace": namespace, "revision": rev2["revision"], "sources": []any{src}, "sourceId": "src_c",
		"sandbox": map[string]any{"namespaceName": "team-c", "resourceName": env3.ID, "agentId": "agent_c", "revisionId": "rev_c2"}}
	var w struct{ State string }
	g.cgOK("withdraw", withdraw, &w)
	if w.State != "revoked" {
		t.Fatalf("withdraw = %+v", w)
	}
	g.waitUnheld(ses)
	refused, code, err := g.send(ses, "again")
	if err != nil {
		t.Fatalf("send after withdraw: %d %v", code, err)
	}
	if refused = waitTurn(t, g, refused.RunID); refused.Status == turns.TurnDone || !strings.Contains(refused.Error, "withdrawn") {
		t.Fatalf("turn after withdraw: %s (%s), want it refused naming the withdrawal", refused.Status, refused.Error)
	}
	if n := len(provider.Requests()); n != 4 {
		t.Fatalf("the provider saw %d requests after the withdrawal, want still 4", n)
	}

	sourceCtx := map[string]any{"namespace": namespace, "source": src}
	for range 2 {
		g.cgOK("removeSource", sourceCtx, nil)
	}
	g.cgOK("sourceStatus", sourceCtx, &st)
	if st.State != "absent" {
		t.Fatalf("sourceStatus after removal = %+v", st)
	}
	// retirement revokes rev_c's worker credential: its launch credential, presented by a real
	// worker through a live tunnel (rev_c2's box), is refused as unknown once rev_c is retired —
	// and before, with the same descriptor, only for coming through another environment's tunnel
	raw, err := os.ReadFile(filepath.Join(env.WorkerHome, ".openclaw-worker/state", env.ID, "launch.json"))
	if err != nil {
		t.Fatal(err)
	}
	if out := rogueWorker(t, raw, env3.WorkerSocket); !strings.Contains(out, "wrong-environment") || !strings.Contains(out, "came through the tunnel of "+env3.ID) {
		t.Fatalf("rev_c's live credential through rev_c2's tunnel: %s, want refused for the tunnel only", out)
	}
	g.occOK("retireRevision", rev, nil)
	if out := rogueWorker(t, raw, env3.WorkerSocket); !strings.Contains(out, "unauthorized") || !strings.Contains(out, "unknown worker credential") {
		t.Fatalf("rev_c's credential after its retirement: %s, want refused as unknown", out)
	}
	if e := g.envNow(env.ID); e.State != envs.Destroyed {
		t.Fatalf("rev_c's environment is %s after its retirement", e.State)
	}
	onEnv(env3.ID) // the replacement still serves

	// its box lost: the session is reclaimed, and a message does not restore it onto a fresh lease
	// of the profile (whose calls would use the catalog's credentials): only activation places it
	if _, err := g.client.DestroyEnvironment(g.ctx(), env3.ID, api.DestroyOptions{Force: true, Wait: time.Minute}); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(40 * time.Second); g.placement(ses).Placement.State != placement.Reclaimed; time.Sleep(20 * time.Millisecond) { // polling the API
		if time.Now().After(deadline) {
			t.Fatalf("the session is not reclaimed after its box was destroyed:\n%s", g.placement(ses))
		}
	}
	workerOnly("after its worker was lost")
	list, err := g.client.Environments(g.ctx(), false)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range list {
		if !strings.HasPrefix(e.IdempotencyKey, "occ:") {
			t.Fatalf("environment %s (key %q) was leased for the agent's session outside OCC", e.ID, e.IdempotencyKey)
		}
	}
	g.occOK("retireRevision", rev2, nil)
}

// occAgentSession is the session that carries an OCC agent's turns.
func occAgentSession(t *testing.T, g *gw, agentID string) string {
	t.Helper()
	var id string
	if err := openDB(t, g).R.QueryRowContext(g.ctx(), `SELECT session_id FROM occ_agents WHERE id=?`, agentID).Scan(&id); err != nil || id == "" {
		t.Fatalf("agent %s has no session (%v)", agentID, err)
	}
	return id
}

// waitUnheld waits until no turn or checkpoint holds the session (a worker turn's checkpoint
// holds it for a moment after the turn).
func (g *gw) waitUnheld(ses string) {
	g.t.Helper()
	for deadline := time.Now().Add(40 * time.Second); g.placement(ses).Placement.TurnRunID != ""; time.Sleep(20 * time.Millisecond) { // polling the API
		if time.Now().After(deadline) {
			g.t.Fatalf("the session is still held after its turn:\n%s", g.placement(ses))
		}
	}
}

func lastKey(reqs []inferencetest.Request) string {
	if len(reqs) == 0 {
		return ""
	}
	return reqs[len(reqs)-1].APIKey()
}

// occWrite writes a file as a worker on a local box would.
func occWrite(t *testing.T, path, body string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
}

// envNow is an environment as the gateway reports it now.
func (g *gw) envNow(id string) envs.Environment {
	g.t.Helper()
	v, err := g.client.Environment(g.ctx(), id)
	if err != nil {
		g.t.Fatal(err)
	}
	return v.Environment
}

// rogueWorker runs a real worker with the launch descriptor raw, connecting through the tunnel
// socket sock, and returns its output once it was refused (it must be).
func rogueWorker(t *testing.T, raw []byte, sock string) string {
	t.Helper()
	var d map[string]any
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatal(err)
	}
	d["socketPath"] = sock
	return refusedWorker(t, openclawBin, d, t.TempDir())
}

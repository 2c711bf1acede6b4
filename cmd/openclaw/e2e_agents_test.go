package main_test

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/openclaw/cloudworkers/gateway/agents"
	"github.com/openclaw/cloudworkers/gateway/envs"
	"github.com/openclaw/cloudworkers/gateway/placement"
	"github.com/openclaw/cloudworkers/gateway/sessions"
	"github.com/openclaw/cloudworkers/gateway/turns"
	"github.com/openclaw/cloudworkers/internal/testrig/testenv"
	"github.com/openclaw/cloudworkers/protocol"
)

// agentsConfig is a gateway with a local-box profile "kids" (the default profile of spawns) of at
// most maxEnvs environments, extra config lines, and one priced scripted provider per script
// (model NAME/m), the parent's being the catalog default.
func agentsConfig(t *testing.T, dir string, maxEnvs int, extra string, scripts map[string]string) string {
	t.Helper()
	s := fastWorkerConfig + extra +
		fmt.Sprintf("profiles:\n  - id: kids\n    provider: local\n    hygiene: {metadataRoute: warn, dockerSocket: warn}\n    maxEnvironments: %d\n", maxEnvs) +
		"models:\n  default: parent/m\n  providers:\n"
	for name, body := range scripts {
		p := filepath.Join(dir, name+"-script.json")
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		s += fmt.Sprintf("    %s: {api: scripted, script: %s, models: [{id: m, cost: {input: 1000, output: 2000}}]}\n", name, p)
	}
	return s
}

// toolResults returns the tool results of a session's transcript for the named tool, in order.
func toolResults(t *testing.T, g *gw, id, tool string) []protocol.Message {
	t.Helper()
	tr, err := g.client.Transcript(g.ctx(), id)
	if err != nil {
		t.Fatal(err)
	}
	var out []protocol.Message
	for _, e := range tr.Entries {
		var m protocol.Message
		if json.Unmarshal(e.Content, &m) == nil && m.Role == protocol.RoleToolResult && m.ToolName == tool {
			out = append(out, m)
		}
	}
	return out
}

// spawnResult decodes a successful sessions_* tool result.
func spawnResult(t *testing.T, m protocol.Message) agents.SpawnResult {
	t.Helper()
	if m.IsError {
		t.Fatalf("%s failed: %s", m.ToolName, m.Text())
	}
	var r agents.SpawnResult
	if err := json.Unmarshal([]byte(m.Text()), &r); err != nil {
		t.Fatalf("%s result %q: %v", m.ToolName, m.Text(), err)
	}
	return r
}

func (g *gw) children(id string) []agents.Child {
	g.t.Helper()
	return must(g.client.Children(g.ctx(), id))(g.t)
}

// waitChild polls a parent's children until the child's status is want.
func (g *gw) waitChild(parent, child, want string) agents.Child {
	g.t.Helper()
	var got agents.Child
	waitUntil(g.t, 90*time.Second, func() string {
		return fmt.Sprintf("child %s of %s is not %s: %+v", child, parent, want, g.children(parent))
	}, func() bool {
		for _, c := range g.children(parent) {
			if c.SessionID == child && c.Status == want {
				got = c
				return true
			}
		}
		return false
	})
	return got
}

// kidsEnvironments returns every environment of the profile kids, dead ones included.
func (g *gw) kidsEnvironments() []envs.Environment {
	g.t.Helper()
	list, err := g.client.Environments(g.ctx(), true)
	if err != nil {
		g.t.Fatal(err)
	}
	return slices.DeleteFunc(list, func(e envs.Environment) bool { return e.ProfileID != "kids" })
}

// TestSessionsSpawnWaits: a scripted local parent turn calls sessions_spawn (wait true, fork,
// cleanup delete). A visible child session records its parent and the tool call, runs on a
// local-box worker from a copy of the parent's workspace as it is (uncommitted and untracked files
// included) and commits there; the parent's tool result carries the child's answer, branch and
// commit, and the branch is fetched into the parent's repository; the child's usage and cost show
// under the parent; its environment is destroyed after the pull-back; the parent's checkout is
// untouched.
func TestSessionsSpawnWaits(t *testing.T) {
	testenv.RequireCommands(t, "git")
	g, ws := startAgents(t, 2, "agents: {defaultProfile: kids}\n", map[string]string{
		"parent": `[{"toolCalls": [{"name": "sessions_spawn", "arguments": {"task": "record what you see and commit it", "label": "helper", "model": "child/m", "cleanup": "delete"}}]},
		            {"text": "Parent turn done."}]`,
		"child": `[{"toolCalls": [{"name": "exec", "arguments": {"command": "cat README.md notes.txt > seen.txt && git add -A && git -c user.name=c -c user.email=c@example.com commit -qm 'child: what I saw'"}}]},
		           {"text": "Child turn done."}]`,
	})
	head := testenv.InitRepo(t, ws, "initial", map[string]string{"README.md": "hello\n"})
	// the parent's work in progress: an uncommitted edit and an untracked file
	if err := os.WriteFile(filepath.Join(ws, "README.md"), []byte("hello, edited\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ws, "notes.txt"), []byte("untracked note\n"), 0o644); err != nil {
		t.Fatal(err)
	}

	parent := g.newSession(ws, "parent/m")
	g.runTurn(parent, "get a helper to look", "local")

	res := toolResults(t, g, parent, "sessions_spawn")
	if len(res) != 1 {
		t.Fatalf("%d sessions_spawn results, want 1", len(res))
	}
	r := spawnResult(t, res[0])
	if r.Status != agents.StatusDone || !r.PulledBack || r.Answer != "Child turn done." {
		t.Fatalf("spawn result: status %s pulledBack %v answer %q error %q", r.Status, r.PulledBack, r.Answer, r.Error)
	}
	if !strings.HasPrefix(r.Branch, "openclaw/") || len(r.Commits) != 1 || r.Commits[0].Subject != "child: what I saw" {
		t.Fatalf("spawn result: branch %q commits %+v", r.Branch, r.Commits)
	}
	if r.Usage.Calls < 2 || r.Usage.TotalTokens == 0 || r.Cost <= 0 {
		t.Fatalf("spawn result usage %+v cost %v: the child's model calls are not accounted", r.Usage, r.Cost)
	}
	// the child's commit holds what it saw: the parent's workspace as it was, uncommitted work included
	if got := testenv.Git(t, r.Workspace, "show", r.Commits[0].ID+":seen.txt"); got != "hello, edited\nuntracked note" {
		t.Fatalf("the child saw %q, want the parent's uncommitted edit and untracked file", got)
	}

	// the parent's own repository has the child's branch, to merge from its workspace
	if r.ParentBranch != r.Branch || testenv.Git(t, ws, "rev-parse", "refs/heads/"+r.Branch) != r.Commits[0].ID {
		t.Fatalf("the child's branch %s is not in the parent's repository (parentBranch %q)", r.Branch, r.ParentBranch)
	}

	child, err := g.client.Session(g.ctx(), r.SessionID)
	if err != nil {
		t.Fatal(err)
	}
	if child.ParentSessionID != parent || child.SpawnToolCallID != "call_0_0" || child.SpawnDepth != 1 || child.Title != "helper" {
		t.Fatalf("child row: parent %q tool call %q depth %d title %q", child.ParentSessionID, child.SpawnToolCallID, child.SpawnDepth, child.Title)
	}
	kids := g.children(parent)
	if len(kids) != 1 || kids[0].SessionID != r.SessionID || kids[0].Cost != r.Cost || kids[0].Usage != r.Usage {
		t.Fatalf("children of the parent: %+v, want the child with its cost %v", kids, r.Cost)
	}
	out, err := exec.Command(openclawBin, "session", "show", parent, "--gateway", g.addr, "--data-dir", g.dataDir).CombinedOutput()
	if err != nil {
		t.Fatalf("session show: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), r.SessionID) || !strings.Contains(string(out), fmt.Sprintf("cost %.6f", r.Cost)) {
		t.Fatalf("session show of the parent does not list its child and its cost:\n%s", out)
	}

	// the spawn and the cleanup are audited
	rows, err := g.client.Audit(g.ctx(), "")
	if err != nil {
		t.Fatal(err)
	}
	var spawnRows, cleanupRows int
	for _, a := range rows {
		if a.Kind == "agents.spawn" && strings.Contains(a.Detail, parent+" spawned "+r.SessionID) && strings.Contains(a.Detail, "tool call call_0_0") {
			spawnRows++
		}
		if a.Kind == "agents.cleanup" && strings.Contains(a.Detail, r.SessionID) {
			cleanupRows++
		}
	}
	if spawnRows != 1 || cleanupRows != 1 {
		t.Fatalf("audit: %d agents.spawn and %d agents.cleanup rows for the child, want 1 each", spawnRows, cleanupRows)
	}

	// cleanup "delete": the child's machine is destroyed once its results are back
	if r.EnvironmentID == "" {
		t.Fatal("the spawn result names no environment")
	}
	if e := g.waitEnv(r.EnvironmentID, func(e envs.Environment) bool { return e.State.Dead() }); e.State != envs.Destroyed {
		t.Fatalf("child environment %s is %s, want destroyed", e.ID, e.State)
	}
	// the parent's own checkout: same commit, its work in progress as it was, nothing of the child's
	if testenv.Git(t, ws, "rev-parse", "HEAD") != head || readFile(t, filepath.Join(ws, "README.md")) != "hello, edited\n" || exists(filepath.Join(ws, "seen.txt")) {
		t.Fatal("the parent's checkout was changed by the spawn")
	}
}

// TestSessionsSpawnNoWait: wait false returns the child's id at once (the child not yet run); a
// later parent turn's sessions_status reports it done and sessions_pullback brings its file home.
func TestSessionsSpawnNoWait(t *testing.T) {
	g, ws := startAgents(t, 2, "agents: {defaultProfile: kids}\n", map[string]string{
		"parent": `[{"toolCalls": [{"name": "sessions_spawn", "arguments": {"task": "write out.txt", "model": "child/m", "workspace": "empty", "wait": false}}]},
		            {"text": "Spawned turn done."},
		            {"toolCalls": [{"name": "sessions_status", "arguments": {"sessionId": "{{last.sessionId}}"}}]},
		            {"toolCalls": [{"name": "sessions_pullback", "arguments": {"sessionId": "{{last.sessionId}}"}}]},
		            {"text": "Follow-up turn done."}]`,
		"child": `[{"toolCalls": [{"name": "write", "arguments": {"path": "out.txt", "content": "made by the child\n"}}]},
		           {"text": "Child turn done."}]`,
	})
	parent := g.newSession(ws, "parent/m")
	g.runTurn(parent, "start a helper", "local")
	spawned := spawnResult(t, toolResults(t, g, parent, "sessions_spawn")[0])
	if spawned.SessionID == "" || spawned.Status != agents.StatusStarting || spawned.Answer != "" {
		t.Fatalf("wait false returned %+v, want the child's id before it ran", spawned)
	}
	g.waitChild(parent, spawned.SessionID, agents.StatusDone)

	g.runTurn(parent, "how is the helper doing", "local")
	st := spawnResult(t, toolResults(t, g, parent, "sessions_status")[0])
	if st.SessionID != spawned.SessionID || st.Status != agents.StatusDone || st.Answer != "Child turn done." || st.PulledBack {
		t.Fatalf("sessions_status: %+v, want the child done on its worker", st)
	}
	pb := spawnResult(t, toolResults(t, g, parent, "sessions_pullback")[0])
	if !pb.PulledBack || pb.Workspace == "" {
		t.Fatalf("sessions_pullback: %+v", pb)
	}
	if got := readFile(t, filepath.Join(pb.Workspace, "out.txt")); got != "made by the child\n" {
		t.Fatalf("the child's file came back as %q", got)
	}
}

// depthScripts: the parent spawns a child (wait true, empty workspace); the child, on its worker,
// tries to spawn one more level (worker.sessions.spawn), and so does any grandchild.
var depthScripts = map[string]string{
	"parent": `[{"toolCalls": [{"name": "sessions_spawn", "arguments": {"task": "go deeper", "model": "child/m", "workspace": "empty"}}]},
	            {"text": "Parent turn done."}]`,
	"child": `[{"toolCalls": [{"name": "sessions_spawn", "arguments": {"task": "go deeper", "workspace": "empty"}}]},
	           {"text": "Child turn done."}]`,
}

// TestSessionsSpawnDepth: with the default agents.maxSpawnDepth a worker session's sessions_spawn
// is refused with spawn-depth-exceeded and no environment is leased for it; with maxSpawnDepth 2
// the child's spawn works once and the grandchild's is refused.
func TestSessionsSpawnDepth(t *testing.T) {
	for _, c := range []struct {
		name     string
		extra    string
		wantEnvs int
	}{
		{"default", "agents: {defaultProfile: kids}\n", 1},
		{"maxSpawnDepth2", "agents: {defaultProfile: kids, maxSpawnDepth: 2}\n", 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			g, ws := startAgents(t, 3, c.extra, depthScripts)
			parent := g.newSession(ws, "parent/m")
			g.runTurn(parent, "delegate", "local")
			child := spawnResult(t, toolResults(t, g, parent, "sessions_spawn")[0])
			if child.Answer != "Child turn done." {
				t.Fatalf("child: %+v", child)
			}
			// the deepest session that tried: the child by default, the grandchild at depth 2
			deepest := child.SessionID
			if c.wantEnvs == 2 {
				grand := spawnResult(t, toolResults(t, g, child.SessionID, "sessions_spawn")[0])
				gs, err := g.client.Session(g.ctx(), grand.SessionID)
				if err != nil {
					t.Fatal(err)
				}
				if gs.ParentSessionID != child.SessionID || gs.SpawnDepth != 2 || grand.Answer != "Child turn done." {
					t.Fatalf("grandchild %+v row %+v", grand, gs)
				}
				deepest = grand.SessionID
			}
			refused := toolResults(t, g, deepest, "sessions_spawn")
			if len(refused) != 1 || !refused[0].IsError || !strings.Contains(refused[0].Text(), string(protocol.CodeSpawnDepthExceeded)) {
				t.Fatalf("the spawn past the bound: %+v, want an error with %s", refused, protocol.CodeSpawnDepthExceeded)
			}
			if got := g.kidsEnvironments(); len(got) != c.wantEnvs {
				t.Fatalf("%d environments leased, want %d (none for the refused spawn)", len(got), c.wantEnvs)
			}
			ses, err := g.client.Sessions(g.ctx())
			if err != nil {
				t.Fatal(err)
			}
			if len(ses) != c.wantEnvs+1 {
				t.Fatalf("%d sessions, want %d: the refused spawn created one", len(ses), c.wantEnvs+1)
			}
		})
	}
}

// TestSessionsSpawnFromADispatchedSession: a session a human dispatched to a worker (spawn depth 0)
// counts as a worker session: with the default bound its sessions_spawn is refused with
// spawn-depth-exceeded and no environment is leased for it.
func TestSessionsSpawnFromADispatchedSession(t *testing.T) {
	g, ws := startAgents(t, 3, "agents: {defaultProfile: kids}\n", depthScripts)
	parent, _ := g.activeSession(ws, "parent/m", "kids")
	g.runTurn(parent, "delegate", "worker")
	refused := toolResults(t, g, parent, "sessions_spawn")
	if len(refused) != 1 || !refused[0].IsError || !strings.Contains(refused[0].Text(), string(protocol.CodeSpawnDepthExceeded)) {
		t.Fatalf("sessions_spawn of a dispatched session: %+v, want an error with %s", refused, protocol.CodeSpawnDepthExceeded)
	}
	if got := g.kidsEnvironments(); len(got) != 1 {
		t.Fatalf("%d environments of the profile, want only the parent's own", len(got))
	}
	if ses := must(g.client.Sessions(g.ctx()))(t); len(ses) != 1 {
		t.Fatalf("%d sessions, want only the parent: the refused spawn created one", len(ses))
	}
}

// TestSessionsSpawnTwoAtOnce: two spawns in one assistant message. On a profile of
// maxEnvironments 1 the first is placed and the second refused with capacity-exceeded and a
// retryAfterMs (refused, not queued); with maxEnvironments 2 both run at once, each on its own
// environment.
func TestSessionsSpawnTwoAtOnce(t *testing.T) {
	for _, maxEnvs := range []int{1, 2} {
		t.Run(fmt.Sprintf("maxEnvironments%d", maxEnvs), func(t *testing.T) {
			g, ws := startAgents(t, maxEnvs, "agents: {defaultProfile: kids}\n", map[string]string{
				"parent": `[{"toolCalls": [
				              {"name": "sessions_spawn", "arguments": {"task": "one", "label": "a", "model": "child/m", "workspace": "empty", "wait": false}},
				              {"name": "sessions_spawn", "arguments": {"task": "two", "label": "b", "model": "child/m", "workspace": "empty", "wait": false}}]},
				            {"text": "Parent turn done."}]`,
				"child": `[{"text": "Child turn done."}]`,
			})
			parent := g.newSession(ws, "parent/m")
			g.runTurn(parent, "two helpers", "local")
			res := toolResults(t, g, parent, "sessions_spawn")
			if len(res) != 2 {
				t.Fatalf("%d results", len(res))
			}
			first := spawnResult(t, res[0])
			if maxEnvs == 1 {
				if !res[1].IsError || !strings.Contains(res[1].Text(), string(protocol.CodeCapacityExceeded)) || !strings.Contains(res[1].Text(), "retryAfterMs") {
					t.Fatalf("the second spawn: error %v %q, want capacity-exceeded with retryAfterMs", res[1].IsError, res[1].Text())
				}
				var d struct {
					RetryAfterMs int64 `json:"retryAfterMs"`
				}
				if err := json.Unmarshal(res[1].Details, &d); err != nil || d.RetryAfterMs <= 0 {
					t.Fatalf("the refusal's details %s carry no retryAfterMs", res[1].Details)
				}
				kids := g.children(parent)
				if len(kids) != 1 || kids[0].SessionID != first.SessionID {
					t.Fatalf("children %+v, want only the first", kids)
				}
				g.waitChild(parent, first.SessionID, agents.StatusDone)
				if got := g.kidsEnvironments(); len(got) != 1 {
					t.Fatalf("%d environments, want 1", len(got))
				}
				return
			}
			second := spawnResult(t, res[1])
			a := g.waitChild(parent, first.SessionID, agents.StatusDone)
			b := g.waitChild(parent, second.SessionID, agents.StatusDone)
			if a.EnvID == "" || a.EnvID == b.EnvID || len(g.kidsEnvironments()) != 2 {
				t.Fatalf("children on environments %q and %q, want two distinct ones", a.EnvID, b.EnvID)
			}
		})
	}
}

// TestSessionsSpawnCancelParent: cancelling the parent's turn while it waits on its child cancels
// the child's turn.
func TestSessionsSpawnCancelParent(t *testing.T) {
	g, ws := startAgents(t, 1, "agents: {defaultProfile: kids}\n", map[string]string{
		"parent": `[{"toolCalls": [{"name": "sessions_spawn", "arguments": {"task": "take long", "model": "child/m", "workspace": "empty"}}]},
		            {"text": "Parent turn done."}]`,
		"child": `[{"toolCalls": [{"name": "exec", "arguments": {"command": "sleep 120", "timeout": 300, "yieldMs": 600000}}]},
		           {"text": "Child turn done."}]`,
	})
	parent := g.newSession(ws, "parent/m")
	turn, code, err := g.send(parent, "wait on a slow helper")
	if err != nil {
		t.Fatalf("send: %d %v", code, err)
	}
	var kid string
	waitUntil(t, 60*time.Second, func() string { return fmt.Sprintf("no running child: %+v", g.children(parent)) }, func() bool {
		for _, c := range g.children(parent) {
			if c.Status == agents.StatusRunning {
				kid = c.SessionID
			}
		}
		return kid != ""
	})
	if _, err := g.do("POST", "/api/v1/sessions/"+parent+"/cancel", nil, nil); err != nil {
		t.Fatal(err)
	}
	if pt := waitTurn(t, g, turn.RunID); pt.Status != turns.TurnCanceled {
		t.Fatalf("parent turn %s, want canceled", pt.Status)
	}
	ct := g.turns(kid)
	if len(ct) != 1 {
		t.Fatalf("child turns %+v", ct)
	}
	if got := waitTurn(t, g, ct[0].RunID); got.Status != turns.TurnCanceled {
		t.Fatalf("child turn %s (%s), want canceled with its parent's", got.Status, got.Error)
	}
}

var _ = sessions.CreateParams{}

// TestSessionsSpawnCancelWorkerParent: a child on a worker waiting on its own child (maxSpawnDepth
// 2, worker.sessions.spawn) has its turn cancelled: the grandchild's turn is cancelled with it.
func TestSessionsSpawnCancelWorkerParent(t *testing.T) {
	g, ws := startAgents(t, 2, "agents: {defaultProfile: kids, maxSpawnDepth: 2}\n", map[string]string{
		"parent": `[{"toolCalls": [{"name": "sessions_spawn", "arguments": {"task": "delegate", "model": "child/m", "workspace": "empty"}}]},
		            {"text": "Parent turn done."}]`,
		"child": `[{"toolCalls": [{"name": "sessions_spawn", "arguments": {"task": "take long", "model": "grand/m", "workspace": "empty"}}]},
		           {"text": "Child turn done."}]`,
		"grand": `[{"toolCalls": [{"name": "exec", "arguments": {"command": "sleep 120", "timeout": 300, "yieldMs": 600000}}]},
		           {"text": "Grandchild turn done."}]`,
	})
	parent := g.newSession(ws, "parent/m")
	turn, code, err := g.send(parent, "delegate twice")
	if err != nil {
		t.Fatalf("send: %d %v", code, err)
	}
	var child, grand string
	waitUntil(t, 60*time.Second, func() string { return fmt.Sprintf("no running grandchild (child %q)", child) }, func() bool {
		for _, c := range g.children(parent) {
			child = c.SessionID
		}
		if child != "" {
			for _, c := range g.children(child) {
				if c.Status == agents.StatusRunning {
					grand = c.SessionID
				}
			}
		}
		return grand != ""
	})
	if _, err := g.do("POST", "/api/v1/sessions/"+child+"/cancel", nil, nil); err != nil {
		t.Fatal(err)
	}
	gt := g.turns(grand)
	if len(gt) != 1 {
		t.Fatalf("grandchild turns %+v", gt)
	}
	if got := waitTurn(t, g, gt[0].RunID); got.Status != turns.TurnCanceled {
		t.Fatalf("grandchild turn %s (%s), want canceled with its parent's", got.Status, got.Error)
	}
	if pt := waitTurn(t, g, turn.RunID); pt.Status != turns.TurnDone {
		t.Fatalf("the top parent's turn %s (%s), want done (it only waited)", pt.Status, pt.Error)
	}
	if r := spawnResult(t, toolResults(t, g, parent, "sessions_spawn")[0]); r.Status != agents.StatusCanceled {
		t.Fatalf("the child's spawn result %+v, want canceled", r)
	}
}

// TestSessionsSpawnFromAnOCCAgentsSession: the third way onto a worker. An OCC agent's session,
// placed on its revision's environment by activateRevision, calls sessions_spawn with the default
// agents.maxSpawnDepth: refused with spawn-depth-exceeded, and no session or environment is made.
func TestSessionsSpawnFromAnOCCAgentsSession(t *testing.T) {
	root := t.TempDir()
	g := startGateway(t, filepath.Join(root, "data"), fastWorkerConfig+"agents: {defaultProfile: local}\n"+
		// the agent's session runs the catalog's default model: the first by name, the spawning one
		scriptedModels(t, root, map[string]string{"agent": depthScripts["parent"], "child": depthScripts["child"]}))
	t.Cleanup(func() { destroyAll(g) })
	namespace := map[string]any{"id": "ns_d", "name": "team-d", "status": "ready"}
	g.occOK("ensureNamespace", map[string]any{"namespace": namespace}, nil)
	g.occOK("bindAgent", map[string]any{"namespace": namespace, "agent": map[string]any{"id": "agent_d"}}, nil)
	ses := occAgentSession(t, g, "agent_d")
	rev := occRevision("ns_d", "agent_d", "rev_d", nil)
	if r := g.occPrepareUntil(rev, func(r occReadiness) bool { return r.Ready || r.RuntimeFailure != nil }); !r.Ready {
		t.Fatalf("prepareRevision = %+v", r)
	}
	g.occOK("activateRevision", rev, nil)
	g.mustRest(ses, placement.Active)
	envsBefore := len(must(g.client.Environments(g.ctx(), true))(t))
	sessionsBefore := len(must(g.client.Sessions(g.ctx()))(t))
	g.runTurn(ses, "delegate", "worker")
	refused := toolResults(t, g, ses, "sessions_spawn")
	if len(refused) != 1 || !refused[0].IsError || !strings.Contains(refused[0].Text(), string(protocol.CodeSpawnDepthExceeded)) {
		t.Fatalf("sessions_spawn of an OCC agent's session: %+v, want an error with %s", refused, protocol.CodeSpawnDepthExceeded)
	}
	if n := len(must(g.client.Environments(g.ctx(), true))(t)); n != envsBefore {
		t.Fatalf("%d environments after the refused spawn, %d before", n, envsBefore)
	}
	if n := len(must(g.client.Sessions(g.ctx()))(t)); n != sessionsBefore {
		t.Fatalf("%d sessions after the refused spawn, %d before", n, sessionsBefore)
	}
}

// TestSessionsPullbackOfABusyChild: a child spawned with budgetUsd has that budget;
// sessions_pullback of a child whose turn runs is refused without busy (the refusal says what to
// say); with busy drain it waits for the child's turn to end on its worker and brings its work
// home.
func TestSessionsPullbackOfABusyChild(t *testing.T) {
	g, ws := startAgents(t, 2, "agents: {defaultProfile: kids}\n", map[string]string{
		"parent": `[{"toolCalls": [{"name": "sessions_spawn", "arguments": {"task": "write out.txt slowly", "model": "child/m", "workspace": "empty", "wait": false, "budgetUsd": 100}}]},
		            {"text": "Spawned."},
		            {"toolCalls": [{"name": "sessions_pullback", "arguments": {"sessionId": "{{last.sessionId}}"}}]},
		            {"toolCalls": [{"name": "sessions_pullback", "arguments": {"sessionId": "{{last.sessionId}}", "busy": "drain"}}]},
		            {"text": "Collected."}]`,
		"child": `[{"toolCalls": [{"name": "exec", "arguments": {"command": "sleep 3; echo made by the child > out.txt", "timeout": 60}}]},
		           {"text": "Child turn done."}]`,
	})
	parent := g.newSession(ws, "parent/m")
	g.runTurn(parent, "start a helper", "local")
	child := spawnResult(t, toolResults(t, g, parent, "sessions_spawn")[0]).SessionID
	if sp := must(g.client.SessionSpend(g.ctx(), child))(t); sp.BudgetUSD != 100 {
		t.Fatalf("the child spawned with budgetUsd 100 has a budget of $%v", sp.BudgetUSD)
	}
	g.inCommand(child, 0)
	g.runTurn(parent, "bring it home", "local")
	results := toolResults(t, g, parent, "sessions_pullback")
	if len(results) != 2 {
		t.Fatalf("%d sessions_pullback results, want 2", len(results))
	}
	if refused := results[0].Content[0].Text; !results[0].IsError || !strings.Contains(refused, "busy: drain") {
		t.Fatalf("sessions_pullback of a running child without busy: %q, want a refusal naming busy", refused)
	}
	pb := spawnResult(t, results[1])
	if !pb.PulledBack || pb.Answer != "Child turn done." {
		t.Fatalf("sessions_pullback with busy drain: %+v, want the child's finished turn brought home", pb)
	}
	if got := readFile(t, filepath.Join(pb.Workspace, "out.txt")); got != "made by the child\n" {
		t.Fatalf("the child's file came back as %q", got)
	}
}

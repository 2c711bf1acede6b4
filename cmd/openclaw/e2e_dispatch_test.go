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

	"github.com/openclaw/cloudworkers/gateway/api"
	"github.com/openclaw/cloudworkers/gateway/envs"
	"github.com/openclaw/cloudworkers/gateway/placement"
	"github.com/openclaw/cloudworkers/gateway/sessions"
	"github.com/openclaw/cloudworkers/gateway/turns"
	"github.com/openclaw/cloudworkers/internal/testrig/testenv"
	"github.com/openclaw/cloudworkers/protocol"
)

// dispatchScript is one worker turn then one local turn, one tool call per model call. The worker
// turn edits a tracked file, commits it when the workspace is a git repository, writes an untracked
// file and runs a command that records where it ran; the local turn records where it ran.
const dispatchScript = `[
  {"text": "Editing.", "toolCalls": [{"name": "edit", "arguments": {"path": "README.md", "edits": [{"oldText": "hello", "newText": "hello from the worker"}]}}]},
  {"toolCalls": [{"name": "exec", "arguments": {"command": "if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then git add README.md && git -c user.name=w -c user.email=w@example.com commit -qm 'worker edit'; fi"}}]},
  {"toolCalls": [{"name": "write", "arguments": {"path": "untracked.txt", "content": "new on the worker\n"}}]},
  {"toolCalls": [{"name": "exec", "arguments": {"command": "pwd > where.txt"}}]},
  {"text": "Worker turn done."},
  {"toolCalls": [{"name": "exec", "arguments": {"command": "pwd > local-where.txt && cat untracked.txt"}}]},
  {"text": "Local turn done."}
]`

// workerTurnMsgs and localTurnMsgs are the assistant messages each turn of dispatchScript commits.
const (
	workerTurnMsgs = 5
	localTurnMsgs  = 2
)

// slowScript is a worker turn that runs long enough for a test to act while it is in flight.
const slowScript = `[
  {"toolCalls": [{"name": "exec", "arguments": {"command": "sleep 3; echo slept > slept.txt", "timeout": 30}}]},
  {"text": "Slow turn done."},
  {"text": "Local turn done."}
]`

// scriptedModels returns a models section with one scripted provider per named script.
func scriptedModels(t *testing.T, dir string, scripts map[string]string) string {
	t.Helper()
	s := "models:\n  providers:\n"
	first := ""
	for name, body := range scripts {
		p := filepath.Join(dir, name+"-script.json")
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		s += fmt.Sprintf("    %s: {api: scripted, script: %s, models: [{id: m}]}\n", name, p)
		if first == "" || name < first {
			first = name
		}
	}
	return s + "  default: " + first + "/m\n"
}

// userWorkspace creates the user's workspace: README.md ("hello"), committed when git is set.
func userWorkspace(t *testing.T, dir string, git bool) {
	t.Helper()
	readme := map[string]string{"README.md": "hello\n"}
	if !git {
		testenv.WriteFiles(t, dir, readme)
		return
	}
	testenv.InitRepo(t, dir, "initial", readme)
	// a submodule, sent to the box as it is at the recorded commit
	lib := dir + "-sublib"
	testenv.InitRepo(t, lib, "lib", map[string]string{"lib.go": "package lib\n"})
	testenv.Git(t, dir, "-c", "protocol.file.allow=always", "submodule", "add", "-q", lib, "lib")
	testenv.Git(t, dir, "commit", "-qm", "add lib")
}

// placementView is a session's placement and its steps, printable.
type placementView api.PlacementView

func (g *gw) placement(id string) placementView {
	g.t.Helper()
	v, err := g.client.Placement(g.ctx(), id)
	if err != nil {
		g.t.Fatal(err)
	}
	return placementView(v)
}

func (v placementView) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "placement %s gen %d env %s turn %q error %q\n", v.Placement.State, v.Placement.Generation, v.Placement.EnvironmentID, v.Placement.TurnRunID, v.Placement.Error)
	for _, e := range v.Events {
		fmt.Fprintf(&b, "  %s → %s (%d): %s\n", e.From, e.To, e.Generation, e.Reason)
	}
	return b.String()
}

// waitPlacement polls the placement until it rests (active, local, reclaimed or failed).
func (g *gw) waitPlacement(id string) placementView {
	g.t.Helper()
	deadline := time.Now().Add(40 * time.Second)
	for {
		v := g.placement(id)
		switch v.Placement.State {
		case placement.Active, placement.Local, placement.Reclaimed, placement.Failed:
			return v
		}
		if time.Now().After(deadline) {
			g.t.Fatalf("session %s placement does not rest:\n%s", id, v)
		}
		time.Sleep(20 * time.Millisecond) // polling the API
	}
}

// mustRest waits for the placement to rest in want.
func (g *gw) mustRest(id string, want placement.State) placementView {
	g.t.Helper()
	v := g.waitPlacement(id)
	if v.Placement.State != want {
		g.t.Fatalf("session %s: placement %s, want %s:\n%s", id, v.Placement.State, want, v)
	}
	return v
}

func (g *gw) newSession(workspace, model string) string {
	g.t.Helper()
	ses, err := g.client.CreateSession(g.ctx(), sessions.CreateRequest{CreateParams: sessions.CreateParams{Title: "dispatch", Workspace: workspace, Model: model}})
	if err != nil {
		g.t.Fatal(err)
	}
	return ses.ID
}

func (g *gw) dispatchTo(id, profile string) {
	g.t.Helper()
	if _, err := g.client.Dispatch(g.ctx(), id, placement.DispatchRequest{ProfileID: profile}); err != nil {
		g.t.Fatalf("dispatch %s: %v", id, err)
	}
}

// activeSession creates a session on ws with model and dispatches it to profile; it returns the
// session once it is active on its worker, and the worker's environment.
func (g *gw) activeSession(ws, model, profile string) (id, envID string) {
	g.t.Helper()
	id = g.newSession(ws, model)
	g.dispatchTo(id, profile)
	return id, g.mustRest(id, placement.Active).Placement.EnvironmentID
}

func (g *gw) pullback(id string) {
	g.t.Helper()
	if _, err := g.client.PullBack(g.ctx(), id, placement.PullBackRequest{}); err != nil {
		g.t.Fatalf("pull back %s: %v", id, err)
	}
}

// send posts a message raw: the tests check the HTTP status of a refusal.
func (g *gw) send(id, text string) (turns.Turn, int, error) {
	var turn turns.Turn
	code, err := g.do("POST", "/api/v1/sessions/"+id+"/messages", map[string]string{"text": text}, &turn)
	return turn, code, err
}

// runTurn sends a message and waits for its turn to end done on the wanted placement.
func (g *gw) runTurn(id, text, wantPlacement string) turns.Turn {
	g.t.Helper()
	turn, code, err := g.send(id, text)
	if err != nil {
		g.t.Fatalf("send to %s: %d %v", id, code, err)
	}
	turn = waitTurn(g.t, g, turn.RunID)
	if turn.Status != turns.TurnDone || turn.Placement != wantPlacement {
		g.t.Fatalf("turn %s: %s on %s (%s), want done on %s", turn.RunID, turn.Status, turn.Placement, turn.Error, wantPlacement)
	}
	return turn
}

func (g *gw) turns(id string) []turns.Turn {
	g.t.Helper()
	return must(g.client.Turns(g.ctx(), id))(g.t)
}

// roles returns the roles of the session's transcript messages, in order, and the assistant texts.
func (g *gw) roles(id string) (roles []string, texts []string) {
	g.t.Helper()
	tr, err := g.client.Transcript(g.ctx(), id)
	if err != nil {
		g.t.Fatal(err)
	}
	for _, e := range tr.Entries {
		var m protocol.Message
		if err := json.Unmarshal(e.Content, &m); err != nil {
			g.t.Fatal(err)
		}
		roles = append(roles, m.Role)
		if m.Role == protocol.RoleAssistant {
			for _, c := range m.Content {
				if c.Type == protocol.ContentText && c.Text != "" {
					texts = append(texts, c.Text)
				}
			}
		}
	}
	return roles, texts
}

// checkOneOwner checks that the transcript is exactly the given turns, each run once by one loop:
// per turn one user message and its assistant messages, the final texts in order, nothing twice.
func checkOneOwner(t *testing.T, g *gw, id string, turnMsgs []int, finals []string) {
	t.Helper()
	roles, texts := g.roles(id)
	users, assistants := 0, 0
	for _, r := range roles {
		switch r {
		case protocol.RoleUser:
			users++
		case protocol.RoleAssistant:
			assistants++
		}
	}
	want := 0
	for _, n := range turnMsgs {
		want += n
	}
	if users != len(turnMsgs) || assistants != want {
		t.Fatalf("transcript of %s: %d user and %d assistant messages, want %d and %d (a turn ran twice or not at all): %v",
			id, users, assistants, len(turnMsgs), want, roles)
	}
	var got []string
	for _, tx := range texts {
		if strings.HasSuffix(tx, "turn done.") {
			got = append(got, tx)
		}
	}
	if strings.Join(got, "|") != strings.Join(finals, "|") {
		t.Fatalf("final texts %q, want %q", got, finals)
	}
	ts := g.turns(id)
	if len(ts) != len(turnMsgs) {
		t.Fatalf("%d turns recorded, want %d: %+v", len(ts), len(turnMsgs), ts)
	}
	for _, tr := range ts {
		if tr.Status != turns.TurnDone {
			t.Fatalf("turn %s %s: %s", tr.RunID, tr.Status, tr.Error)
		}
	}
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func exists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}

// dispatchCase runs the dispatch matrix for one workspace kind on one profile: a worker turn, pull
// back, and a local turn in the pulled-back workspace.
func dispatchCase(t *testing.T, g *gw, root, profile string, git, fresh bool) {
	t.Helper()
	ws := filepath.Join(root, "user")
	userWorkspace(t, ws, git)
	var head string
	if git {
		head = testenv.Git(t, ws, "rev-parse", "HEAD")
	}
	var id string
	finals := []string{"Worker turn done.", "Local turn done."}
	msgs := []int{workerTurnMsgs, localTurnMsgs}
	if fresh {
		// a new worker session: `openclaw session new --worker P` creates it and dispatches it
		out, err := exec.Command(openclawBin, "session", "new", "--workspace", ws, "--worker", profile, "--model", "fresh/m",
			"--gateway", g.addr, "--data-dir", g.dataDir).Output()
		if err != nil {
			t.Fatalf("session new --worker: %v %s", err, out)
		}
		id = strings.TrimSpace(string(out))
	} else {
		// an existing local session with a turn behind it
		id = g.newSession(ws, "existing/m")
		g.runTurn(id, "say hello", "local")
		finals = append([]string{"Local hello turn done."}, finals...)
		msgs = append([]int{1}, msgs...)
		g.dispatchTo(id, profile)
	}
	v := g.mustRest(id, placement.Active)
	box := v.Placement.BoxWorkspace
	wantMode := "plain"
	if git {
		wantMode = "git"
	}
	if v.Placement.SyncMode != wantMode || box == "" || v.Placement.OwnerEpoch < 2 {
		t.Fatalf("active placement %+v", v.Placement)
	}
	if git {
		if !slices.ContainsFunc(v.Events, func(ev placement.Event) bool { return strings.HasPrefix(ev.Reason, "submodule lib sent at ") }) {
			t.Fatalf("no event says the submodule was sent:\n%s", v)
		}
		if got := readFile(t, filepath.Join(box, "lib", "lib.go")); got != "package lib\n" {
			t.Fatalf("submodule on the box: %q", got)
		}
	}
	// A new plain session's checkpoint after the worker's turn cannot be made (a file where its
	// store would go): the box's work is in the anchor by then, so its base must be recorded all
	// the same, or the pull-back below stops on that work as drift.
	failCheckpoint := !git && fresh
	if failCheckpoint {
		store := filepath.Join(g.dataDir, "checkpoints", strings.TrimPrefix(id, "ses_"))
		if err := os.MkdirAll(filepath.Dir(store), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(store, []byte("not a directory\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	g.runTurn(id, "edit, commit and run", "worker")
	if failCheckpoint {
		deadline := time.Now().Add(30 * time.Second)
		saved := func(ev placement.Event) bool {
			return strings.HasPrefix(ev.Reason, "checkpoint failed: ") && strings.Contains(ev.Reason, "the anchor holds the worker's workspace")
		}
		for !slices.ContainsFunc(g.placement(id).Events, saved) {
			if time.Now().After(deadline) {
				t.Fatalf("no failed checkpoint recorded:\n%s", g.placement(id))
			}
			time.Sleep(20 * time.Millisecond)
		}
	}

	// `openclaw sync plan ENV` diffs a workspace against the box's copy of the session's
	// workspace: the user's untouched checkout would send README.md back and delete what the
	// worker added.
	var stderrB strings.Builder
	planCmd := exec.Command(openclawBin, "sync", "plan", v.Placement.EnvironmentID, "--workspace", ws, "-o", "json",
		"--gateway", g.addr, "--data-dir", g.dataDir)
	planCmd.Stderr = &stderrB
	out, err := planCmd.Output()
	if err != nil {
		t.Fatalf("sync plan ENV: %v %s", err, stderrB.String())
	}
	var plan struct {
		Session, BoxDir, Mode string
		Send, Deletes         []string
	}
	if err := json.Unmarshal(out, &plan); err != nil {
		t.Fatalf("sync plan output %s: %v", out, err)
	}
	if plan.Session != id || plan.BoxDir != box || plan.Mode != wantMode || !slices.Contains(plan.Send, "README.md") ||
		!slices.Contains(plan.Deletes, "untracked.txt") || !slices.Contains(plan.Deletes, "where.txt") {
		t.Fatalf("sync plan against the box: %+v", plan)
	}
	if env, err := g.client.Environment(g.ctx(), v.Placement.EnvironmentID); err != nil || !slices.Equal(env.AttachedSessionIDs, []string{id}) {
		t.Fatalf("environment serving %s lists sessions %v (err %v)", id, env.AttachedSessionIDs, err)
	}
	if out, err := exec.Command(openclawBin, "sync", "plan", v.Placement.EnvironmentID, "--workspace", ws, "--exclude", "*.log",
		"--gateway", g.addr, "--data-dir", g.dataDir).CombinedOutput(); err == nil || !strings.Contains(string(out), "profile's sync rules") {
		t.Fatalf("sync plan ENV with --exclude: %v %s", err, out)
	}
	if out, err := exec.Command(openclawBin, "sync", "plan", v.Placement.EnvironmentID, "--workspace", ws, "--box-dir", "relative/dir",
		"--gateway", g.addr, "--data-dir", g.dataDir).CombinedOutput(); err == nil || !strings.Contains(string(out), "dir") {
		t.Fatalf("sync plan with a relative --box-dir: %v %s", err, out)
	}

	g.pullback(id)
	v = g.mustRest(id, placement.Local)
	anchor := v.Placement.AnchorDir
	ses, err := g.client.Session(g.ctx(), id)
	if err != nil {
		t.Fatal(err)
	}
	if ses.Workspace != anchor || anchor == ws || ses.Placement != sessions.PlacementLocal {
		t.Fatalf("after pull-back: session workspace %q placement %s, anchor %q, user dir %q", ses.Workspace, ses.Placement, anchor, ws)
	}
	// the worker's results are in the anchor
	if got := readFile(t, filepath.Join(anchor, "README.md")); got != "hello from the worker\n" {
		t.Fatalf("anchor README.md %q", got)
	}
	if got := readFile(t, filepath.Join(anchor, "untracked.txt")); got != "new on the worker\n" {
		t.Fatalf("anchor untracked.txt %q", got)
	}
	if got := strings.TrimSpace(readFile(t, filepath.Join(anchor, "where.txt"))); got != box {
		t.Fatalf("the worker's command ran in %q, want the box workspace %q", got, box)
	}
	if git {
		branch := "openclaw/" + strings.TrimPrefix(id, "ses_")
		if got := testenv.Git(t, anchor, "rev-parse", "--abbrev-ref", "HEAD"); got != branch {
			t.Fatalf("anchor is on %q, want %s", got, branch)
		}
		if got := testenv.Git(t, ws, "log", "-1", "--format=%s", branch); got != "worker edit" {
			t.Fatalf("managed branch %s tip %q, want the worker's commit", branch, got)
		}
		if got := testenv.Git(t, ws, "rev-parse", branch+"~1"); got != head {
			t.Fatalf("managed branch parent %s, want the base %s", got, head)
		}
		if st := testenv.Git(t, anchor, "status", "--porcelain"); !strings.Contains(st, "?? untracked.txt") || strings.Contains(st, "README.md") || strings.Contains(st, "lib") {
			t.Fatalf("anchor status:\n%s", st)
		}
		if got := readFile(t, filepath.Join(anchor, "lib", "lib.go")); got != "package lib\n" {
			t.Fatalf("anchor's submodule lib.go %q", got)
		}
		// the user's checkout is untouched
		if got := testenv.Git(t, ws, "rev-parse", "HEAD"); got != head {
			t.Fatalf("user's HEAD moved: %s → %s", head, got)
		}
		if got := testenv.Git(t, ws, "rev-parse", "--abbrev-ref", "HEAD"); got != "main" {
			t.Fatalf("user's checkout is on %q", got)
		}
		if st := testenv.Git(t, ws, "status", "--porcelain"); st != "" {
			t.Fatalf("user's checkout changed:\n%s", st)
		}
	}
	if got := readFile(t, filepath.Join(ws, "README.md")); got != "hello\n" {
		t.Fatalf("user's README.md %q", got)
	}
	for _, f := range []string{"untracked.txt", "where.txt", "local-where.txt"} {
		if exists(filepath.Join(ws, f)) {
			t.Fatalf("%s written into the user's directory", f)
		}
	}

	// a later local turn runs in the pulled-back workspace
	g.runTurn(id, "check locally", "local")
	if got := strings.TrimSpace(readFile(t, filepath.Join(anchor, "local-where.txt"))); got != anchor {
		t.Fatalf("local turn ran in %q, want %q", got, anchor)
	}
	checkOneOwner(t, g, id, msgs, finals)
}

// localHelloScript prefixes dispatchScript with one local turn, for an existing session.
func localHelloScript() string {
	return `[{"text": "Local hello turn done."},` + strings.TrimPrefix(dispatchScript, "[")
}

func dispatchModels(t *testing.T, root string) string {
	return scriptedModels(t, root, map[string]string{"fresh": dispatchScript, "existing": localHelloScript(), "slow": slowScript})
}

// TestDispatchAndPullBackLocalBox: new worker sessions and dispatched local sessions, with a git
// and a plain workspace, on the local box: the worker's commit, edits and new files come back to
// the session's anchor (managed branch fast-forwarded), the user's own directory is untouched, and
// the next turn runs locally in the anchor.
func TestDispatchAndPullBackLocalBox(t *testing.T) {
	testenv.RequireCommands(t, "git")
	root := t.TempDir()
	g := startGateway(t, filepath.Join(root, "data"), fastWorkerConfig+dispatchModels(t, root))
	t.Cleanup(func() { destroyAll(g) })
	for _, c := range []struct {
		name       string
		git, fresh bool
	}{{"git-new", true, true}, {"plain-new", false, true}, {"git-dispatch", true, false}, {"plain-dispatch", false, false}} {
		t.Run(c.name, func(t *testing.T) {
			outer := g.t
			g.t = t
			defer func() { g.t = outer }()
			dispatchCase(t, g, filepath.Join(root, c.name), "local", c.git, c.fresh)
		})
	}
}

// TestDispatchAndPullBackNetns: the same against OpenSSH sshd in a network namespace, git workspace.
func TestDispatchAndPullBackNetns(t *testing.T) {
	testenv.RequireCommands(t, "git")
	profiles, _ := netnsProfile(t)
	root := t.TempDir()
	if err := os.Chmod(root, 0o755); err != nil {
		t.Fatal(err)
	}
	g := startGateway(t, filepath.Join(root, "data"), fastWorkerConfig+dispatchModels(t, root)+profiles)
	t.Cleanup(func() { destroyAll(g) })
	for _, c := range []struct {
		name       string
		git, fresh bool
	}{{"git-new", true, true}, {"git-dispatch", true, false}} {
		t.Run(c.name, func(t *testing.T) {
			outer := g.t
			g.t = t
			defer func() { g.t = outer }()
			dispatchCase(t, g, filepath.Join(root, c.name), "netns", c.git, c.fresh)
		})
	}
}

// stopNetnsLeases stops every lease lease-netns still holds in state (cleanup after a failure).
func stopNetnsLeases(state string) {
	out, err := exec.Command(leaseNetnsBin, "--state-dir", state, "list", "--json").Output()
	if err != nil {
		return
	}
	var list []struct {
		ID string `json:"id"`
	}
	_ = json.Unmarshal(out, &list)
	for _, l := range list {
		_ = exec.Command(leaseNetnsBin, "--state-dir", state, "stop", l.ID).Run()
	}
}

// destroyAll destroys every live environment of the gateway (if it still runs), so box processes
// do not outlive the test.
func destroyAll(g *gw) {
	if g.cmd.ProcessState != nil {
		return
	}
	list, err := g.client.Environments(g.ctx(), false)
	if err != nil {
		return
	}
	for _, e := range list {
		if !e.State.Dead() {
			_, _ = g.destroy(e.ID, true, 30*time.Second)
		}
	}
}

// stepOrder ranks placement states along dispatch and pull-back.
var stepOrder = map[placement.State]int{placement.Local: 0, placement.Requested: 1, placement.Provisioning: 2, placement.Syncing: 3,
	placement.Starting: 4, placement.Active: 5, placement.Draining: 6, placement.Reconciling: 7}

// killAt polls the placement until it reaches step (or passed it), SIGKILLs the gateway and
// returns the last state observed before the kill.
func (g *gw) killAt(id string, step placement.State) placement.State {
	g.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		st := g.placement(id).Placement.State
		if stepOrder[st] >= stepOrder[step] || st == placement.Failed || st == placement.Local && stepOrder[step] > stepOrder[placement.Active] {
			g.kill()
			return st
		}
		if time.Now().After(deadline) {
			g.t.Fatalf("placement of %s never reached %s (at %s)", id, step, st)
		}
	}
}

// restart starts the killed gateway again, owned by the test owner (its cleanup ends it when that
// test ends, not when the current subtest does).
func (g *gw) restart(owner *testing.T) {
	cur := g.t
	g.t = owner
	defer func() { g.t = cur }()
	g.start()
}

// restResumed waits for a resumed placement to rest in want; failed is accepted only with a
// recovery action in placement.error, and then reported as false.
func (g *gw) restResumed(id string, want placement.State) bool {
	g.t.Helper()
	v := g.waitPlacement(id)
	switch {
	case v.Placement.State == want:
		return true
	case v.Placement.State == placement.Failed && strings.Contains(v.Placement.Error, "recovery"):
		g.t.Logf("ended failed with a recovery action: %s", v.Placement.Error)
		return false
	}
	g.t.Fatalf("session %s: placement %s after restart, want %s (or failed with a recovery action):\n%s", id, v.Placement.State, want, v)
	return false
}

// TestGatewayKilledAtEachPlacementStep: the gateway is SIGKILLed at each dispatch and pull-back step
// in turn and restarted; the move completes, the transcript is intact and every turn ran once.
func TestGatewayKilledAtEachPlacementStep(t *testing.T) {
	testenv.RequireCommands(t, "git")
	root := t.TempDir()
	g := startGateway(t, filepath.Join(root, "data"), fastWorkerConfig+dispatchModels(t, root))
	t.Cleanup(func() { destroyAll(g) })
	g.waitReady(g.createEnv("local").ID) // a warm box, so every step is quick and on the same box
	for _, step := range []placement.State{placement.Requested, placement.Provisioning, placement.Syncing, placement.Starting,
		placement.Draining, placement.Reconciling} {
		t.Run(string(step), func(t *testing.T) {
			outer := g.t
			g.t = t
			defer func() { g.t = outer }()
			ws := filepath.Join(root, string(step))
			userWorkspace(t, ws, true)
			head := testenv.Git(t, ws, "rev-parse", "HEAD")
			id := g.newSession(ws, "fresh/m")
			g.dispatchTo(id, "local")
			if stepOrder[step] < stepOrder[placement.Active] {
				t.Logf("dispatch: killed at %s (aimed at %s)", g.killAt(id, step), step)
				g.restart(outer)
				if !g.restResumed(id, placement.Active) {
					return
				}
			} else {
				g.mustRest(id, placement.Active)
			}
			g.runTurn(id, "edit, commit and run", "worker")
			g.pullback(id)
			if stepOrder[step] > stepOrder[placement.Active] {
				t.Logf("pull-back: killed at %s (aimed at %s)", g.killAt(id, step), step)
				g.restart(outer)
				if !g.restResumed(id, placement.Local) {
					checkOneOwner(t, g, id, []int{workerTurnMsgs}, []string{"Worker turn done."})
					return
				}
			} else {
				g.mustRest(id, placement.Local)
			}
			anchor := g.placement(id).Placement.AnchorDir
			if got := testenv.Git(t, ws, "log", "-1", "--format=%s", "openclaw/"+strings.TrimPrefix(id, "ses_")); got != "worker edit" {
				t.Fatalf("managed branch tip %q", got)
			}
			if got := testenv.Git(t, ws, "rev-parse", "HEAD"); got != head || readFile(t, filepath.Join(ws, "README.md")) != "hello\n" {
				t.Fatalf("user's checkout changed")
			}
			if !exists(filepath.Join(anchor, "untracked.txt")) {
				t.Fatalf("untracked file not brought back")
			}
			g.runTurn(id, "check locally", "local")
			checkOneOwner(t, g, id, []int{workerTurnMsgs, localTurnMsgs}, []string{"Worker turn done.", "Local turn done."})
		})
	}
}

// TestMessageWhilePlacementMoves: messages sent while the placement is requested … starting or
// draining … reconciling are refused with 409; no message is ever run by two loops.
func TestMessageWhilePlacementMoves(t *testing.T) {
	testenv.RequireCommands(t, "git")
	root := t.TempDir()
	g := startGateway(t, filepath.Join(root, "data"), fastWorkerConfig+dispatchModels(t, root))
	t.Cleanup(func() { destroyAll(g) })
	ws := filepath.Join(root, "user")
	userWorkspace(t, ws, true)
	id := g.newSession(ws, "slow/m")
	g.dispatchTo(id, "local")
	seen := map[placement.State]bool{}
	var workerTurn turns.Turn
	deadline := time.Now().Add(40 * time.Second)
	for workerTurn.RunID == "" {
		st := g.placement(id).Placement.State
		turn, code, err := g.send(id, "run slowly")
		switch {
		case err == nil:
			// admitted: only once the placement is active, and then on the worker
			if turn.Placement != "worker" {
				t.Fatalf("message admitted on %s while dispatching (placement was %s)", turn.Placement, st)
			}
			workerTurn = turn
		case code == 409 && strings.Contains(err.Error(), "moving between the gateway and a worker"):
			seen[st] = true
		default:
			t.Fatalf("message during dispatch (placement %s): %d %v", st, code, err)
		}
		if time.Now().After(deadline) {
			t.Fatal("the session never became active")
		}
	}
	t.Logf("refused during dispatch in states %v", seen)
	if !seen[placement.Requested] && !seen[placement.Provisioning] && !seen[placement.Syncing] && !seen[placement.Starting] {
		t.Fatalf("no message was sent while the dispatch moved (states seen: %v)", seen)
	}
	// pull back while the slow worker turn runs: draining waits for it; messages are refused
	g.pullback(id)
	if st := g.placement(id).Placement.State; st != placement.Draining {
		t.Fatalf("placement %s right after pull-back with a turn in flight, want draining", st)
	}
	refusals := 0
	var localTurn turns.Turn // a message that reached the session just after the pull-back ended
	for localTurn.RunID == "" {
		v := g.placement(id)
		if v.Placement.State != placement.Draining && v.Placement.State != placement.Reconciling {
			break
		}
		turn, code, err := g.send(id, "now locally")
		if err == nil {
			// admitted: only if the pull-back ended between the read above and the send, and then
			// on the gateway
			if st := g.placement(id).Placement.State; turn.Placement != "local" || st != placement.Local {
				t.Fatalf("message admitted while the placement moves: turn %s on %s (placement now %s)", turn.RunID, turn.Placement, st)
			}
			localTurn = turn
			break
		}
		if code != 409 || !(strings.Contains(err.Error(), "moving between the gateway and a worker") || strings.Contains(err.Error(), "turn in progress")) {
			t.Fatalf("message while moving: %d %v, want 409 with the placement-moving error", code, err)
		}
		refusals++
		if time.Now().After(deadline) {
			t.Fatalf("pull-back does not end:\n%s", v)
		}
		time.Sleep(50 * time.Millisecond) // pacing the messages
	}
	if refusals == 0 {
		t.Fatal("no message was sent while draining")
	}
	g.mustRest(id, placement.Local)
	if wt := waitTurn(t, g, workerTurn.RunID); wt.Status != turns.TurnDone {
		t.Fatalf("worker turn %s: %s", wt.Status, wt.Error)
	}
	if got := readFile(t, filepath.Join(g.placement(id).Placement.AnchorDir, "slept.txt")); got != "slept\n" {
		t.Fatalf("slept.txt %q", got)
	}
	if localTurn.RunID == "" {
		g.runTurn(id, "now locally", "local")
	} else if lt := waitTurn(t, g, localTurn.RunID); lt.Status != turns.TurnDone {
		t.Fatalf("local turn %s: %s", lt.Status, lt.Error)
	}
	checkOneOwner(t, g, id, []int{2, 1}, []string{"Slow turn done.", "Local turn done."})
}

// TestIdleTimeoutSparesBusySessions: with idleTimeout 1s, an idle environment is destroyed by the
// lifecycle policy while the environment of a session running a turn stays; once that session is
// pulled back its environment is idle and is stopped too.
func TestIdleTimeoutSparesBusySessions(t *testing.T) {
	testenv.RequireCommands(t, "git")
	root := t.TempDir()
	cfg := fastWorkerConfig + "lifecycleInterval: 200ms\n" + dispatchModels(t, root) +
		"profiles:\n  - id: idle\n    provider: local\n    hygiene: {metadataRoute: warn, dockerSocket: warn}\n    lifetime: {idleTimeout: 1s}\n"
	g := startGateway(t, filepath.Join(root, "data"), cfg)
	t.Cleanup(func() { destroyAll(g) })
	ws := filepath.Join(root, "user")
	userWorkspace(t, ws, true)
	id, busyEnv := g.activeSession(ws, "slow/m", "idle")
	turn, code, err := g.send(id, "work slowly")
	if err != nil {
		t.Fatalf("send: %d %v", code, err)
	}
	idle := g.createEnv("idle")
	idle = g.waitEnv(idle.ID, func(e envs.Environment) bool { return e.State.Dead() })
	if idle.State != envs.Destroyed || g.countNotes(idle.ID, "lifecycle: idle") != 1 {
		t.Fatalf("idle environment %s (%s), lifecycle notes %d", idle.State, idle.Error, g.countNotes(idle.ID, "lifecycle: idle"))
	}
	// the idle environment lived more than a second and was stopped; the busy one is untouched
	v, err := g.client.Environment(g.ctx(), busyEnv)
	if err != nil {
		t.Fatal(err)
	}
	if e := v.Environment; e.State != envs.Attached || g.countNotes(busyEnv, "lifecycle:") != 0 {
		t.Fatalf("environment of the session in a turn: %s, lifecycle notes %d", e.State, g.countNotes(busyEnv, "lifecycle:"))
	}
	if tr := waitTurn(t, g, turn.RunID); tr.Status != turns.TurnDone {
		t.Fatalf("turn %s: %s (the busy environment was stopped under it?)", tr.Status, tr.Error)
	}
	g.pullback(id)
	g.mustRest(id, placement.Local)
	e := g.waitEnv(busyEnv, func(e envs.Environment) bool { return e.State.Dead() })
	if e.State != envs.Destroyed || g.countNotes(busyEnv, "lifecycle: idle") != 1 {
		t.Fatalf("pulled-back environment %s, lifecycle notes %d", e.State, g.countNotes(busyEnv, "lifecycle: idle"))
	}
}

// deleteScript is a worker turn that deletes three of the workspace's four files.
const deleteScript = `[
  {"toolCalls": [{"name": "exec", "arguments": {"command": "rm a.txt b.txt c.txt"}}]},
  {"text": "Deleted."}
]`

// TestPullBackDeletionBrake: a pull-back that would delete most of a plain workspace stops, names
// the count, changes nothing in the anchor and says how to confirm; `openclaw session pullback
// --force` then applies the deletions and brings the session home.
func TestPullBackDeletionBrake(t *testing.T) {
	root := t.TempDir()
	g := startGateway(t, filepath.Join(root, "data"), fastWorkerConfig+scriptedModels(t, root, map[string]string{"del": deleteScript}))
	t.Cleanup(func() { destroyAll(g) })
	ws := filepath.Join(root, "user")
	userWorkspace(t, ws, false)
	for _, f := range []string{"a.txt", "b.txt", "c.txt"} {
		if err := os.WriteFile(filepath.Join(ws, f), []byte(f+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	id, _ := g.activeSession(ws, "del/m", "local")
	g.runTurn(id, "delete them", "worker")

	g.pullback(id)
	v := g.mustRest(id, placement.Failed)
	anchor := v.Placement.AnchorDir
	if !strings.Contains(v.Placement.Error, "deleted 3 of 4 files") || !strings.Contains(v.Placement.Error, "--force") {
		t.Fatalf("failed pull-back error %q: want the count and the --force recovery", v.Placement.Error)
	}
	for _, f := range []string{"a.txt", "b.txt", "c.txt", "README.md"} {
		if !exists(filepath.Join(anchor, f)) {
			t.Fatalf("the refused pull-back deleted %s from the anchor", f)
		}
	}

	out, err := exec.Command(openclawBin, "session", "pullback", id, "--force", "--gateway", g.addr, "--data-dir", g.dataDir).CombinedOutput()
	if err != nil {
		t.Fatalf("session pullback --force: %v\n%s", err, out)
	}
	v = g.mustRest(id, placement.Local)
	for _, f := range []string{"a.txt", "b.txt", "c.txt"} {
		if exists(filepath.Join(anchor, f)) {
			t.Fatalf("%s still in the anchor after pullback --force", f)
		}
	}
	if got := readFile(t, filepath.Join(anchor, "README.md")); got != "hello\n" {
		t.Fatalf("README.md %q", got)
	}
	if exists(filepath.Join(ws, "gone")) || !exists(filepath.Join(ws, "a.txt")) {
		t.Fatal("the user's own directory changed")
	}
}

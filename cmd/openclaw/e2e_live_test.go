package main_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/openclaw/cloudworkers/gateway/envs"
	"github.com/openclaw/cloudworkers/gateway/placement"
	"github.com/openclaw/cloudworkers/gateway/sessions"
	"github.com/openclaw/cloudworkers/gateway/turns"
	"github.com/openclaw/cloudworkers/internal/testrig/testenv"
	"github.com/openclaw/cloudworkers/protocol"
)

// liveTurn is one turn of liveScript: a command long enough to move the session while it runs
// (it appends to ran-1.txt), a second one that reads what the first left (it appends ran-1.txt
// to ran-2.txt), then the answer. A turn that ran a step twice, or ran its second step without
// the first's work, leaves other line counts.
const liveTurn = `{"toolCalls": [{"name": "exec", "arguments": {"command": "sleep 1.5; echo step >> ran-1.txt", "timeout": 60}}]},
  {"toolCalls": [{"name": "exec", "arguments": {"command": "cat ran-1.txt >> ran-2.txt", "timeout": 60}}]},
  {"text": "Live turn done."}`

var liveScript = "[\n  " + strings.Repeat(liveTurn+",\n  ", 3) + liveTurn + "\n]"

// liveFeed collects a session's live events as a watching client sees them.
type liveFeed struct {
	mu   sync.Mutex
	recs []sessions.LiveRecord
	stop context.CancelFunc
	done chan struct{}
}

func (g *gw) watchLive(id string) *liveFeed {
	g.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	s, err := g.client.StreamSession(ctx, id, 0)
	if err != nil {
		cancel()
		g.t.Fatal(err)
	}
	f := &liveFeed{stop: cancel, done: make(chan struct{})}
	go func() {
		defer close(f.done)
		defer s.Close()
		for {
			m, err := s.Next(ctx)
			if err != nil {
				return
			}
			if m.LiveRecord != nil {
				f.mu.Lock()
				f.recs = append(f.recs, *m.LiveRecord)
				f.mu.Unlock()
			}
		}
	}()
	g.t.Cleanup(f.close)
	return f
}

func (f *liveFeed) close() { f.stop(); <-f.done }

// lifecycle returns the lifecycle events of run as seen, and checks that every cursor the client
// saw is above the one before.
func (f *liveFeed) lifecycle(t *testing.T, runID string) []protocol.LiveEventType {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []protocol.LiveEventType
	var last uint64
	for _, r := range f.recs {
		if r.Cursor <= last {
			t.Fatalf("live cursor %d after %d: the feed went back", r.Cursor, last)
		}
		last = r.Cursor
		if r.RunID == runID && r.Event.Type.Lifecycle() {
			out = append(out, r.Event.Type)
		}
	}
	return out
}

// waitLifecycle waits until the client has seen run's lifecycle events end with want.
func (f *liveFeed) waitLifecycle(t *testing.T, runID string, want protocol.LiveEventType) []protocol.LiveEventType {
	t.Helper()
	var got []protocol.LiveEventType
	waitUntil(t, 30*time.Second, func() string { return fmt.Sprintf("the client saw %v of run %s", got, runID) }, func() bool {
		got = f.lifecycle(t, runID)
		return len(got) > 0 && got[len(got)-1] == want
	})
	return got
}

// inCommand waits until the session's newest turn is in its first command: its message and the
// model's tool call are committed (n entries before them).
func (g *gw) inCommand(id string, n int) {
	g.t.Helper()
	waitUntil(g.t, 30*time.Second, func() string { r, _ := g.roles(id); return fmt.Sprintf("transcript %v", r) }, func() bool {
		r, _ := g.roles(id)
		return len(r) == n+2 && r[n] == protocol.RoleUser && r[n+1] == protocol.RoleAssistant
	})
}

// checkLiveTranscript checks a transcript of turns liveScript turns, each moved once: per turn
// one user message, the model's three answers and two tool results, each tool call answered
// exactly once.
func (g *gw) checkLiveTranscript(id string, n int) {
	g.t.Helper()
	roles, _ := g.roles(id)
	want := slices.Repeat([]string{protocol.RoleUser, protocol.RoleAssistant, protocol.RoleToolResult, protocol.RoleAssistant, protocol.RoleToolResult, protocol.RoleAssistant}, n)
	if !slices.Equal(roles, want) {
		g.t.Fatalf("transcript roles %v, want %v", roles, want)
	}
	tr, err := g.client.Transcript(g.ctx(), id)
	if err != nil {
		g.t.Fatal(err)
	}
	results := map[string]int{}
	for _, e := range tr.Entries {
		if e.Type != sessions.EntryMessage {
			continue
		}
		var m protocol.Message
		if err := json.Unmarshal(e.Content, &m); err != nil {
			g.t.Fatal(err)
		}
		if m.Role == protocol.RoleToolResult {
			results[m.ToolCallID]++
		}
	}
	if len(results) != 2*n {
		g.t.Fatalf("tool results for %d calls, want %d: %v", len(results), 2*n, results)
	}
	for call, k := range results {
		if k != 1 {
			g.t.Fatalf("tool call %s answered %d times", call, k)
		}
	}
}

// TestLiveMove: a session moves while its turn runs (session move --live), gateway → worker,
// worker → a worker of another profile, and worker → gateway. Each time the turn stops at its
// next model call, the move runs, and the same turn (one run id, one row) goes on on the new
// owner without new input and ends done there. Every command ran once and in order (the line
// counts of ran-1.txt and ran-2.txt), the transcript holds each message once and each tool call's
// result once, and a watching client saw one turn: start, yield, resume, end, on a feed whose
// cursor only rises.
func TestLiveMove(t *testing.T) {
	root := t.TempDir()
	g := startGateway(t, filepath.Join(root, "data"), fastWorkerConfig+scriptedModels(t, root, map[string]string{"live": liveScript})+
		"profiles:\n  - id: other\n    provider: local\n    hygiene: {metadataRoute: warn, dockerSocket: warn}\n")
	t.Cleanup(func() { destroyAll(g) })
	g.waitReady(g.createEnv("local").ID) // a warm box: the moves are quick
	ws := filepath.Join(root, "user")
	userWorkspace(t, ws, false)
	id := g.newSession(ws, "live/m")
	feed := g.watchLive(id)

	move := func(n int, to string, wantPlacement string) turns.Turn {
		t.Helper()
		turn := g.startTurn(id, fmt.Sprintf("live turn %d", n+1))
		g.inCommand(id, 6*n)
		if out, stderr, err := g.cli("session", "move", id, "--to", to, "--live"); err != nil {
			t.Fatalf("session move --to %s --live: %v\n%s%s", to, err, out, stderr)
		}
		got := waitTurn(t, g, turn.RunID)
		if got.Status != turns.TurnDone || got.Placement != wantPlacement {
			t.Fatalf("turn %d after the live move to %s: %s on %s (%s), want done on %s", n+1, to, got.Status, got.Placement, got.Error, wantPlacement)
		}
		if lc := feed.waitLifecycle(t, turn.RunID, protocol.LiveLifecycleEnd); !slices.Equal(lc, []protocol.LiveEventType{
			protocol.LiveLifecycleStart, protocol.LiveLifecycleYield, protocol.LiveLifecycleResume, protocol.LiveLifecycleEnd}) {
			t.Fatalf("the client saw %v of turn %d, want one turn that moved once", lc, n+1)
		}
		if ts := g.turns(id); len(ts) != n+1 {
			t.Fatalf("%d turn rows after %d live moves, want one per message: %+v", len(ts), n+1, ts)
		}
		g.checkLiveTranscript(id, n+1)
		return got
	}

	move(0, "worker:local", "worker")
	v := g.mustRest(id, placement.Active)
	timelineHas(t, v, "before the dispatch: the running turn stopped at a model-call boundary")
	first := v.Placement.EnvironmentID

	move(1, "worker:other", "worker")
	v = g.mustRest(id, placement.Active)
	if v.Placement.EnvironmentID == first || v.Placement.ProfileID != "other" {
		t.Fatalf("after the move to profile other: environment %s of profile %s (was %s)", v.Placement.EnvironmentID, v.Placement.ProfileID, first)
	}
	timelineHas(t, v, "barrier step 2: the running turn stopped at a model-call boundary", "dispatch to profile other")

	move(2, "gateway", "local")
	v = g.mustRest(id, placement.Local)
	if got := readFile(t, filepath.Join(v.Placement.AnchorDir, "ran-1.txt")); got != strings.Repeat("step\n", 3) {
		t.Fatalf("ran-1.txt %q: the first command of each turn ran other than once", got)
	}
	// ran-2.txt gets ran-1.txt's 1, 2 and 3 lines: each second command ran once, after its first
	if got := readFile(t, filepath.Join(v.Placement.AnchorDir, "ran-2.txt")); got != strings.Repeat("step\n", 6) {
		t.Fatalf("ran-2.txt %q: a second command ran other than once, or before its first", got)
	}

	t.Run("refused before anything moves", func(t *testing.T) {
		outer := g.t
		g.t = t
		defer func() { g.t = outer }()
		before := len(g.placement(id).Events)
		for _, args := range [][]string{
			{"--to", "worker"}, {"--to", "elsewhere"}, {"--to", "gateway", "--live", "--busy", "cancel"}, {"--to", "worker:nosuch", "--live"}, {"--to", "gateway", "--class", "big"},
		} {
			if out, stderr, err := g.cli(append([]string{"session", "move", id}, args...)...); err == nil {
				t.Fatalf("session move %v: accepted (%s%s)", args, out, stderr)
			}
		}
		if code, e := g.postRaw("/api/v1/sessions/"+id+"/move", `{"to":"worker","profileId":"local","busy":"cancel","live":true}`); code != 400 || e.Field != "live" {
			t.Fatalf("move with busy cancel and live: %d %+v, want 400 naming live", code, e)
		}
		if after := len(g.placement(id).Events); after != before {
			t.Fatalf("a refused move left %d placement events", after-before)
		}
	})
}

// TestGatewayKilledDuringALiveMove: the gateway is SIGKILLed at each step of a live dispatch
// (the move recorded, the box leasing, the workspace syncing, the worker starting), with the turn
// stopped between owners. Restarted, it resumes the dispatch, and the same turn goes on on the
// worker and ends done: nothing of it ran twice, the transcript holds each entry once.
func TestGatewayKilledDuringALiveMove(t *testing.T) {
	root := t.TempDir()
	g := startGateway(t, filepath.Join(root, "data"), fastWorkerConfig+scriptedModels(t, root, map[string]string{"live": liveScript}))
	t.Cleanup(func() { destroyAll(g) })
	for _, aim := range []placement.State{placement.Requested, placement.Provisioning, placement.Syncing, placement.Starting} {
		t.Run(string(aim), func(t *testing.T) {
			outer := g.t
			g.t = t
			defer func() { g.t = outer }()
			ws := filepath.Join(root, string(aim))
			userWorkspace(t, ws, false)
			id := g.newSession(ws, "live/m") // no warm box: each dispatch leases one
			turn := g.startTurn(id, "live turn 1")
			g.inCommand(id, 0)
			if !g.killDuringLiveMove(outer, id, turn, placement.MoveRequest{To: "worker", ProfileID: "local", Live: true}, aim, placement.Active, "worker") {
				return
			}
			g.checkLiveTranscript(id, 1)
			if _, err := os.Stat(filepath.Join(ws, "ran-2.txt")); err == nil {
				t.Fatal("the second command ran in the user's directory: the turn went on on the gateway")
			}
		})
	}
}

// TestLiveMoveAcrossATunnelCut: against real OpenSSH sshd in a network namespace, the link to the
// box is cut while its turn runs a command, and the session is moved live to the gateway during
// the cut. Once the link is back, the run reaches its next model call, stops there, and the same
// turn goes on on the gateway and ends done: each command ran once, the transcript holds each
// entry once.
func TestLiveMoveAcrossATunnelCut(t *testing.T) {
	profiles, state := netnsProfile(t)
	root := t.TempDir()
	if err := os.Chmod(root, 0o755); err != nil {
		t.Fatal(err)
	}
	script := strings.Replace(liveScript, "sleep 1.5", "sleep 3", 1)
	g := startGateway(t, filepath.Join(root, "data"), fastWorkerConfig+scriptedModels(t, root, map[string]string{"live": script})+profiles)
	t.Cleanup(func() { destroyAll(g) })
	ws := filepath.Join(root, "user")
	userWorkspace(t, ws, false)
	id, envID := g.activeSession(ws, "live/m", "netns")
	e, err := g.getEnv(envID)
	if err != nil {
		t.Fatal(err)
	}
	link := func(dir string) {
		if out, err := exec.Command(leaseNetnsBin, "--state-dir", state, "link", "--id", e.LeaseID, dir).CombinedOutput(); err != nil {
			t.Fatalf("link %s: %v %s", dir, err, out)
		}
	}
	turn := g.startTurn(id, "live turn 1")
	g.inCommand(id, 0)
	link("down")
	t.Cleanup(func() { _ = exec.Command(leaseNetnsBin, "--state-dir", state, "link", "--id", e.LeaseID, "up").Run() })
	g.waitEnv(envID, func(e envs.Environment) bool { return e.TunnelStatus == "reconnecting" })
	if _, err := g.client.Move(g.ctx(), id, placement.MoveRequest{To: "gateway", Live: true}); err != nil {
		t.Fatalf("live move during the cut: %v", err)
	}
	link("up")
	got := waitTurn(t, g, turn.RunID)
	if got.Status != turns.TurnDone || got.Placement != "local" {
		t.Fatalf("the turn moved live across the cut: %s on %s (%s), want done on the gateway", got.Status, got.Placement, got.Error)
	}
	v := g.mustRest(id, placement.Local)
	g.checkLiveTranscript(id, 1)
	if got := readFile(t, filepath.Join(v.Placement.AnchorDir, "ran-2.txt")); got != "step\n" {
		t.Fatalf("ran-2.txt %q: the turn's commands ran other than once each, in order", got)
	}
}

// TestLiveMoveWhenTheWorkerDies: the worker is SIGKILLed while its turn runs a command and a live
// move to the gateway waits for the turn's next model call. The relaunched worker no longer has
// the run: the turn fails, saying so and what to do, the move goes on and rests on the gateway
// with the transcript as far as it was committed, nothing the dead run started is left on the box,
// and the next message runs on the gateway.
func TestLiveMoveWhenTheWorkerDies(t *testing.T) {
	testenv.RequireCommands(t, "git")
	root := t.TempDir()
	script := `[{"toolCalls": [{"name": "exec", "arguments": {"command": "exec sleep 7751", "timeout": 600}}]},
	            {"text": "Carried on at home."}]`
	g := startGateway(t, filepath.Join(root, "data"), fastWorkerConfig+scriptedModels(t, root, map[string]string{"die": script}))
	t.Cleanup(func() { destroyAll(g) })
	t.Cleanup(func() {
		for _, p := range boxProcess("sleep", "7751") {
			if proc, err := os.FindProcess(p); err == nil {
				_ = proc.Kill()
			}
		}
	})
	ws := filepath.Join(root, "user")
	userWorkspace(t, ws, true)
	id, envID := g.activeSession(ws, "die/m", "local")
	turn := g.startTurn(id, "start and hang")
	g.inCommand(id, 0)
	if _, err := g.client.Move(g.ctx(), id, placement.MoveRequest{To: "gateway", Live: true}); err != nil {
		t.Fatalf("live move: %v", err)
	}
	e, err := g.getEnv(envID)
	if err != nil {
		t.Fatal(err)
	}
	g.killWorker(e, workerPID(t, e))
	got := waitTurn(t, g, turn.RunID)
	if got.Status != turns.TurnFailed || !strings.Contains(got.Error, "lost its run") || !strings.Contains(got.Error, "send the message again") {
		t.Fatalf("the turn whose worker died: %s (%s), want failed, saying the run was lost and what to do", got.Status, got.Error)
	}
	g.mustRest(id, placement.Local)
	if roles, _ := g.roles(id); !slices.Equal(roles, []string{protocol.RoleUser, protocol.RoleAssistant}) {
		t.Fatalf("transcript %v, want the message and the model's call, once each", roles)
	}
	waitUntil(t, 30*time.Second, func() string {
		return fmt.Sprintf("the dead run's command still runs: %v", boxProcess("sleep", "7751"))
	},
		func() bool { return len(boxProcess("sleep", "7751")) == 0 })
	g.runTurn(id, "carry on", "local")
}

// TestGatewayKilledDuringALivePullBack: the gateway is SIGKILLed while a live pull-back brings a
// worker session home (draining, reconciling), after its turn stopped at a model call (moving).
// Restarted, it resumes the pull-back, and the same turn goes on on the gateway and ends done
// there, each entry once.
func TestGatewayKilledDuringALivePullBack(t *testing.T) {
	root := t.TempDir()
	g := startGateway(t, filepath.Join(root, "data"), fastWorkerConfig+scriptedModels(t, root, map[string]string{"live": liveScript}))
	t.Cleanup(func() { destroyAll(g) })
	for _, aim := range []placement.State{placement.Draining, placement.Reconciling} {
		t.Run(string(aim), func(t *testing.T) {
			outer := g.t
			g.t = t
			defer func() { g.t = outer }()
			ws := filepath.Join(root, string(aim))
			userWorkspace(t, ws, false)
			id, _ := g.activeSession(ws, "live/m", "local")
			turn := g.startTurn(id, "live turn 1")
			g.inCommand(id, 0)
			if !g.killDuringLiveMove(outer, id, turn, placement.MoveRequest{To: "gateway", Live: true}, aim, placement.Local, "local") {
				return
			}
			g.checkLiveTranscript(id, 1)
			if got := readFile(t, filepath.Join(g.placement(id).Placement.AnchorDir, "ran-2.txt")); got != "step\n" {
				t.Fatalf("ran-2.txt %q: a command ran other than once, or out of order", got)
			}
		})
	}
}

// killDuringLiveMove asks for a live move of the session whose turn runs its first command, waits
// for the turn to stop for it (moving), SIGKILLs the gateway once the placement reaches aim and
// restarts it (for owner). The move must rest in rest and the same turn end done on where. A kill that came
// only after the move rested (the turn may already have gone on, and a turn the gateway died in
// ends failed: sent again, never replayed) is logged, and false returned: nothing more to check.
func (g *gw) killDuringLiveMove(owner *testing.T, id string, turn turns.Turn, req placement.MoveRequest, aim, rest placement.State, where string) bool {
	t := g.t
	t.Helper()
	if _, err := g.client.Move(g.ctx(), id, req); err != nil {
		t.Fatalf("live move to %s: %v", req.To, err)
	}
	waitUntil(t, 30*time.Second, func() string { return "the turn never stopped for the move" }, func() bool {
		got, err := g.client.Turn(g.ctx(), turn.RunID)
		return err == nil && got.Status == turns.TurnMoving
	})
	st := g.killAt(id, aim)
	t.Logf("killed at %s (aimed at %s)", st, aim)
	g.restart(owner) // the restarted gateway lives as long as owner, the test that started the first
	if !g.restResumed(id, rest) {
		return false
	}
	got := waitTurn(t, g, turn.RunID)
	if st == rest {
		t.Logf("the move had rested: the turn ended %s", got.Status)
		return false
	}
	if got.Status != turns.TurnDone || got.Placement != where {
		t.Fatalf("killed at %s: the turn after the restart is %s on %s (%s), want done on %s", st, got.Status, got.Placement, got.Error, where)
	}
	return true
}

// TestLiveMoveWhenTheWorkerDiesAfterTheRunStopped: the worker is SIGKILLed once its run stopped
// for a live move to the gateway (the turn moving, the pull-back on its way). The move does not
// need the worker any more: it rests on the gateway with the worker's work, and the same turn goes
// on there and ends done, each command once.
func TestLiveMoveWhenTheWorkerDiesAfterTheRunStopped(t *testing.T) {
	root := t.TempDir()
	g := startGateway(t, filepath.Join(root, "data"), fastWorkerConfig+scriptedModels(t, root, map[string]string{"live": liveScript}))
	t.Cleanup(func() { destroyAll(g) })
	ws := filepath.Join(root, "user")
	userWorkspace(t, ws, false)
	id, envID := g.activeSession(ws, "live/m", "local")
	e, err := g.getEnv(envID)
	if err != nil {
		t.Fatal(err)
	}
	pid := workerPID(t, e)
	turn := g.startTurn(id, "live turn 1")
	g.inCommand(id, 0)
	if _, err := g.client.Move(g.ctx(), id, placement.MoveRequest{To: "gateway", Live: true}); err != nil {
		t.Fatalf("live move: %v", err)
	}
	waitUntil(t, 30*time.Second, func() string { return "the turn never stopped for the move" }, func() bool {
		got, err := g.client.Turn(g.ctx(), turn.RunID)
		return err == nil && got.Status != turns.TurnRunning
	})
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	v := g.mustRest(id, placement.Local)
	if got := waitTurn(t, g, turn.RunID); got.Status != turns.TurnDone || got.Placement != "local" {
		t.Fatalf("the turn after its worker died: %s on %s (%s), want done on the gateway", got.Status, got.Placement, got.Error)
	}
	g.checkLiveTranscript(id, 1)
	if got := readFile(t, filepath.Join(v.Placement.AnchorDir, "ran-2.txt")); got != "step\n" {
		t.Fatalf("ran-2.txt %q: a command ran other than once, or out of order", got)
	}
}

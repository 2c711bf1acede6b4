package main_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/openclaw/cloudworkers/gateway/placement"
	"github.com/openclaw/cloudworkers/gateway/turns"
	"github.com/openclaw/cloudworkers/internal/testrig/testenv"
	"github.com/openclaw/cloudworkers/protocol"
)

// busyScript: every turn runs a command long enough to be moved while it runs (the drain cases
// let it finish: it writes done-N.txt), then ends.
const busyScript = `[
  {"toolCalls": [{"name": "exec", "arguments": {"command": "sleep 1.5; echo 1 > done-1.txt", "timeout": 60}}]},
  {"text": "Busy turn 1 done."},
  {"toolCalls": [{"name": "exec", "arguments": {"command": "sleep 1.5; echo 2 > done-2.txt", "timeout": 60}}]},
  {"text": "Busy turn 2 done."},
  {"toolCalls": [{"name": "exec", "arguments": {"command": "sleep 1.5; echo 3 > done-3.txt", "timeout": 60}}]},
  {"text": "Busy turn 3 done."}
]`

// cancelScript: turns whose command would run for minutes (a cancel stops it). The scripted
// model picks its answer by the number of assistant messages so far, which a cancel leaves
// uneven: every answer is the same command.
var cancelScript = "[" + strings.TrimSuffix(strings.Repeat(`{"toolCalls": [{"name": "exec", "arguments": {"command": "sleep 600", "timeout": 900}}]},`, 6), ",") + "]"

// startTurn sends a message: once it is answered, the turn holds the session.
func (g *gw) startTurn(id, text string) turns.Turn {
	g.t.Helper()
	turn, code, err := g.send(id, text)
	if err != nil || turn.Status != turns.TurnRunning {
		g.t.Fatalf("send to %s: %d %v %+v", id, code, err, turn)
	}
	return turn
}

// timelineHas checks that the placement's events hold each of wants, in order.
func timelineHas(t *testing.T, v placementView, wants ...string) {
	t.Helper()
	i := 0
	for _, e := range v.Events {
		if i < len(wants) && strings.Contains(e.Reason, wants[i]) {
			i++
		}
	}
	if i < len(wants) {
		t.Fatalf("the timeline lacks %q (after the earlier ones):\n%s", wants[i], v)
	}
}

// TestMovingABusySession: a session whose turn runs is dispatched and pulled back by policy.
// drain lets the turn finish (its command's file exists, the turn is done) before the move;
// cancel stops it (the turn is canceled, its command never finished). Each case rests in the
// wanted placement, and the timeline records the barrier's steps 2–5 with what happened.
func TestMovingABusySession(t *testing.T) {
	testenv.RequireCommands(t, "git")
	root := t.TempDir()
	g := startGateway(t, filepath.Join(root, "data"), fastWorkerConfig+scriptedModels(t, root, map[string]string{"busy": busyScript, "stuck": cancelScript}))
	t.Cleanup(func() { destroyAll(g) })
	g.waitReady(g.createEnv("local").ID) // a warm box: the moves are quick

	t.Run("drain", func(t *testing.T) {
		outer := g.t
		g.t = t
		defer func() { g.t = outer }()
		ws := filepath.Join(root, "drain")
		userWorkspace(t, ws, true)
		id := g.newSession(ws, "busy/m")
		local := g.startTurn(id, "work on the gateway")
		if _, err := g.client.Dispatch(g.ctx(), id, placement.DispatchRequest{ProfileID: "local"}); err != nil {
			t.Fatalf("dispatch of a busy session (drain): %v", err)
		}
		if got := waitTurn(t, g, local.RunID); got.Status != turns.TurnDone {
			t.Fatalf("the drained local turn ended %s (%s), want done", got.Status, got.Error)
		}
		if _, err := os.Stat(filepath.Join(ws, "done-1.txt")); err != nil {
			t.Fatalf("the drained turn's command did not finish: %v", err)
		}
		v := g.mustRest(id, placement.Active)
		timelineHas(t, v, "before the dispatch: the running turn ended (drained")

		worker := g.startTurn(id, "work on the worker")
		if _, err := g.client.PullBack(g.ctx(), id, placement.PullBackRequest{}); err != nil {
			t.Fatalf("pull-back of a busy session (drain): %v", err)
		}
		v = g.mustRest(id, placement.Local)
		if got := waitTurn(t, g, worker.RunID); got.Status != turns.TurnDone {
			t.Fatalf("the drained worker turn ended %s (%s), want done", got.Status, got.Error)
		}
		if _, err := os.Stat(filepath.Join(v.Placement.AnchorDir, "done-2.txt")); err != nil {
			t.Fatalf("the drained worker turn's work did not come home: %v", err)
		}
		timelineHas(t, v, "barrier step 2: the running turn ended (drained", "barrier step 3:", "barrier step 4:",
			"barrier step 5: the run's end stops every process", "drained; worker fenced")
	})

	t.Run("cancel", func(t *testing.T) {
		outer := g.t
		g.t = t
		defer func() { g.t = outer }()
		ws := filepath.Join(root, "cancel")
		userWorkspace(t, ws, true)
		id := g.newSession(ws, "stuck/m")
		local := g.startTurn(id, "work on the gateway")
		if _, err := g.client.Dispatch(g.ctx(), id, placement.DispatchRequest{ProfileID: "local", Busy: "cancel"}); err != nil {
			t.Fatalf("dispatch of a busy session (cancel): %v", err)
		}
		if got := waitTurn(t, g, local.RunID); got.Status != turns.TurnCanceled {
			t.Fatalf("the local turn ended %s (%s), want canceled", got.Status, got.Error)
		}
		v := g.mustRest(id, placement.Active)
		timelineHas(t, v, "before the dispatch: the running turn was canceled (policy cancel)")

		worker := g.startTurn(id, "work on the worker")
		if _, err := g.client.PullBack(g.ctx(), id, placement.PullBackRequest{Busy: "cancel"}); err != nil {
			t.Fatalf("pull-back of a busy session (cancel): %v", err)
		}
		v = g.mustRest(id, placement.Local)
		if got := waitTurn(t, g, worker.RunID); got.Status != turns.TurnCanceled {
			t.Fatalf("the worker turn ended %s (%s), want canceled", got.Status, got.Error)
		}
		timelineHas(t, v, "barrier step 2: the running turn was canceled (policy cancel)", "barrier step 5:", "drained; worker fenced")
		if len(boxProcess("sleep", "600")) > 0 {
			t.Fatal("the canceled turn's command still runs")
		}
	})

	t.Run("bad policy", func(t *testing.T) {
		outer := g.t
		g.t = t
		defer func() { g.t = outer }()
		ws := filepath.Join(root, "bad")
		userWorkspace(t, ws, true)
		id := g.newSession(ws, "busy/m")
		code, e := g.postRaw("/api/v1/sessions/"+id+"/dispatch", `{"profileId":"local","busy":"later"}`)
		if code != 400 || e.Field != "busy" {
			t.Fatalf("dispatch with busy \"later\": %d %+v, want 400 naming busy", code, e)
		}
		out, err := exec.Command(openclawBin, "session", "pullback", id, "--busy", "later", "--gateway", g.addr, "--data-dir", g.dataDir).CombinedOutput()
		if err == nil || !strings.Contains(string(out), "--busy") || !strings.Contains(string(out), "drain") {
			t.Fatalf("session pullback --busy later: %v %s, want a refusal naming --busy and its values", err, out)
		}
		if v := g.placement(id); v.Placement.State != placement.Local || len(v.Events) != 0 {
			t.Fatalf("a refused dispatch left a trace:\n%s", v)
		}
	})
}

// TestGatewayKilledDuringABusyPullBack: a pull-back of a session whose worker turn runs loses its
// gateway (SIGKILL) at each of its steps — draining (the turn still running, or being canceled)
// and reconciling — under each policy. Restarted, the gateway resumes the pull-back: it rests at
// home with the worker's committed work, the interrupted turn reads as ended (never running,
// never run twice), the transcript holds its message once, and the next message runs on the
// gateway.
func TestGatewayKilledDuringABusyPullBack(t *testing.T) {
	testenv.RequireCommands(t, "git")
	root := t.TempDir()
	g := startGateway(t, filepath.Join(root, "data"), fastWorkerConfig+scriptedModels(t, root, map[string]string{"busy": busyScript}))
	t.Cleanup(func() { destroyAll(g) })
	for _, tc := range []struct {
		busy string
		aim  placement.State
	}{{"drain", placement.Draining}, {"drain", placement.Reconciling}, {"cancel", placement.Draining}, {"cancel", placement.Reconciling}} {
		t.Run(tc.busy+"/"+string(tc.aim), func(t *testing.T) {
			outer := g.t
			g.t = t
			defer func() { g.t = outer }()
			ws := filepath.Join(root, tc.busy+"-"+string(tc.aim))
			userWorkspace(t, ws, true)
			id, _ := g.activeSession(ws, "busy/m", "local")
			worker := g.startTurn(id, "work on the worker")
			// the turn is in its command: its message and the model's tool call are committed
			waitUntil(t, 30*time.Second, func() string { r, _ := g.roles(id); return fmt.Sprintf("transcript %v", r) }, func() bool {
				r, _ := g.roles(id)
				return strings.Join(r, ",") == protocol.RoleUser+","+protocol.RoleAssistant
			})
			if _, err := g.client.PullBack(g.ctx(), id, placement.PullBackRequest{Busy: tc.busy}); err != nil {
				t.Fatalf("pull-back of a busy session (%s): %v", tc.busy, err)
			}
			st := g.killAt(id, tc.aim)
			t.Logf("killed at %s (aimed at %s)", st, tc.aim)
			g.restart(outer)
			if !g.restResumed(id, placement.Local) {
				return
			}
			if got := waitTurn(t, g, worker.RunID); got.Status == turns.TurnRunning || got.Status == turns.TurnMoving {
				t.Fatalf("the interrupted turn is still %s", got.Status)
			}
			roles, _ := g.roles(id)
			if users := strings.Count(strings.Join(roles, ","), protocol.RoleUser); users != 1 || len(roles) < 2 || roles[1] != protocol.RoleAssistant {
				t.Fatalf("the transcript after the restart: %v, want the turn's message once and the model's call after it", roles)
			}
			g.runTurn(id, "carry on at home", "local")
		})
	}
}

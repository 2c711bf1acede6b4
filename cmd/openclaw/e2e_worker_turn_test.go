package main_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/openclaw/cloudworkers/gateway/placement"
	"github.com/openclaw/cloudworkers/gateway/sessions"
	"github.com/openclaw/cloudworkers/gateway/turns"
	"github.com/openclaw/cloudworkers/protocol"
)

// workerTurnScript writes, reads, edits, patches and execs in the workspace, and reads a missing
// file (a tool error), one tool call per model turn.
const workerTurnScript = `[
  {"text": "Setting up.", "toolCalls": [{"name": "write", "arguments": {"path": "notes.txt", "content": "alpha\nbeta\n"}}]},
  {"toolCalls": [{"name": "read", "arguments": {"path": "notes.txt"}}]},
  {"toolCalls": [{"name": "edit", "arguments": {"path": "notes.txt", "edits": [{"oldText": "alpha", "newText": "ALPHA"}]}}]},
  {"toolCalls": [{"name": "apply_patch", "arguments": {"input": "*** Begin Patch\n*** Add File: added.txt\n+patched\n*** Update File: notes.txt\n@@\n ALPHA\n-beta\n+gamma\n*** End Patch"}}]},
  {"toolCalls": [{"name": "exec", "arguments": {"command": "cat notes.txt added.txt > combined.txt && wc -l < combined.txt"}}]},
  {"toolCalls": [{"name": "read", "arguments": {"path": "missing.txt"}}]},
  {"thinking": "All done.", "text": "Done: notes edited, patched and combined."}
]`

// shapeOf is what must match between placements: roles, content types, tool names, tool results'
// isError and stop reasons, in order (ids, timestamps and paths differ).
func shapeOf(t *testing.T, g *gw, id string) []string {
	t.Helper()
	tr, err := g.client.Transcript(g.ctx(), id)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range tr.Entries {
		var m protocol.Message
		if err := json.Unmarshal(e.Content, &m); err != nil {
			t.Fatal(err)
		}
		s := m.Role + " stop=" + m.StopReason
		for _, c := range m.Content {
			s += " " + c.Type
			if c.Type == protocol.ContentToolCall {
				s += ":" + c.Name
			}
		}
		if m.Role == protocol.RoleToolResult {
			s += " tool=" + m.ToolName
			if m.IsError {
				s += " isError"
			}
		}
		out = append(out, s)
	}
	return out
}

func waitTurn(t *testing.T, g *gw, runID string) turns.Turn {
	t.Helper()
	var turn turns.Turn
	waitUntil(t, 90*time.Second, func() string { return fmt.Sprintf("turn %s still running", runID) }, func() bool {
		var err error
		if turn, err = g.client.Turn(g.ctx(), runID); err != nil {
			t.Fatal(err)
		}
		return turn.Status != turns.TurnRunning && turn.Status != turns.TurnMoving
	})
	return turn
}

func readFiles(t *testing.T, dir string, names ...string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, n := range names {
		b, err := os.ReadFile(filepath.Join(dir, n))
		if err != nil {
			t.Fatalf("workspace %s: %v", dir, err)
		}
		out[n] = string(b)
	}
	return out
}

// The same scripted turn — write, read, edit, apply_patch, exec and a failing read — run once on
// the gateway and once on a local box's real worker (launched by bootstrap, model calls proxied
// through the gateway) produces the same transcript shape and the same workspace files.
func TestWorkerTurnMatchesLocalTurn(t *testing.T) {
	root := t.TempDir()
	script := filepath.Join(root, "script.json")
	if err := os.WriteFile(script, []byte(workerTurnScript), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := fastWorkerConfig + "models:\n  default: demo/demo\n  providers:\n    demo: {api: scripted, script: " + script + ", models: [{id: demo}]}\n"
	g := startGateway(t, filepath.Join(root, "data"), cfg)
	e := g.waitReady(g.createEnv("local").ID)
	pid := workerPID(t, e)
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })

	newSession := func(workspace string) string {
		// a session's workspace must exist (the box's here: its HOME is on this machine)
		if err := os.MkdirAll(workspace, 0o755); err != nil {
			t.Fatal(err)
		}
		ses, err := g.client.CreateSession(g.ctx(), sessions.CreateRequest{CreateParams: sessions.CreateParams{Title: "turn", Workspace: workspace}})
		if err != nil {
			t.Fatal(err)
		}
		return ses.ID
	}
	send := func(id string) turns.Turn {
		turn, err := g.client.SendMessage(g.ctx(), id, turns.SendRequest{Text: "tidy the notes"})
		if err != nil {
			t.Fatalf("send: %v", err)
		}
		return turn
	}

	localWS := filepath.Join(root, "w1")
	local := newSession(localWS)
	lt := waitTurn(t, g, send(local).RunID)

	remote := newSession(filepath.Join(root, "w2"))
	g.dispatchTo(remote, "local") // onto the ready environment e (a warm lease)
	// the box's workspace is absolute on the box (its HOME is on this machine)
	boxWS := g.mustRest(remote, placement.Active).Placement.BoxWorkspace
	wt := send(remote)
	if wt.Placement != "worker" {
		t.Fatalf("turn placement %q, want worker", wt.Placement)
	}
	wt = waitTurn(t, g, wt.RunID)
	if lt.Status != turns.TurnDone || wt.Status != turns.TurnDone {
		t.Fatalf("local turn %s (%s), worker turn %s (%s)", lt.Status, lt.Error, wt.Status, wt.Error)
	}

	ls, ws := shapeOf(t, g, local), shapeOf(t, g, remote)
	if !reflect.DeepEqual(ls, ws) {
		t.Fatalf("transcript shapes differ:\nlocal:\n  %s\nworker:\n  %s", strings.Join(ls, "\n  "), strings.Join(ws, "\n  "))
	}
	if len(ls) != 14 || !strings.Contains(ls[12], "isError") {
		t.Fatalf("unexpected transcript shape:\n  %s", strings.Join(ls, "\n  "))
	}
	files := []string{"notes.txt", "added.txt", "combined.txt"}
	lf, wf := readFiles(t, localWS, files...), readFiles(t, boxWS, files...)
	if !reflect.DeepEqual(lf, wf) || lf["combined.txt"] != "ALPHA\ngamma\npatched\n" {
		t.Fatalf("workspaces differ: local %q, worker %q", lf, wf)
	}

	// The box's real worker ran the turn: its seven model calls went through the proxy and were
	// accounted to the environment (the local turn's calls were not).
	info, err := g.client.EnvironmentWorker(g.ctx(), e.ID)
	if err != nil {
		t.Fatal(err)
	}
	if info.Inference.Calls != 7 || info.Inference.BytesIn == 0 || info.Inference.BytesOut == 0 {
		t.Fatalf("proxied calls of the environment: %+v, want 7", info.Inference)
	}
	// the environment itself shows its running totals too
	withTotals, err := g.client.Environment(g.ctx(), e.ID)
	if err != nil {
		t.Fatal(err)
	}
	if withTotals.Inference == nil || withTotals.Inference.Calls != 7 {
		t.Fatalf("GET /environments/%s inference totals: %+v", e.ID, withTotals.Inference)
	}
}

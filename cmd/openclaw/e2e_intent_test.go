package main_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/openclaw/cloudworkers/gateway/placement"
	"github.com/openclaw/cloudworkers/gateway/sessions"
)

// brokenProfile is a lease CLI that refuses every lease: a dispatch to it fails in its
// provisioning step, naming the CLI's message.
func brokenProfile(root string) string {
	return leaseDirProfile("broken", filepath.Join(root, "broken-leases"), map[string]string{"LEASE_DIR_WARMUP_FAIL": "capacity exhausted in fsn1"})
}

// agentWritesScript is one turn whose agent writes agent.txt in its workspace.
const agentWritesScript = `[
  {"toolCalls": [{"name": "write", "arguments": {"path": "agent.txt", "content": "written by the agent\n"}}]},
  {"text": "Wrote it."}
]`

// cli runs the openclaw CLI against the gateway; it returns stdout, stderr and the error.
func (g *gw) cli(args ...string) (string, string, error) {
	g.t.Helper()
	cmd := exec.Command(openclawBin, append(args, "--gateway", g.addr, "--data-dir", g.dataDir)...)
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	return out.String(), errb.String(), err
}

func dirNames(t *testing.T, dir string) []string {
	t.Helper()
	des, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, de := range des {
		names = append(names, de.Name())
	}
	return names
}

// TestFailedDispatchNeverRunsLocally: a session created for a worker whose dispatch failed refuses
// its messages (CLI exit 1, API 409) naming the placement error and both recovery actions; nothing
// runs and the user's directory is untouched. Only `session move --local` lets it run on the gateway.
func TestFailedDispatchNeverRunsLocally(t *testing.T) {
	root := t.TempDir()
	g := startGateway(t, filepath.Join(root, "data"), fastWorkerConfig+scriptedModels(t, root, map[string]string{"writer": agentWritesScript})+
		"profiles:\n"+brokenProfile(root))
	t.Cleanup(func() { destroyAll(g) })
	ws := filepath.Join(root, "user")
	userWorkspace(t, ws, false)

	if _, stderr, err := g.cli("session", "new", "--workspace", ws, "--worker", "broken"); err == nil {
		t.Fatalf("session new --worker broken succeeded: %s", stderr)
	}
	var list []sessions.Session
	if _, err := g.do("GET", "/api/v1/sessions", nil, &list); err != nil || len(list) != 1 {
		t.Fatalf("sessions %v %v, want the one created", list, err)
	}
	id := list[0].ID
	v := g.mustRest(id, placement.Failed)
	if !strings.Contains(v.Placement.Error, "capacity exhausted in fsn1") {
		t.Fatalf("failed placement without an error:\n%s", v)
	}

	_, stderr, err := g.cli("session", "send", id, "write something")
	if err == nil {
		t.Fatalf("message to a session whose dispatch failed was admitted: %s", stderr)
	}
	for _, want := range []string{"conflict", "dispatch to a worker of profile broken failed", v.Placement.Error,
		"openclaw session dispatch " + id + " --profile broken", "openclaw session move " + id + " --local"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("refusal %q does not say %q", stderr, want)
		}
	}
	if _, code, err := g.send(id, "write something"); code != 409 || err == nil {
		t.Fatalf("API message to the failed session: %d %v, want 409", code, err)
	}
	if ts := g.turns(id); len(ts) != 0 {
		t.Fatalf("turns ran: %+v", ts)
	}
	if names := dirNames(t, ws); !slices.Equal(names, []string{"README.md"}) {
		t.Fatalf("the user's directory changed: %v", names)
	}

	// The explicit move back, recorded in the placement; then turns run on the gateway.
	out, stderr, err := g.cli("session", "move", id, "--local")
	if err != nil {
		t.Fatalf("session move --local: %v %s", err, stderr)
	}
	if !strings.Contains(out, ws) {
		t.Errorf("move says %q, want the workspace it runs in (%s)", out, ws)
	}
	v = g.mustRest(id, placement.Local)
	if last := v.Events[len(v.Events)-1]; last.From != placement.Failed || !strings.Contains(last.Reason, "moved to the gateway by the user") {
		t.Fatalf("last placement event %+v", last)
	}
	g.runTurn(id, "write something", "local")
	if got := readFile(t, filepath.Join(ws, "agent.txt")); got != "written by the agent\n" {
		t.Fatalf("agent.txt %q", got)
	}
	if _, stderr, err := g.cli("session", "move", id); err == nil || !strings.Contains(stderr, "--local") {
		t.Fatalf("session move without --local: %v %s", err, stderr)
	}
}

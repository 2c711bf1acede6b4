package main_test

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/openclaw/cloudworkers/gateway/api"
	"github.com/openclaw/cloudworkers/gateway/placement"
	"github.com/openclaw/cloudworkers/gateway/sessions"
	"github.com/openclaw/cloudworkers/internal/testrig/testenv"
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
	cmd := g.cliCmd(args...)
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	return out.String(), errb.String(), err
}

// cliCmd is the openclaw CLI command against the gateway, not started.
func (g *gw) cliCmd(args ...string) *exec.Cmd {
	return exec.Command(openclawBin, append(args, "--gateway", g.addr, "--data-dir", g.dataDir)...)
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
	list, err := g.client.Sessions(g.ctx())
	if err != nil || len(list) != 1 {
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

// TestBadSessionInputRefusedBeforeLeasing: a workspace that does not exist or is not a directory, a
// non-git directory with --git, an unknown profile and a class the profile has not are refused by
// `session new` (exit non-zero, the message names what was wrong) and by the API (400 naming the
// field), and leave no session row, no environment and no lease. Dispatching a session whose
// workspace was deleted is refused before a machine is leased.
func TestBadSessionInputRefusedBeforeLeasing(t *testing.T) {
	testenv.RequireCommands(t, "git")
	root := t.TempDir()
	leaseDir := filepath.Join(root, "leases")
	g := startGateway(t, filepath.Join(root, "data"), fastWorkerConfig+"profiles:\n"+leaseDirProfile("ld", leaseDir, nil))
	t.Cleanup(func() { destroyAll(g) })
	plain := filepath.Join(root, "plain")
	userWorkspace(t, plain, false)
	file := filepath.Join(plain, "README.md")
	missing := filepath.Join(root, "missing")

	cases := []struct {
		name string
		args []string
		says string
	}{
		{"missing workspace", []string{"--workspace", missing}, missing + " does not exist"},
		{"missing workspace on a worker", []string{"--workspace", missing, "--worker", "ld"}, missing + " does not exist"},
		{"a file", []string{"--workspace", file, "--worker", "ld"}, file + " is not a directory"},
		{"not git", []string{"--workspace", plain, "--git", "--worker", "ld"}, "git: workspace " + plain + " is not a git work tree"},
		{"unknown profile", []string{"--workspace", plain, "--worker", "nope"}, `target.profileId: no profile "nope"`},
		{"class on a provider without classes", []string{"--workspace", plain, "--worker", "local", "--class", "big"}, "target.machineClass"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, stderr, err := g.cli(append([]string{"session", "new"}, c.args...)...)
			if err == nil || !strings.Contains(stderr, c.says) {
				t.Fatalf("session new %v: %v %q, want a failure saying %q", c.args, err, stderr, c.says)
			}
		})
	}
	_, err := g.client.CreateSession(g.ctx(), sessions.CreateRequest{CreateParams: sessions.CreateParams{Workspace: missing}, Target: &sessions.Target{Kind: "profile", ProfileID: "ld"}})
	var ae *api.Error
	if !errors.As(err, &ae) || ae.Status != 400 || ae.Field != "workspace" {
		t.Fatalf("API create with a missing workspace: %v, want 400 naming the workspace field", err)
	}
	if exists(missing) {
		t.Fatalf("the missing workspace %s was created", missing)
	}
	if list, err := g.client.Sessions(g.ctx()); err != nil || len(list) != 0 {
		t.Fatalf("sessions after refused creates: %v %v", list, err)
	}

	// a session whose workspace is deleted after it was created is not dispatched
	gone := filepath.Join(root, "gone")
	userWorkspace(t, gone, false)
	id := g.newSession(gone, "")
	if err := os.RemoveAll(gone); err != nil {
		t.Fatal(err)
	}
	if _, stderr, err := g.cli("session", "dispatch", id, "--profile", "ld"); err == nil || !strings.Contains(stderr, gone+" does not exist") {
		t.Fatalf("dispatch of a session whose workspace is gone: %v %q", err, stderr)
	}
	if v := g.placement(id); v.Placement.State != placement.Local || len(v.Events) != 0 {
		t.Fatalf("placement after the refused dispatch:\n%s", v)
	}
	if envList, err := g.client.Environments(g.ctx(), false); err != nil || len(envList) != 0 {
		t.Fatalf("environments after refused requests: %v %v", envList, err)
	}
	if leases := liveLeases(t, leaseDir); len(leases) != 0 {
		t.Fatalf("leases after refused requests: %v", leases)
	}
}

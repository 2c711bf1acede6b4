package main_test

import (
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/openclaw/cloudworkers/gateway/placement"
	"github.com/openclaw/cloudworkers/gateway/store"
	"github.com/openclaw/cloudworkers/internal/testrig/testenv"
)

// modelKey is the gateway's own model key in TestPullBackSecretScan: no pattern rule matches
// it, only the scan for the values the gateway holds. The worker's command builds it from two
// halves, so that the command text (in transcripts and logs) does not hold it whole.
const modelKeyA, modelKeyB = "gw-model-key-", "7f3c9a1e5b2d4f60aa91c0de"

// TestPullBackSecretScan: a git worker that commits the gateway's own model key in a file, and
// a plain worker that writes an AWS-style access key id, are both refused at pull-back with the
// path, line and rule (never the secret), audited; `pullback --allow-secret RULE:PATH` lets the
// AWS one through as a known false positive. The key appears in no error, audit row, placement
// event or gateway log line.
func TestPullBackSecretScan(t *testing.T) {
	testenv.RequireCommands(t, "git")
	root := t.TempDir()
	g := startGateway(t, filepath.Join(root, "data"), fastWorkerConfig+scriptedModels(t, root, map[string]string{
		"leak": `[{"toolCalls": [{"name": "exec", "arguments": {"command": "printf 'MODEL_KEY=%s%s\\n' '` + modelKeyA + `' '` + modelKeyB + `' > config.env && git add config.env && git -c user.name=w -c user.email=w@example.com commit -qm 'configure'"}}]},
		           {"text": "Configured."}]`,
		"aws": `[{"toolCalls": [{"name": "exec", "arguments": {"command": "printf 'the docs example id: AKIA%s\\n' IOSFODNN7EXAMPLE > notes.md"}}]},
		          {"text": "Noted."}]`,
	}))
	t.Cleanup(func() { destroyAll(g) })
	key := modelKeyA + modelKeyB
	if err := g.client.SetCredential(g.ctx(), "anthropic", key); err != nil {
		t.Fatal(err)
	}

	refused := func(id, wantFinding string) placementView {
		t.Helper()
		g.pullback(id)
		v := g.mustRest(id, placement.Failed)
		if !strings.Contains(v.Placement.Error, wantFinding) || !strings.Contains(v.Placement.Error, "--allow-secret RULE:PATH") {
			t.Fatalf("pull-back error %q: want the finding %q and the --allow-secret recovery", v.Placement.Error, wantFinding)
		}
		audit, err := g.client.Audit(g.ctx(), "")
		if err != nil {
			t.Fatal(err)
		}
		if !slices.ContainsFunc(audit, func(a store.AuditEntry) bool {
			return a.Kind == placement.AuditSecretRefused && strings.Contains(a.Detail, id) && strings.Contains(a.Detail, wantFinding)
		}) {
			t.Fatalf("no %s audit row for %s naming %q: %+v", placement.AuditSecretRefused, id, wantFinding, audit)
		}
		return v
	}

	// git: the worker's commit holds the model key
	gitWS := filepath.Join(root, "git-user")
	userWorkspace(t, gitWS, true)
	leak, _ := g.activeSession(gitWS, "leak/m", "local")
	g.runTurn(leak, "configure", "worker")
	v := refused(leak, "config.env:1 gateway-credential:anthropic")
	if exists(filepath.Join(v.Placement.AnchorDir, "config.env")) {
		t.Fatal("the refused pull-back brought config.env into the anchor")
	}
	if got := testenv.Git(t, gitWS, "log", "-1", "--format=%s", "openclaw/"+strings.TrimPrefix(leak, "ses_")); got == "configure" {
		t.Fatal("the refused commit was adopted onto the managed branch")
	}

	// plain: an AWS-style key id, refused, then let through as a known false positive
	plainWS := filepath.Join(root, "plain-user")
	userWorkspace(t, plainWS, false)
	aws, _ := g.activeSession(plainWS, "aws/m", "local")
	g.runTurn(aws, "note it", "worker")
	v = refused(aws, "notes.md:1 aws-access-key-id")
	if exists(filepath.Join(v.Placement.AnchorDir, "notes.md")) {
		t.Fatal("the refused pull-back brought notes.md into the anchor")
	}
	if out, err := exec.Command(openclawBin, "session", "pullback", aws, "--allow-secret", "no-such-rule:notes.md",
		"--gateway", g.addr, "--data-dir", g.dataDir).CombinedOutput(); err == nil || !strings.Contains(string(out), "unknown rule") {
		t.Fatalf("pullback --allow-secret with an unknown rule: %v\n%s", err, out)
	}
	if out, err := exec.Command(openclawBin, "session", "pullback", aws, "--allow-secret", "aws-access-key-id:notes.md",
		"--gateway", g.addr, "--data-dir", g.dataDir).CombinedOutput(); err != nil {
		t.Fatalf("session pullback --allow-secret: %v\n%s", err, out)
	}
	v = g.mustRest(aws, placement.Local)
	if got := readFile(t, filepath.Join(v.Placement.AnchorDir, "notes.md")); !strings.Contains(got, "AKIAIOSFODNN7EXAMPLE") {
		t.Fatalf("allowed notes.md in the anchor: %q", got)
	}

	// the key is nowhere the gateway reports
	audit, err := g.client.Audit(g.ctx(), "")
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range audit {
		if strings.Contains(a.Detail, key) {
			t.Fatalf("audit row %s holds the key", a.Kind)
		}
	}
	for _, id := range []string{leak, aws} {
		pv := g.placement(id)
		if strings.Contains(pv.Placement.Error, key) {
			t.Fatalf("placement error of %s holds the key", id)
		}
		for _, ev := range pv.Events {
			if strings.Contains(ev.Reason, key) {
				t.Fatalf("placement event of %s holds the key: %q", id, ev.Reason)
			}
		}
	}
	if strings.Contains(g.log.String(), key) {
		t.Fatal("the gateway log holds the key")
	}
}

// TestPullBackScansAllBeforeAdopting: a git worker that commits a clean file and leaves an
// AWS-style key in an uncommitted file is refused at pull-back with nothing adopted — the clean
// commit is not on the managed branch, neither file is in the anchor — because the uncommitted
// files are scanned before the commits are adopted; let through with --allow-secret, the retry
// adopts the commit and brings the file as uncommitted work.
func TestPullBackScansAllBeforeAdopting(t *testing.T) {
	testenv.RequireCommands(t, "git")
	root := t.TempDir()
	g := startGateway(t, filepath.Join(root, "data"), fastWorkerConfig+scriptedModels(t, root, map[string]string{
		"mixed": `[{"toolCalls": [{"name": "exec", "arguments": {"command": "printf 'clean\\n' > clean.txt && git add clean.txt && git -c user.name=w -c user.email=w@example.com commit -qm 'clean commit' && printf 'id: AKIA%s\\n' IOSFODNN7EXAMPLE > notes.md"}}]},
		           {"text": "Done."}]`,
	}))
	t.Cleanup(func() { destroyAll(g) })
	ws := filepath.Join(root, "user")
	userWorkspace(t, ws, true)
	id, _ := g.activeSession(ws, "mixed/m", "local")
	g.runTurn(id, "work", "worker")
	branch := "openclaw/" + strings.TrimPrefix(id, "ses_")
	before := testenv.Git(t, ws, "rev-parse", branch)
	if got := testenv.Git(t, ws, "log", "-1", "--format=%s", branch); got == "clean commit" {
		t.Fatal("the clean commit is on the managed branch before the pull-back (a checkpoint adopted it): the test proves nothing")
	}

	g.pullback(id)
	v := g.mustRest(id, placement.Failed)
	if !strings.Contains(v.Placement.Error, "notes.md:1 aws-access-key-id") {
		t.Fatalf("pull-back error %q: want the finding notes.md:1 aws-access-key-id", v.Placement.Error)
	}
	if got := testenv.Git(t, ws, "rev-parse", branch); got != before {
		t.Fatalf("the refused pull-back moved %s from %s to %s: the clean commit was adopted", branch, before[:12], got[:12])
	}
	for _, f := range []string{"clean.txt", "notes.md"} {
		if exists(filepath.Join(v.Placement.AnchorDir, f)) {
			t.Fatalf("the refused pull-back brought %s into the anchor", f)
		}
	}

	if out, err := exec.Command(openclawBin, "session", "pullback", id, "--allow-secret", "aws-access-key-id:notes.md",
		"--gateway", g.addr, "--data-dir", g.dataDir).CombinedOutput(); err != nil {
		t.Fatalf("session pullback --allow-secret: %v\n%s", err, out)
	}
	v = g.mustRest(id, placement.Local)
	if got := testenv.Git(t, ws, "log", "-1", "--format=%s", branch); got != "clean commit" {
		t.Fatalf("after the allowed retry %s is at %q, want the clean commit", branch, got)
	}
	if got := readFile(t, filepath.Join(v.Placement.AnchorDir, "notes.md")); !strings.Contains(got, "AKIAIOSFODNN7EXAMPLE") {
		t.Fatalf("notes.md in the anchor: %q", got)
	}
	if st := testenv.Git(t, v.Placement.AnchorDir, "status", "--porcelain", "notes.md"); !strings.HasPrefix(st, "??") {
		t.Fatalf("notes.md is %q in the managed worktree, want uncommitted (untracked)", st)
	}
}

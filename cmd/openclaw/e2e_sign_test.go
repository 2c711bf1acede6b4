package main_test

import (
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/openclaw/cloudworkers/gateway/workspace"
	"github.com/openclaw/cloudworkers/internal/gitforge"
	"github.com/openclaw/cloudworkers/internal/testrig/testenv"
)

// TestPublishedCommitsAreSigned: with git.signing.key, a publish pushes the worker's commits
// signed on the gateway with that key: `git verify-commit` passes on the forge's branch (and
// fails on the box's original), the trees, authors and dates are the worker's, the base is
// untouched, a second publish is up to date (the signed copies are the same commits), and the
// key's text is nowhere on the box. A key others may read is refused at start, naming the field.
func TestPublishedCommitsAreSigned(t *testing.T) {
	testenv.RequireCommands(t, "git", "ssh-keygen")
	root := t.TempDir()
	ctx := testenv.Context(t, 2*time.Minute)
	forge, err := gitforge.Start(filepath.Join(root, "forge"), "x-access-token", forgeToken)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { forge.Close() })
	bare, remote, err := forge.Init(ctx, "org/signed.git")
	if err != nil {
		t.Fatal(err)
	}
	keys := filepath.Join(root, "keys")
	if err := os.Mkdir(keys, 0o700); err != nil {
		t.Fatal(err)
	}
	key := filepath.Join(keys, "signing")
	pub, err := gitforge.Keygen(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	work := scriptedModels(t, root, map[string]string{
		"work": `[{"toolCalls": [{"name": "exec", "arguments": {"command": "echo one > one.txt && git add one.txt && git -c user.name=w -c user.email=w@example.com commit -qm 'first' && echo two > two.txt && git add two.txt && git -c user.name=w -c user.email=w@example.com commit -qm 'second'"}}]},
		          {"text": "Committed."}]`,
	})
	profile := "profiles:\n  - id: pub\n    provider: local\n    hygiene: {metadataRoute: warn, dockerSocket: warn}\n    publish: {credential: forge}\n"

	// a key others may read is refused before the gateway starts
	loose := filepath.Join(keys, "loose")
	if _, err := gitforge.Keygen(ctx, loose); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(loose, 0o644); err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(root, "bad.yaml")
	if err := os.WriteFile(bad, []byte("git: {signing: {key: "+loose+"}}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(openclawBin, "gateway", "--data-dir", filepath.Join(root, "bad-data"), "--config", bad, "--listen", freeAddr(t)).CombinedOutput(); err == nil ||
		!strings.Contains(string(out), "git.signing.key") || !strings.Contains(string(out), "chmod 600") {
		t.Fatalf("a gateway with a readable signing key: %v\n%s", err, out)
	}

	g := startGateway(t, filepath.Join(root, "data"), fastWorkerConfig+work+profile+"git: {signing: {key: "+key+"}}\n")
	t.Cleanup(func() { destroyAll(g) })
	set := exec.Command(openclawBin, "credential", "set", "forge", "--git-token", "--gateway", g.addr, "--data-dir", g.dataDir)
	set.Stdin = strings.NewReader(forgeToken)
	if out, err := set.CombinedOutput(); err != nil {
		t.Fatalf("credential set: %v\n%s", err, out)
	}
	ws := filepath.Join(root, "user")
	forgeWorkspace(t, ws, remote)
	id, branch, tip := g.pulledBackWork(ws, "pub")

	res, err := g.client.Publish(g.ctx(), id, workspace.PublishRequest{})
	if err != nil || res.Status != "new" {
		t.Fatalf("publish: %+v %v", res, err)
	}
	got, err := gitforge.Git(ctx, "-C", bare, "rev-parse", "refs/heads/"+branch)
	if err != nil || got != res.Commit || got == tip {
		t.Fatalf("the forge has %s at %q (%v); want the signed copy %s of the worker's %s", branch, got, err, res.Commit, tip)
	}
	allowed := filepath.Join(root, "allowed_signers")
	if err := os.WriteFile(allowed, []byte("* "+pub+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	base := testenv.Git(t, ws, "rev-parse", "main")
	commits, err := gitforge.Git(ctx, "-C", bare, "rev-list", "--reverse", got, "^"+base)
	if err != nil || len(strings.Fields(commits)) != 2 {
		t.Fatalf("the published branch adds %q (%v), want the worker's two commits", commits, err)
	}
	originals := strings.Fields(testenv.Git(t, ws, "rev-list", "--reverse", tip, "^"+base))
	for i, c := range strings.Fields(commits) {
		if out, err := gitforge.Git(ctx, "-C", bare, "-c", "gpg.ssh.allowedSignersFile="+allowed, "verify-commit", c); err != nil {
			t.Fatalf("verify-commit %s on the forge: %v %s", c, err, out)
		}
		format := "--format=%T %an <%ae> %ad %cn <%ce> %cd %B"
		signed, _ := gitforge.Git(ctx, "-C", bare, "log", "-1", format, c)
		orig := testenv.Git(t, ws, "log", "-1", format, originals[i])
		if signed != orig {
			t.Fatalf("signed commit %d differs from the worker's beyond its signature:\n%s\nwant\n%s", i+1, signed, orig)
		}
	}
	if err := exec.Command("git", "-C", ws, "-c", "gpg.ssh.allowedSignersFile="+allowed, "verify-commit", tip).Run(); err == nil {
		t.Fatal("the worker's own commit verifies: the test would prove nothing")
	}
	if p, _ := gitforge.Git(ctx, "-C", bare, "rev-parse", strings.Fields(commits)[0]+"^"); p != base {
		t.Fatalf("the first signed commit's parent is %s, want the untouched base %s", p, base)
	}

	again, err := g.client.Publish(g.ctx(), id, workspace.PublishRequest{})
	if err != nil || again.Status != "up to date" || again.Commit != got {
		t.Fatalf("a second publish: %+v %v, want up to date at %s (signing again gives the same commits)", again, err, got)
	}
	if !strings.Contains(strings.Join(eventReasons(g.placement(id)), "\n"), "2 commit(s) signed with SHA256:") {
		t.Fatalf("no placement note of the signing: %v", eventReasons(g.placement(id)))
	}
	secret, err := os.ReadFile(key)
	if err != nil {
		t.Fatal(err)
	}
	body := strings.Split(strings.TrimSpace(string(secret)), "\n")[1] // a line of the key's base64
	_ = filepath.WalkDir(filepath.Join(g.dataDir, "boxes"), func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if b, rerr := os.ReadFile(p); rerr == nil && strings.Contains(string(b), body) {
				t.Errorf("the box holds the signing key: %s", p)
			}
		}
		return nil
	})
}

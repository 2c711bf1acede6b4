package gitsync

import (
	"crypto/sha256"
	"encoding/hex"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/openclaw/cloudworkers/sync/internal/synctest"
	"github.com/openclaw/cloudworkers/sync/manifest"
	"github.com/openclaw/cloudworkers/sync/stream"
)

// userState is what the user can see of a checkout: every file's hash (the .git directory's
// index, HEAD and branch refs included), `git status --porcelain` and `git stash list`.
type userState struct {
	files         map[string]string
	status, stash string
}

func stateOf(t *testing.T, dir string) userState {
	t.Helper()
	files := map[string]string{}
	for k, v := range synctest.SnapshotWithoutGit(t, dir) {
		h := sha256.Sum256([]byte(v))
		files[k] = hex.EncodeToString(h[:])
	}
	for _, p := range []string{".git/index", ".git/HEAD", ".git/refs/heads/main"} {
		b, err := os.ReadFile(filepath.Join(dir, p))
		if err != nil {
			t.Fatal(err)
		}
		h := sha256.Sum256(b)
		files[p] = hex.EncodeToString(h[:])
	}
	return userState{files: files, status: synctest.Git(t, dir, "status", "--porcelain", "--untracked-files=all"),
		stash: synctest.Git(t, dir, "stash", "list")}
}

// TestDirtyCheckoutGoesOut dispatches a checkout with a modified tracked file, a staged new
// file, a deleted file, a new untracked file, an ignored file, a .worktreeinclude file and a file
// the profile excludes: the box gets the first ones as the snapshot commit's tree (its status
// clean), the ignored file not, the .worktreeinclude one as an untracked file; the worker's commit
// on top adopts; the user's checkout is byte-identical afterwards.
func TestDirtyCheckoutGoesOut(t *testing.T) {
	synctest.HaveGit(t)
	ctx := synctest.Context(t)
	tmp := t.TempDir()
	user, data, box := filepath.Join(tmp, "user"), filepath.Join(tmp, "data"), filepath.Join(tmp, "box", "ws")
	head := synctest.InitRepo(t, user, map[string]string{
		".gitignore":       "*.log\n.env\n",
		".worktreeinclude": ".env\n",
		"main.go":          "package main\n",
		"gone.txt":         "deleted by the user\n",
		"secret/keep.txt":  "committed\n",
	})
	synctest.Write(t, user, map[string]string{
		"main.go":          "package main // edited, not committed\n",
		"staged.go":        "package main // staged only\n",
		"new.txt":          "untracked work\n",
		"debug.log":        "ignored\n",
		".env":             "TOKEN=local\n",
		"secret/keep.txt":  "edited but excluded by the profile\n",
		"secret/fresh.txt": "untracked but excluded by the profile\n",
	})
	synctest.Git(t, user, "add", "staged.go")
	must(t, os.Remove(filepath.Join(user, "gone.txt")))
	synctest.Git(t, user, "stash", "list")
	before := stateOf(t, user)

	opts := SnapshotOptions{Exclude: []string{"secret/"}, Author: Identity{Name: "Gateway Owner", Email: "owner@example.invalid"}}
	a, err := CreateWorkingAnchor(ctx, user, data, "s1", opts)
	must(t, err)

	if after := stateOf(t, user); !maps.Equal(after.files, before.files) || after.status != before.status || after.stash != before.stash {
		t.Fatalf("user's checkout changed by the dispatch:\nbefore %+v\nafter  %+v", before, after)
	}
	if !a.Snapshot || a.Head != head || a.Base == head {
		t.Fatalf("anchor head %s base %s snapshot %v, want a snapshot on top of %s", a.Head, a.Base, a.Snapshot, head)
	}
	if got := synctest.Git(t, a.Dir, "log", "-1", "--format=%P|%an <%ae>|%cn|%s", a.Base); got != head+"|Gateway Owner <owner@example.invalid>|Gateway Owner|"+SnapshotMessage {
		t.Fatalf("snapshot commit %q", got)
	}
	if got := synctest.Git(t, user, "rev-parse", SnapshotRefPrefix+"s1"); got != a.Base {
		t.Fatalf("snapshot ref at %s, want %s", got, a.Base)
	}
	files := synctest.Git(t, a.Dir, "ls-tree", "-r", "--name-only", a.Base)
	if want := ".gitignore\n.worktreeinclude\nmain.go\nnew.txt\nsecret/keep.txt\nstaged.go"; files != want {
		t.Fatalf("snapshot tree lists\n%s\nwant\n%s", files, want)
	}
	if got := synctest.Git(t, a.Dir, "show", a.Base+":secret/keep.txt"); got != "committed" {
		t.Fatalf("an excluded tracked file's edit entered the snapshot: %q", got)
	}

	// Out to the box: files, then the repository from the base pack.
	base, err := a.Manifest(ctx, manifest.Options{Exclude: opts.Exclude})
	must(t, err)
	if base.BaseCommit != a.Base {
		t.Fatalf("base manifest commit %s, want the snapshot %s", base.BaseCommit, a.Base)
	}
	_, err = pipe(ctx, a.Dir, stream.PlanFor(nil, base), box, stream.ApplyOptions{AllowEscapingSymlinks: true})
	must(t, err)
	pack := filepath.Join(tmp, "box", "base.pack")
	must(t, a.BasePack(ctx, pack))
	if out, err := exec.Command("/bin/sh", "-c", BoxRepoCommand(box, pack, "s1", a.Base, Identity{})).CombinedOutput(); err != nil {
		t.Fatalf("box repo: %v: %s", err, out)
	}
	for p, want := range map[string]string{
		"main.go":          "package main // edited, not committed\n",
		"staged.go":        "package main // staged only\n",
		"new.txt":          "untracked work\n",
		".env":             "TOKEN=local\n",
		"gone.txt":         "<missing>",
		"debug.log":        "<missing>",
		"secret/fresh.txt": "<missing>",
	} {
		if got := synctest.Read(t, box, p); got != want {
			t.Errorf("box %s = %q, want %q", p, got, want)
		}
	}
	if st := synctest.Git(t, box, "status", "--porcelain", "--", ":!secret"); st != "" {
		t.Fatalf("box status %q: the user's work should be the base commit's tree", st)
	}

	// The worker's commit builds on the snapshot and adopts.
	synctest.Write(t, box, map[string]string{"feature.go": "package main // worker\n"})
	synctest.Git(t, box, "add", "feature.go")
	synctest.Git(t, box, "commit", "-q", "-m", "worker: feature")
	a.Base = base.BaseCommit
	w := &world{box: box, boxTmp: filepath.Join(tmp, "box"), anchor: a}
	tip, err := a.Adopt(ctx, "s1", w.bundle(t))
	must(t, err)
	if got := synctest.Git(t, a.Dir, "rev-parse", "HEAD~1"); got != a.Base {
		t.Fatalf("adopted tip's parent %s, want the snapshot %s", got, a.Base)
	}
	if got := synctest.Git(t, a.Dir, "rev-list", "--count", "refs/heads/"+a.Branch, "--not", "--exclude="+BranchPrefix+"*", "--branches", "--glob="+SnapshotRefPrefix+"*"); got != "1" {
		t.Fatalf("%s commits of the worker's listed past the snapshot ref, want 1 (tip %s)", got, tip)
	}
	if after := stateOf(t, user); !maps.Equal(after.files, before.files) || after.status != before.status || after.stash != before.stash {
		t.Fatalf("user's checkout changed by the adoption:\nbefore %+v\nafter  %+v", before, after)
	}
}

// TestCleanCheckoutNoSnapshot: nothing uncommitted (an ignored file only) gives an anchor at
// HEAD and no snapshot commit or ref.
func TestCleanCheckoutNoSnapshot(t *testing.T) {
	synctest.HaveGit(t)
	ctx := synctest.Context(t)
	tmp := t.TempDir()
	user := filepath.Join(tmp, "user")
	head := synctest.InitRepo(t, user, map[string]string{".gitignore": "*.log\n", "main.go": "package main\n"})
	synctest.Write(t, user, map[string]string{"debug.log": "ignored\n"})
	a, err := CreateWorkingAnchor(ctx, user, filepath.Join(tmp, "data"), "s1", SnapshotOptions{})
	must(t, err)
	if a.Snapshot || a.Base != head {
		t.Fatalf("clean checkout: base %s snapshot %v, want HEAD %s and none", a.Base, a.Snapshot, head)
	}
	if refs := synctest.Git(t, user, "for-each-ref", SnapshotRefPrefix); refs != "" {
		t.Fatalf("snapshot ref made for a clean checkout: %s", refs)
	}
	if n := synctest.Git(t, a.Dir, "rev-list", "--count", "HEAD"); n != "1" || strings.TrimSpace(synctest.Git(t, a.Dir, "status", "--porcelain")) != "" {
		t.Fatalf("anchor of a clean checkout: %s commits, status %q", n, synctest.Git(t, a.Dir, "status", "--porcelain"))
	}
}

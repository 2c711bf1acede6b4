package gitsync

import (
	"context"
	"errors"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/openclaw/cloudworkers/sync/internal/synctest"
	"github.com/openclaw/cloudworkers/sync/manifest"
	"github.com/openclaw/cloudworkers/sync/mirror"
	"github.com/openclaw/cloudworkers/sync/stream"
)

func TestMain(m *testing.M) {
	cleanup := synctest.IsolateGit()
	code := m.Run()
	synctest.CleanupBinaries()
	cleanup()
	os.Exit(code)
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// pipe moves plan from src to dst through a real archive.
func pipe(ctx context.Context, src string, plan stream.Plan, dst string, opts stream.ApplyOptions) (stream.Stats, error) {
	pr, pw := io.Pipe()
	go func() {
		_, err := stream.Write(ctx, pw, src, plan)
		pw.CloseWithError(err)
	}()
	st, err := stream.Apply(ctx, pr, dst, opts)
	pr.CloseWithError(errors.New("done"))
	return st, err
}

type world struct {
	user, data, box, boxTmp string
	anchor                  *Anchor
	base                    *manifest.Manifest
	userBefore              *manifest.Manifest
	userHead                string
}

// dispatch creates the anchor from a user repository and syncs it out to a simulated box.
func dispatch(t *testing.T) *world {
	t.Helper()
	synctest.HaveGit(t)
	ctx := synctest.Context(t)
	tmp := t.TempDir()
	w := &world{user: filepath.Join(tmp, "user"), data: filepath.Join(tmp, "data"), box: filepath.Join(tmp, "box", "ws"), boxTmp: filepath.Join(tmp, "box")}
	synctest.InitRepo(t, w.user, map[string]string{
		".gitignore":       ".env\nbuild/\n",
		".worktreeinclude": ".env\n",
		"main.go":          "package main\n",
		"lib/lib.go":       "package lib\n",
	})
	synctest.Write(t, w.user, map[string]string{".env": "TOKEN=local", "build/x": "ignored", "wip.txt": "user's uncommitted work"})
	w.userHead = synctest.Git(t, w.user, "rev-parse", "HEAD")
	w.userBefore, _, _ = manifest.Build(ctx, w.user, manifest.Options{})

	a, err := CreateAnchor(ctx, w.user, w.data, "s1", "")
	must(t, err)
	w.anchor = a
	if got := synctest.Read(t, a.Dir, ".env"); got != "TOKEN=local" {
		t.Fatalf(".worktreeinclude file not copied: %q", got)
	}
	if got := synctest.Read(t, a.Dir, "build/x"); got != "<missing>" {
		t.Fatal("an ignored file not in .worktreeinclude was copied")
	}
	w.base, err = a.Manifest(ctx, manifest.Options{})
	must(t, err)
	if w.base.BaseCommit != w.userHead {
		t.Fatalf("base commit %s, want %s", w.base.BaseCommit, w.userHead)
	}
	// Out: files, then the repository from the base bundle.
	_, err = pipe(ctx, a.Dir, stream.PlanFor(nil, w.base), w.box, stream.ApplyOptions{AllowEscapingSymlinks: true})
	must(t, err)
	bundle := filepath.Join(w.boxTmp, "base.bundle")
	must(t, a.BaseBundle(ctx, bundle))
	out, err := exec.Command("/bin/sh", "-c", BoxRepoCommand(w.box, bundle, "s1", a.Base)).CombinedOutput()
	if err != nil {
		t.Fatalf("box repo: %v: %s", err, out)
	}
	if head := synctest.Git(t, w.box, "rev-parse", "HEAD"); head != a.Base {
		t.Fatalf("box HEAD %s, want base %s", head, a.Base)
	}
	if st := synctest.Git(t, w.box, "status", "--porcelain"); st != "" {
		t.Fatalf("box repo not clean at base: %q", st)
	}
	return w
}

// work makes commits and an untracked file on the box and bundles the commits against the base.
func (w *world) work(t *testing.T) string {
	t.Helper()
	synctest.Write(t, w.box, map[string]string{"feature.go": "package main // new\n", "main.go": "package main // changed\n"})
	synctest.Git(t, w.box, "add", "-A")
	synctest.Git(t, w.box, "commit", "-q", "-m", "worker: feature")
	synctest.Write(t, w.box, map[string]string{"lib/more.go": "package lib // second commit\n"})
	synctest.Git(t, w.box, "add", "-A")
	synctest.Git(t, w.box, "commit", "-q", "-m", "worker: more")
	synctest.Write(t, w.box, map[string]string{"notes/untracked.md": "artifact"})
	bundle := filepath.Join(w.boxTmp, "result.bundle")
	synctest.Git(t, w.box, "bundle", "create", "-q", bundle, w.anchor.Base+"..HEAD")
	return bundle
}

func TestGitRoundTrip(t *testing.T) {
	ctx := synctest.Context(t)
	w := dispatch(t)
	bundle := w.work(t)
	boxTip := synctest.Git(t, w.box, "rev-parse", "HEAD")

	tip, err := w.anchor.Adopt(ctx, "sess-1", bundle)
	must(t, err)
	if tip != boxTip {
		t.Fatalf("adopted %s, want %s", tip, boxTip)
	}
	if got := synctest.Git(t, w.anchor.Dir, "rev-parse", "refs/heads/"+w.anchor.Branch); got != boxTip {
		t.Fatalf("managed branch at %s, want %s", got, boxTip)
	}
	if got := synctest.Git(t, w.anchor.Dir, "rev-parse", ResultRefPrefix+"sess-1"); got != boxTip {
		t.Fatalf("result ref at %s", got)
	}
	if got := synctest.Read(t, w.anchor.Dir, "lib/more.go"); got != "package lib // second commit\n" {
		t.Fatalf("worktree not fast-forwarded: %q", got)
	}

	// Untracked work comes back through the manifest diff, against the fast-forwarded anchor.
	now, err := w.anchor.Manifest(ctx, manifest.Options{})
	must(t, err)
	boxM, _, err := manifest.Build(ctx, w.box, manifest.Options{Mode: manifest.ModeGit})
	must(t, err)
	_, err = mirror.Pull(ctx, mirror.Config{Anchor: w.anchor.Dir, Base: now, Box: boxM, Mode: manifest.ModeGit,
		Fetch: func(ctx context.Context, plan stream.Plan, root string, opts stream.ApplyOptions) (stream.Stats, error) {
			return pipe(ctx, w.box, plan, root, opts)
		}})
	must(t, err)
	if got := synctest.Read(t, w.anchor.Dir, "notes/untracked.md"); got != "artifact" {
		t.Fatalf("untracked file did not land: %q", got)
	}

	// The user's checkout: same HEAD, same files.
	if got := synctest.Git(t, w.user, "rev-parse", "HEAD"); got != w.userHead {
		t.Fatalf("user HEAD moved to %s", got)
	}
	after, _, err := manifest.Build(ctx, w.user, manifest.Options{})
	must(t, err)
	if c := manifest.Diff(w.userBefore, after); !c.Empty() {
		t.Fatalf("user checkout changed: %+v", c)
	}
}

func refsAndTree(t *testing.T, a *Anchor) (string, map[string]string) {
	t.Helper()
	refs := synctest.Git(t, a.Dir, "for-each-ref", "--format=%(refname) %(objectname)")
	snap := synctest.Snapshot(t, a.Dir)
	delete(snap, ".git")
	return refs, snap
}

func TestAdoptStopsWhenBranchMoved(t *testing.T) {
	ctx := synctest.Context(t)
	w := dispatch(t)
	bundle := w.work(t)
	// Someone committed on the managed branch meanwhile.
	synctest.Write(t, w.anchor.Dir, map[string]string{"local.txt": "moved"})
	synctest.Git(t, w.anchor.Dir, "add", "local.txt")
	synctest.Git(t, w.anchor.Dir, "commit", "-q", "-m", "local")
	refs, tree := refsAndTree(t, w.anchor)

	_, err := w.anchor.Adopt(ctx, "sess-1", bundle)
	if _, ok := errors.AsType[*DivergedError](err); !ok {
		t.Fatalf("err %v, want *DivergedError", err)
	}
	t.Logf("error: %v", err)
	r2, t2 := refsAndTree(t, w.anchor)
	if refs != r2 || !maps.Equal(tree, t2) {
		t.Fatalf("anchor changed:\n%s\n%s", refs, r2)
	}
}

func TestAdoptRefusesTipNotFromBase(t *testing.T) {
	ctx := synctest.Context(t)
	w := dispatch(t)
	// A worker that rewrote history: an orphan commit.
	synctest.Git(t, w.box, "checkout", "-q", "--orphan", "evil")
	synctest.Write(t, w.box, map[string]string{"main.go": "package main // rewritten\n"})
	synctest.Git(t, w.box, "add", "-A")
	synctest.Git(t, w.box, "commit", "-q", "-m", "rewrite")
	bundle := filepath.Join(w.boxTmp, "evil.bundle")
	synctest.Git(t, w.box, "bundle", "create", "-q", bundle, "evil")
	refs, tree := refsAndTree(t, w.anchor)

	_, err := w.anchor.Adopt(ctx, "sess-1", bundle)
	if _, ok := errors.AsType[*DivergedError](err); !ok {
		t.Fatalf("err %v, want *DivergedError", err)
	}
	r2, t2 := refsAndTree(t, w.anchor)
	if refs != r2 || !maps.Equal(tree, t2) {
		t.Fatal("anchor changed")
	}

	// Garbage is refused by verification.
	junk := filepath.Join(w.boxTmp, "junk.bundle")
	must(t, os.WriteFile(junk, []byte("# v2 git bundle\nnot really\n"), 0o644))
	if _, err := w.anchor.Adopt(ctx, "sess-1", junk); err == nil {
		t.Fatal("garbage bundle adopted")
	}
}

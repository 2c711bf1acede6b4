package gitsync

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/openclaw/cloudworkers/sync/gitexec"
	"github.com/openclaw/cloudworkers/sync/internal/synctest"
	"github.com/openclaw/cloudworkers/sync/manifest"
	"github.com/openclaw/cloudworkers/sync/mirror"
	"github.com/openclaw/cloudworkers/sync/stream"
)

func TestMain(m *testing.M) {
	synctest.Main(m)
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
	pack                    packStats // of the base pack sent to the box
}

// setup varies the user repository that dispatch starts from.
type setup struct {
	history      int               // commits on top of the initial one, each changing one file
	objectFormat string            // "" (sha1) or "sha256"
	anchorEdits  map[string]string // uncommitted changes in the anchor before it is synced out
	status       string            // the box's `git status --porcelain` they should show
}

// dispatch creates the anchor from a user repository and syncs it out to a simulated box: the
// files, then the repository made by BoxRepoCommand from the base pack.
func dispatch(t *testing.T, s setup) *world {
	t.Helper()
	synctest.HaveGit(t)
	ctx := synctest.Context(t)
	tmp := t.TempDir()
	w := &world{user: filepath.Join(tmp, "user"), data: filepath.Join(tmp, "data"), box: filepath.Join(tmp, "box", "ws"), boxTmp: filepath.Join(tmp, "box")}
	initRepo(t, w.user, s.objectFormat, map[string]string{
		".gitignore":       ".env\nbuild/\n",
		".worktreeinclude": ".env\n",
		"main.go":          "package main\n",
		"lib/lib.go":       "package lib\n",
	})
	addHistory(t, w.user, s.history)
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
	synctest.Write(t, a.Dir, s.anchorEdits)
	w.base, err = a.Manifest(ctx, manifest.Options{})
	must(t, err)
	if w.base.BaseCommit != w.userHead {
		t.Fatalf("base commit %s, want %s", w.base.BaseCommit, w.userHead)
	}
	// Out: files, then the repository from the base pack.
	_, err = pipe(ctx, a.Dir, stream.PlanFor(nil, w.base), w.box, stream.ApplyOptions{AllowEscapingSymlinks: true})
	must(t, err)
	pack := filepath.Join(w.boxTmp, "base.pack")
	must(t, a.BasePack(ctx, pack))
	w.pack = inspectPack(t, a.Dir, pack)
	out, err := exec.Command("/bin/sh", "-c", BoxRepoCommand(w.box, pack, "s1", a.Base, Identity{})).CombinedOutput()
	if err != nil {
		t.Fatalf("box repo: %v: %s", err, out)
	}
	if _, err := os.Stat(pack); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("base pack left on the box: %v", err)
	}
	if head := synctest.Git(t, w.box, "rev-parse", "HEAD"); head != a.Base {
		t.Fatalf("box HEAD %s, want base %s", head, a.Base)
	}
	if n := synctest.Git(t, w.box, "rev-list", "--count", "HEAD"); n != "1" {
		t.Fatalf("box history holds %s commits, want only the base", n)
	}
	// untrimmed: " M" is a change in the files only, the index being at the base
	st, err := gitexec.Run(ctx, w.box, "status", "--porcelain")
	must(t, err)
	if string(st) != s.status {
		t.Fatalf("box status %q, want %q", st, s.status)
	}
	return w
}

// initRepo is synctest.InitRepo in the given object format.
func initRepo(t *testing.T, dir, objectFormat string, files map[string]string) {
	t.Helper()
	if objectFormat == "" {
		synctest.InitRepo(t, dir, files)
		return
	}
	must(t, os.MkdirAll(dir, 0o755))
	synctest.Git(t, dir, "init", "-q", "-b", "main", "--object-format="+objectFormat)
	synctest.Write(t, dir, files)
	synctest.Git(t, dir, "add", "-A")
	synctest.Git(t, dir, "commit", "-q", "-m", "initial")
}

// addHistory adds n commits to the branch checked out in dir, commit i rewriting history/f<i%10>
// with text of its own, through one `git fast-import`.
func addHistory(t *testing.T, dir string, n int) {
	t.Helper()
	if n == 0 {
		return
	}
	var b strings.Builder
	data := func(s string) { fmt.Fprintf(&b, "data %d\n%s\n", len(s), s) }
	for i := 1; i <= n; i++ {
		fmt.Fprintf(&b, "commit refs/heads/main\ncommitter Test <test@example.invalid> %d +0000\n", 1700000000+i)
		data(fmt.Sprintf("change %d", i))
		if i == 1 {
			fmt.Fprintf(&b, "from %s\n", synctest.Git(t, dir, "rev-parse", "HEAD"))
		}
		var body strings.Builder
		for l := range 40 {
			fmt.Fprintf(&body, "line %d of change %d: %x\n", l, i, sha256.Sum256(fmt.Appendf(nil, "%d/%d", i, l)))
		}
		fmt.Fprintf(&b, "M 100644 inline history/f%d.txt\n", i%10)
		data(body.String())
	}
	if _, err := gitexec.RunInput(synctest.Context(t), dir, []byte(b.String()), "fast-import", "--quiet"); err != nil {
		t.Fatal(err)
	}
	synctest.Git(t, dir, "reset", "-q", "--hard")
}

// packStats is what a pack file holds.
type packStats struct {
	size    int64
	objects map[string]int // by type: commit, tree, blob, tag
}

// inspectPack indexes a copy of pack (in repo's object format) and counts its objects.
func inspectPack(t *testing.T, repo, pack string) packStats {
	t.Helper()
	data, err := os.ReadFile(pack)
	must(t, err)
	cp := filepath.Join(t.TempDir(), "p.pack")
	must(t, os.WriteFile(cp, data, 0o600))
	synctest.Git(t, repo, "index-pack", cp)
	st := packStats{size: int64(len(data)), objects: map[string]int{}}
	for _, line := range strings.Split(synctest.Git(t, repo, "verify-pack", "-v", strings.TrimSuffix(cp, ".pack")+".idx"), "\n") {
		if f := strings.Fields(line); len(f) >= 5 {
			switch f[1] {
			case "commit", "tree", "blob", "tag":
				st.objects[f[1]]++
			}
		}
	}
	return st
}

// work makes commits and an untracked file on the box and bundles the commits against the base
// with BoxBundleCommand.
func (w *world) work(t *testing.T) string {
	t.Helper()
	synctest.Write(t, w.box, map[string]string{"feature.go": "package main // new\n", "main.go": "package main // changed\n"})
	synctest.Git(t, w.box, "add", "-A")
	synctest.Git(t, w.box, "commit", "-q", "-m", "worker: feature")
	synctest.Write(t, w.box, map[string]string{"lib/more.go": "package lib // second commit\n"})
	synctest.Git(t, w.box, "add", "-A")
	synctest.Git(t, w.box, "commit", "-q", "-m", "worker: more")
	synctest.Write(t, w.box, map[string]string{"notes/untracked.md": "artifact"})
	return w.bundle(t)
}

// bundle bundles the box's commits against the base with BoxBundleCommand.
func (w *world) bundle(t *testing.T) string {
	t.Helper()
	bundle := filepath.Join(w.boxTmp, "result.bundle")
	f, err := os.Create(bundle)
	must(t, err)
	var stderr strings.Builder
	cmd := exec.Command("/bin/sh", "-c", BoxBundleCommand(w.box, w.anchor.Base))
	cmd.Stdout, cmd.Stderr = f, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("box bundle: %v: %s", err, stderr.String())
	}
	must(t, f.Close())
	return bundle
}

// TestShallowBase checks the box's repository made from the base pack: only the base commit, the
// anchor's uncommitted changes still uncommitted, the worker's commits adopted by fast-forward,
// and a pack whose size does not grow with the history.
func TestShallowBase(t *testing.T) {
	edits := map[string]string{"lib/lib.go": "package lib // edited, not committed\n", "scratch.txt": "new"}
	for _, tc := range []struct {
		name string
		setup
	}{
		{"root commit", setup{}},
		{"root commit with uncommitted changes", setup{anchorEdits: edits, status: " M lib/lib.go\n?? scratch.txt\n"}},
		{"long history", setup{history: 200, anchorEdits: edits, status: " M lib/lib.go\n?? scratch.txt\n"}},
		{"sha256", setup{history: 3, objectFormat: "sha256"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := synctest.Context(t)
			w := dispatch(t, tc.setup)
			a := w.anchor

			tree := strings.Split(synctest.Git(t, a.Dir, "ls-tree", "-r", "-t", a.Base), "\n")
			wantObjects := 1 + 1 + len(tree) // the commit, its root tree, everything under it
			total := w.pack.objects["commit"] + w.pack.objects["tree"] + w.pack.objects["blob"] + w.pack.objects["tag"]
			if w.pack.objects["commit"] != 1 || total != wantObjects {
				t.Fatalf("base pack holds %v, want 1 commit and %d objects in all", w.pack.objects, wantObjects)
			}
			if tc.history > 0 {
				full := filepath.Join(t.TempDir(), "full.bundle")
				synctest.Git(t, a.Dir, "bundle", "create", "-q", full, "refs/heads/"+a.Branch)
				fi, err := os.Stat(full)
				must(t, err)
				t.Logf("%d commits of history: base pack %d bytes, full-history bundle %d bytes", tc.history+1, w.pack.size, fi.Size())
				if w.pack.size >= fi.Size() {
					t.Fatalf("base pack of %d bytes, not smaller than the full-history bundle of %d", w.pack.size, fi.Size())
				}
			}
			if got := synctest.Git(t, w.box, "rev-parse", "--is-shallow-repository"); got != "true" {
				t.Fatalf("box repository shallow: %s", got)
			}
			synctest.Git(t, w.box, "fsck", "--no-progress")

			if tc.anchorEdits != nil {
				// the worker commits on top of the base without the anchor's uncommitted edits
				synctest.Git(t, w.box, "stash", "-q", "-u")
			}
			bundle := w.work(t)
			boxTip := synctest.Git(t, w.box, "rev-parse", "HEAD")
			tip, err := a.Adopt(ctx, "sess-1", bundle)
			must(t, err)
			if tip != boxTip {
				t.Fatalf("adopted %s, want %s", tip, boxTip)
			}
			if got := synctest.Git(t, a.Dir, "rev-parse", "refs/heads/"+a.Branch); got != boxTip {
				t.Fatalf("managed branch at %s, want %s", got, boxTip)
			}
			if got := synctest.Git(t, a.Dir, "rev-list", "--count", a.Base+".."+boxTip); got != "2" {
				t.Fatalf("%s commits adopted, want 2", got)
			}
		})
	}
}

func TestGitRoundTrip(t *testing.T) {
	ctx := synctest.Context(t)
	w := dispatch(t, setup{})
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
	w := dispatch(t, setup{})
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
	w := dispatch(t, setup{})
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

// TestAnchorFillsSubmodules: the managed worktree gets each submodule's files at the commit the
// base records, from the user's checkout of it (which has moved on since), without a repository
// of their own: the anchor's git status stays clean and its manifest does not list them. A
// submodule the user has not checked out stays empty. The user's checkout is untouched.
func TestAnchorFillsSubmodules(t *testing.T) {
	synctest.HaveGit(t)
	ctx := synctest.Context(t)
	tmp := t.TempDir()
	user := userWithSubmodules(t, tmp, "lib", "gone")
	synctest.Git(t, user, "submodule", "deinit", "--quiet", "-f", "third_party/gone")
	moveSubmodule(t, user, "lib")
	userBefore := synctest.SnapshotWithoutGit(t, user)

	a, err := CreateAnchor(ctx, user, filepath.Join(tmp, "data"), "subs", "")
	must(t, err)
	if got := synctest.Read(t, a.Dir, "third_party/lib/lib.go"); got != "package lib // v1\n" {
		t.Fatalf("submodule in the anchor: %q, want the recorded v1", got)
	}
	if des, err := os.ReadDir(filepath.Join(a.Dir, "third_party", "gone")); err != nil || len(des) != 0 {
		t.Fatalf("a submodule not checked out by the user: %v %v, want an empty directory", des, err)
	}
	subs, err := a.FillSubmodules(ctx)
	must(t, err)
	if len(subs) != 1 || subs[0].Path != "third_party/lib" || len(subs[0].Commit) < 40 {
		t.Fatalf("filled submodules %+v", subs)
	}
	// Filled once: a file changed in the anchor's copy stays (it is the session's workspace)...
	synctest.Write(t, a.Dir, map[string]string{"third_party/lib/lib.go": "package lib // edited in the anchor\n"})
	_, err = a.FillSubmodules(ctx)
	must(t, err)
	if got := synctest.Read(t, a.Dir, "third_party/lib/lib.go"); got != "package lib // edited in the anchor\n" {
		t.Fatalf("a filled submodule was filled again: %q", got)
	}
	// ...a fill that stopped after its rename (recorded as pending) is redone, and the staging
	// directory of one that stopped before is removed...
	must(t, os.WriteFile(a.Dir+".submodules.json", []byte(`{"third_party/lib":"pending"}`), 0o600))
	crashed := filepath.Join(filepath.Dir(a.Dir), "."+filepath.Base(a.Dir)+".fill-123")
	must(t, os.MkdirAll(filepath.Join(crashed, "tree"), 0o700))
	_, err = a.FillSubmodules(ctx)
	must(t, err)
	if _, err := os.Stat(crashed); !os.IsNotExist(err) {
		t.Fatalf("a crashed fill's staging directory is still there (%v)", err)
	}
	if synctest.Read(t, a.Dir, "third_party/lib/lib.go") != "package lib // v1\n" {
		t.Fatal("a pending fill was not redone")
	}
	// ...and files at a submodule's path that no fill put there are left alone, not sent.
	must(t, os.Remove(a.Dir+".submodules.json"))
	synctest.Write(t, a.Dir, map[string]string{"third_party/lib/mine.txt": "someone's"})
	subs, err = a.FillSubmodules(ctx)
	must(t, err)
	if len(subs) != 0 || synctest.Read(t, a.Dir, "third_party/lib/mine.txt") != "someone's" {
		t.Fatalf("unrecorded files at a submodule's path: filled %+v, mine.txt %q", subs, synctest.Read(t, a.Dir, "third_party/lib/mine.txt"))
	}
	if st := synctest.Git(t, a.Dir, "status", "--porcelain", "--ignored"); st != "" {
		t.Fatalf("anchor status %q, want clean", st)
	}
	m, err := a.Manifest(ctx, manifest.Options{})
	must(t, err)
	for _, p := range manifest.Paths(m.Entries) {
		if strings.HasPrefix(p, "third_party/lib") || strings.HasPrefix(p, "third_party/gone") {
			t.Fatalf("anchor manifest lists %s", p)
		}
	}
	if !maps.Equal(userBefore, synctest.SnapshotWithoutGit(t, user)) {
		t.Fatal("the user's checkout changed")
	}
}

// addSubmodule makes the repository <tmp>/<name> holding <name>.go at v1 and adds it to the
// user's repository as third_party/<name>, not committed yet.
// userWithSubmodules makes the user's repository tmp/user with one file and, committed, a
// submodule third_party/<name> for each name (addSubmodule).
func userWithSubmodules(t *testing.T, tmp string, names ...string) string {
	t.Helper()
	user := filepath.Join(tmp, "user")
	synctest.InitRepo(t, user, map[string]string{"main.go": "package main\n"})
	for _, name := range names {
		addSubmodule(t, tmp, user, name)
	}
	synctest.Git(t, user, "commit", "--quiet", "-m", "submodules")
	return user
}

func addSubmodule(t *testing.T, tmp, user, name string) {
	t.Helper()
	dir := filepath.Join(tmp, name)
	synctest.InitRepo(t, dir, map[string]string{name + ".go": "package " + name + " // v1\n"})
	synctest.Git(t, user, "submodule", "add", "--quiet", dir, "third_party/"+name)
}

// moveSubmodule commits v2 of <name>.go in the user's checkout of third_party/<name> (the
// superproject still records v1) and returns that commit.
func moveSubmodule(t *testing.T, user, name string) string {
	t.Helper()
	dir := filepath.Join(user, "third_party", name)
	synctest.Write(t, dir, map[string]string{name + ".go": "package " + name + " // v2\n"})
	synctest.Git(t, dir, "commit", "--quiet", "-am", "v2")
	return synctest.Git(t, dir, "rev-parse", "HEAD")
}

// TestAdoptFollowsSubmoduleChanges: a worker commit that moves a submodule to another commit gets
// the anchor's copy refilled at it (from the user's checkout); one that turns the submodule into
// plain files (vendors it) is adopted, the filled copy giving way to the committed files.
func TestAdoptFollowsSubmoduleChanges(t *testing.T) {
	synctest.HaveGit(t)
	ctx := synctest.Context(t)
	tmp := t.TempDir()
	user := userWithSubmodules(t, tmp, "lib")
	v2 := moveSubmodule(t, user, "lib")

	const vendor = "git rm -q --cached third_party/lib && mkdir -p third_party/lib && printf 'package lib // vendored\\n' > third_party/lib/lib.go && git add third_party/lib/lib.go"
	for _, tc := range []struct {
		name, work, want string
		dirty            bool // main.go edited in the anchor, and by the worker: the fast-forward fails
	}{
		{"moved to v2", "git update-index --cacheinfo 160000," + v2 + ",third_party/lib", "package lib // v2\n", false},
		{"vendored", vendor, "package lib // vendored\n", false},
		{"vendored, fast-forward refused", vendor + " && echo 'package main // worker' > main.go && git add main.go", "package lib // v1\n", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			name := strings.NewReplacer(" ", "-", ",", "").Replace(tc.name)
			created, err := CreateAnchor(ctx, user, filepath.Join(tmp, "data"), name, "")
			must(t, err)
			// As dispatch reopens it after a pull-back: the session's workspace is the anchor.
			a := &Anchor{Repo: created.Dir, Dir: created.Dir, Name: created.Name, Branch: created.Branch, Base: created.Base}
			if tc.dirty {
				synctest.Write(t, a.Dir, map[string]string{"main.go": "package main // edited in the anchor\n"})
			}
			box := filepath.Join(t.TempDir(), "box")
			synctest.Git(t, tmp, "clone", "-q", user, box)
			cmd := exec.Command("sh", "-c", tc.work+" && git -c user.name=w -c user.email=w@box.invalid commit -qm work")
			cmd.Dir = box
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("worker commit: %v %s", err, out)
			}
			bundle := filepath.Join(t.TempDir(), "b.bundle")
			synctest.Git(t, box, "bundle", "create", "-q", bundle, a.Base+"..HEAD")
			tip, err := a.Adopt(ctx, "s-"+name, bundle)
			if tc.dirty {
				if err == nil {
					t.Fatal("fast-forward over an edited main.go succeeded")
				}
				if got := synctest.Read(t, a.Dir, "third_party/lib/lib.go"); got != tc.want {
					t.Fatalf("after a refused fast-forward, third_party/lib/lib.go %q, want %q back", got, tc.want)
				}
				if subs, err := a.FillSubmodules(ctx); err != nil || len(subs) != 1 {
					t.Fatalf("after a refused fast-forward: filled %+v %v, want the submodule still ours", subs, err)
				}
				return
			}
			must(t, err)
			if tip != synctest.Git(t, box, "rev-parse", "HEAD") {
				t.Fatalf("adopted %s", tip)
			}
			if got := synctest.Read(t, a.Dir, "third_party/lib/lib.go"); got != tc.want {
				t.Fatalf("anchor's third_party/lib/lib.go %q, want %q", got, tc.want)
			}
			if st := synctest.Git(t, a.Dir, "status", "--porcelain"); st != "" {
				t.Fatalf("anchor status %q after adopting", st)
			}
			if tc.name != "vendored" {
				return
			}
			// An adoption that stopped after its fast-forward left the record saying the directory
			// is a submodule copy: the next adoption goes by HEAD, and the tracked files stay.
			must(t, os.WriteFile(a.Dir+".submodules.json", []byte(`{"third_party/lib":"`+created.Base+`"}`), 0o600))
			cmd = exec.Command("sh", "-c", "echo 'package main // second' > main.go && git -c user.name=w -c user.email=w@box.invalid commit -qam second")
			cmd.Dir = box
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("second worker commit: %v %s", err, out)
			}
			synctest.Git(t, box, "bundle", "create", "-q", bundle, a.Base+"..HEAD")
			_, err = a.Adopt(ctx, "s-"+name, bundle)
			must(t, err)
			if got := synctest.Read(t, a.Dir, "third_party/lib/lib.go"); got != tc.want {
				t.Fatalf("after a second adoption with a stale record: lib.go %q", got)
			}
			if st := synctest.Git(t, a.Dir, "status", "--porcelain"); st != "" {
				t.Fatalf("anchor status %q after the second adoption", st)
			}
		})
	}
}

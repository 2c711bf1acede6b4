package checkpoint

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/openclaw/cloudworkers/sync/gitsync"
	"github.com/openclaw/cloudworkers/sync/internal/synctest"
	"github.com/openclaw/cloudworkers/sync/manifest"
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

// fixedClock returns a clock that moves one second per call.
func fixedClock() func() time.Time {
	now := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	return func() time.Time { now = now.Add(time.Second); return now }
}

// gitAnchor creates a user repository and its managed worktree.
func gitAnchor(t *testing.T) (user string, a *gitsync.Anchor) {
	t.Helper()
	synctest.HaveGit(t)
	ctx := synctest.Context(t)
	tmp := t.TempDir()
	user = filepath.Join(tmp, "user")
	synctest.InitRepo(t, user, map[string]string{
		".gitignore":       ".env\nbuild/\n",
		".worktreeinclude": ".env\n",
		"main.go":          "package main\n",
		"lib/lib.go":       "package lib\n",
		"old.txt":          "to be deleted",
	})
	synctest.Write(t, user, map[string]string{".env": "TOKEN=local"})
	a, err := gitsync.CreateAnchor(ctx, user, filepath.Join(tmp, "data"), "s1", "")
	must(t, err)
	return user, a
}

// repoState is what a checkpoint must not change: refs other than checkpoints, HEAD, the index
// and the status of the worktree.
func repoState(t *testing.T, dir string) string {
	t.Helper()
	refs := synctest.Git(t, dir, "for-each-ref", "--format=%(refname) %(objectname)", "refs/heads", "refs/openclaw/worker-results")
	return strings.Join([]string{refs, synctest.Git(t, dir, "rev-parse", "HEAD"),
		synctest.Git(t, dir, "ls-files", "-s", "--debug"), synctest.Git(t, dir, "status", "--porcelain", "--ignored")}, "\n--\n")
}

func TestGitCheckpointCreateListRestore(t *testing.T) {
	ctx := synctest.Context(t)
	user, a := gitAnchor(t)
	userBefore := synctest.SnapshotWithoutGit(t, user)
	s, err := New(Config{Mode: manifest.ModeGit, Anchor: a.Dir, Session: "sess-1", Now: fixedClock()})
	must(t, err)
	if _, err := s.Latest(ctx); !errors.Is(err, ErrNone) {
		t.Fatalf("Latest on no checkpoint: %v", err)
	}

	// A turn's work: a modified tracked file, a staged new file, an untracked file, a deleted
	// tracked file, and ignored build output.
	synctest.Write(t, a.Dir, map[string]string{"main.go": "package main // turn 1\n", "staged.go": "package staged\n",
		"notes/todo.md": "untracked", "build/out.o": "ignored"})
	must(t, os.Remove(filepath.Join(a.Dir, "old.txt")))
	synctest.Git(t, a.Dir, "add", "staged.go")
	must(t, os.Symlink("lib/lib.go", filepath.Join(a.Dir, "link")))
	before := repoState(t, a.Dir)

	cp1, _, err := s.Create(ctx)
	must(t, err)
	if after := repoState(t, a.Dir); after != before {
		t.Fatalf("checkpoint changed the anchor's refs, index or status:\n%s\n----\n%s", before, after)
	}
	if cp1.Seq != 1 || cp1.Ref != RefPrefix+"sess-1/1" || cp1.Parent != a.Base {
		t.Fatalf("checkpoint %+v", cp1)
	}
	if got := synctest.Git(t, a.Dir, "rev-parse", cp1.Ref); got != cp1.Commit {
		t.Fatalf("ref at %s, want %s", got, cp1.Commit)
	}
	tree := synctest.Git(t, a.Dir, "ls-tree", "-r", "--name-only", cp1.Commit)
	if want := ".env\n.gitignore\n.worktreeinclude\nlib/lib.go\nlink\nmain.go\nnotes/todo.md\nstaged.go"; tree != want {
		t.Fatalf("checkpoint tree:\n%s\nwant:\n%s", tree, want)
	}
	if got := synctest.Git(t, a.Dir, "show", cp1.Commit+":main.go"); got != "package main // turn 1" {
		t.Fatalf("main.go in checkpoint: %q", got)
	}

	// The next turn, and a second store on the same anchor (a restarted gateway) continues the numbering.
	synctest.Write(t, a.Dir, map[string]string{"main.go": "package main // turn 2\n", "turn2.txt": "2"})
	s2, err := New(Config{Mode: manifest.ModeGit, Anchor: a.Dir, Session: "sess-1", Now: fixedClock()})
	must(t, err)
	cp2, _, err := s2.Create(ctx)
	must(t, err)
	all, err := s.List(ctx)
	must(t, err)
	if len(all) != 2 || all[0].Commit != cp1.Commit || all[1].Commit != cp2.Commit || cp2.Seq != 2 {
		t.Fatalf("list %+v", all)
	}
	if latest, err := s.Latest(ctx); err != nil || latest.Commit != cp2.Commit {
		t.Fatalf("latest %+v %v", latest, err)
	}
	// Another session's checkpoints are not listed.
	other, err := New(Config{Mode: manifest.ModeGit, Anchor: a.Dir, Session: "sess-10"})
	must(t, err)
	if l, err := other.List(ctx); err != nil || len(l) != 0 {
		t.Fatalf("other session lists %+v %v", l, err)
	}

	// Restore into a fresh directory: exactly checkpoint 1's tree.
	fresh := filepath.Join(t.TempDir(), "restored")
	_, err = s.Restore(ctx, cp1, fresh)
	must(t, err)
	got := synctest.Snapshot(t, fresh)
	if got["main.go"] != "-rw-r--r--:package main // turn 1\n" || got["notes/todo.md"] != "-rw-r--r--:untracked" ||
		got["link"] != "link:lib/lib.go" || got[".env"] == "" {
		t.Fatalf("restored tree %v", got)
	}
	for _, p := range []string{"turn2.txt", "build/out.o", "old.txt"} {
		if _, ok := got[p]; ok {
			t.Fatalf("restored tree holds %s", p)
		}
	}

	// Restore into the anchor itself: back to turn 1; ignored build output stays.
	_, err = s.Restore(ctx, cp1, a.Dir)
	must(t, err)
	if synctest.Read(t, a.Dir, "main.go") != "package main // turn 1\n" || synctest.Read(t, a.Dir, "turn2.txt") != "<missing>" ||
		synctest.Read(t, a.Dir, "build/out.o") != "ignored" {
		t.Fatal("anchor not restored to checkpoint 1")
	}
	if !maps.Equal(userBefore, synctest.SnapshotWithoutGit(t, user)) {
		t.Fatal("the user's checkout changed")
	}
}

func TestPlainCheckpointDedupeAndRestore(t *testing.T) {
	ctx := synctest.Context(t)
	anchor, data := t.TempDir(), t.TempDir()
	synctest.Write(t, anchor, map[string]string{"a.txt": "same", "b.txt": "same", "src/x.go": "x", "build/out": "excluded"})
	must(t, os.Symlink("src/x.go", filepath.Join(anchor, "link")))
	s, err := New(Config{Mode: manifest.ModePlain, Anchor: anchor, DataDir: data, Session: "plain-1", Exclude: []string{"build/"}, Now: fixedClock()})
	must(t, err)

	cp1, st, err := s.Create(ctx)
	must(t, err)
	if st.NewBlobs != 2 || cp1.Files != 4 { // "same" once, "x"; and a.txt, b.txt, x.go, link
		t.Fatalf("first checkpoint %+v stored %+v", cp1, st)
	}
	m1, _, err := manifest.Build(ctx, anchor, manifest.Options{Exclude: []string{"build/"}})
	must(t, err)

	// Turn 2 changes one file: only that blob is new.
	synctest.Write(t, anchor, map[string]string{"src/x.go": "x changed", "new.txt": "same"})
	must(t, os.Remove(filepath.Join(anchor, "a.txt")))
	cp2, st, err := s.Create(ctx)
	must(t, err)
	if st.NewBlobs != 1 || st.NewBytes != int64(len("x changed")) || cp2.Seq != 2 {
		t.Fatalf("second checkpoint %+v stored %+v", cp2, st)
	}
	blobs := 0
	filepath.WalkDir(filepath.Join(s.Dir(), "blobs"), func(_ string, d os.DirEntry, _ error) error {
		if d != nil && d.Type().IsRegular() {
			blobs++
		}
		return nil
	})
	if blobs != 3 {
		t.Fatalf("%d blobs stored, want 3", blobs)
	}

	// A new store (gateway restart) lists both; restore 1 over the anchor.
	s2, err := New(Config{Mode: manifest.ModePlain, Anchor: anchor, DataDir: data, Session: "plain-1", Exclude: []string{"build/"}})
	must(t, err)
	latest, err := s2.Latest(ctx)
	must(t, err)
	if latest.Seq != 2 || latest.Files != cp2.Files {
		t.Fatalf("latest %+v", latest)
	}
	_, err = s2.Restore(ctx, cp1, anchor)
	must(t, err)
	now, _, err := manifest.Build(ctx, anchor, manifest.Options{Exclude: []string{"build/"}})
	must(t, err)
	if c := manifest.Diff(m1, now); !c.Empty() {
		t.Fatalf("anchor not at checkpoint 1: %+v", c)
	}
	if synctest.Read(t, anchor, "build/out") != "excluded" {
		t.Fatal("restore deleted an excluded file")
	}
	// And checkpoint 2 into an empty directory.
	fresh := filepath.Join(t.TempDir(), "r")
	_, err = s2.Restore(ctx, latest, fresh)
	must(t, err)
	if synctest.Read(t, fresh, "src/x.go") != "x changed" || synctest.Read(t, fresh, "a.txt") != "<missing>" {
		t.Fatal("fresh restore of checkpoint 2 wrong")
	}
}

func TestPlainRestoreRefusesCorruptBlob(t *testing.T) {
	ctx := synctest.Context(t)
	anchor, data := t.TempDir(), t.TempDir()
	synctest.Write(t, anchor, map[string]string{"a.txt": "a", "b.txt": "b"})
	s, err := New(Config{Mode: manifest.ModePlain, Anchor: anchor, DataDir: data, Session: "p"})
	must(t, err)
	cp, _, err := s.Create(ctx)
	must(t, err)
	synctest.Write(t, anchor, map[string]string{"a.txt": "later"})
	before := synctest.Snapshot(t, anchor)

	sum := "ca978112ca1bbdcafac231b39a23dc4da786eff8147c4e72b9807785afee48bb" // sha256("a")
	blob := s.blobPath(sum)
	must(t, os.Chmod(blob, 0o600))
	must(t, os.WriteFile(blob, []byte("b"), 0o600))
	if _, err := s.Restore(ctx, cp, anchor); err == nil {
		t.Fatal("restore from a corrupt blob succeeded")
	}
	must(t, os.Remove(blob))
	_, err = s.Restore(ctx, cp, anchor)
	if err == nil || !strings.Contains(err.Error(), "blobs missing") {
		t.Fatalf("restore with a missing blob: %v", err)
	}
	if !maps.Equal(before, synctest.Snapshot(t, anchor)) {
		t.Fatal("a refused restore changed the anchor")
	}
}

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
	}{
		{"session with a slash", Config{Mode: manifest.ModeGit, Anchor: "/x", Session: "a/b"}},
		{"session with ..", Config{Mode: manifest.ModeGit, Anchor: "/x", Session: "a..b"}},
		{"plain without data dir", Config{Mode: manifest.ModePlain, Anchor: "/x", Session: "s"}},
		{"no anchor", Config{Mode: manifest.ModeGit, Session: "s"}},
		{"unknown mode", Config{Mode: "svn", Anchor: "/x", Session: "s"}},
		{"negative keep", Config{Mode: manifest.ModeGit, Anchor: "/x", Session: "s", Keep: -1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := New(tc.cfg); err == nil {
				t.Fatal("accepted")
			}
		})
	}
}

// storedBlobs counts the files in a plain store's blob directory.
func storedBlobs(t *testing.T, s *Store) int {
	t.Helper()
	n := 0
	must(t, filepath.WalkDir(filepath.Join(s.Dir(), "blobs"), func(_ string, d os.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			n++
		}
		return err
	}))
	return n
}

// TestPlainPruneKeepsTheNewest: five turns, Keep 2: Prune drops checkpoints 1–3 and every blob
// only they held (the content of turns 1–3 of x.go, a leftover temporary copy), keeps what the
// newest two hold, numbering goes on after them, and both restore exactly.
func TestPlainPruneKeepsTheNewest(t *testing.T) {
	ctx := synctest.Context(t)
	anchor, data := t.TempDir(), t.TempDir()
	synctest.Write(t, anchor, map[string]string{"same.txt": "unchanged all along"})
	s, err := New(Config{Mode: manifest.ModePlain, Anchor: anchor, DataDir: data, Session: "plain-2", Keep: 2, Now: fixedClock()})
	must(t, err)
	var trees []*manifest.Manifest
	for turn := 1; turn <= 5; turn++ {
		synctest.Write(t, anchor, map[string]string{"x.go": fmt.Sprintf("turn %d", turn)})
		_, _, err := s.Create(ctx)
		must(t, err)
		m, _, err := manifest.Build(ctx, anchor, manifest.Options{})
		must(t, err)
		trees = append(trees, m)
	}
	if n := storedBlobs(t, s); n != 6 {
		t.Fatalf("%d blobs before pruning, want 6", n)
	}
	must(t, os.MkdirAll(filepath.Join(s.Dir(), "blobs", "00"), 0o700))
	must(t, os.WriteFile(filepath.Join(s.Dir(), "blobs", "00", ".tmp-interrupted"), []byte("half a copy"), 0o600))

	removed, err := s.Prune(ctx)
	must(t, err)
	if len(removed) != 3 || removed[0].Seq != 1 || removed[2].Seq != 3 {
		t.Fatalf("pruned %+v, want checkpoints 1-3", removed)
	}
	all, err := s.List(ctx)
	must(t, err)
	if len(all) != 2 || all[0].Seq != 4 || all[1].Seq != 5 {
		t.Fatalf("left %+v, want checkpoints 4 and 5", all)
	}
	if n := storedBlobs(t, s); n != 3 { // same.txt, turn 4, turn 5
		t.Fatalf("%d blobs after pruning, want 3", n)
	}
	if again, err := s.Prune(ctx); err != nil || len(again) != 0 {
		t.Fatalf("second prune: %+v %v", again, err)
	}
	for i, cp := range all {
		dir := filepath.Join(t.TempDir(), "r")
		_, err := s.Restore(ctx, cp, dir)
		must(t, err)
		got, _, err := manifest.Build(ctx, dir, manifest.Options{})
		must(t, err)
		if c := manifest.Diff(trees[3+i], got); !c.Empty() {
			t.Fatalf("checkpoint %d restores %+v off", cp.Seq, c)
		}
	}
	cp6, _, err := s.Create(ctx)
	must(t, err)
	if cp6.Seq != 6 {
		t.Fatalf("next checkpoint after pruning is %d, want 6", cp6.Seq)
	}
}

// TestGitPruneDeletesOldRefs: Keep 1 leaves only the newest checkpoint's ref; the anchor's own
// refs, HEAD and index are untouched, and the kept checkpoint restores.
func TestGitPruneDeletesOldRefs(t *testing.T) {
	ctx := synctest.Context(t)
	_, a := gitAnchor(t)
	s, err := New(Config{Mode: manifest.ModeGit, Anchor: a.Dir, Session: "sess-p", Keep: 1, Now: fixedClock()})
	must(t, err)
	for turn := 1; turn <= 3; turn++ {
		synctest.Write(t, a.Dir, map[string]string{"main.go": fmt.Sprintf("package main // turn %d\n", turn)})
		_, _, err := s.Create(ctx)
		must(t, err)
	}
	before := repoState(t, a.Dir)
	removed, err := s.Prune(ctx)
	must(t, err)
	if len(removed) != 2 {
		t.Fatalf("pruned %+v, want 2", removed)
	}
	if refs := synctest.Git(t, a.Dir, "for-each-ref", "--format=%(refname)", RefPrefix); refs != RefPrefix+"sess-p/3" {
		t.Fatalf("checkpoint refs left: %q", refs)
	}
	if after := repoState(t, a.Dir); after != before {
		t.Fatalf("pruning changed the anchor:\n%s\n----\n%s", before, after)
	}
	latest, err := s.Latest(ctx)
	must(t, err)
	dir := filepath.Join(t.TempDir(), "r")
	_, err = s.Restore(ctx, latest, dir)
	must(t, err)
	if got := synctest.Read(t, dir, "main.go"); got != "package main // turn 3\n" {
		t.Fatalf("restored main.go %q", got)
	}
}

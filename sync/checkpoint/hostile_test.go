package checkpoint

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/openclaw/cloudworkers/sync/internal/synctest"
	"github.com/openclaw/cloudworkers/sync/manifest"
)

// TestRestoreRefusesEscapingSymlink: a checkpoint holding a symlink out of the tree (a worker's,
// as it came back) is not restored, in either mode: the refusal names the link and nothing is
// written, neither the link nor the checkpoint's other files. A link the target still holds is
// no change, and stays.
func TestRestoreRefusesEscapingSymlink(t *testing.T) {
	for _, tc := range []struct {
		name, link, target string
	}{
		{"absolute", "out", "/etc/shadow"},
		{"climbing out", "lib/up", "../../../../root"},
	} {
		for _, mode := range []manifest.Mode{manifest.ModeGit, manifest.ModePlain} {
			t.Run(string(mode)+" "+tc.name, func(t *testing.T) {
				ctx := synctest.Context(t)
				var cfg Config
				if mode == manifest.ModeGit {
					_, a := gitAnchor(t)
					cfg = Config{Mode: mode, Anchor: a.Dir, Session: "sess-1", Now: fixedClock()}
				} else {
					anchor := t.TempDir()
					synctest.Write(t, anchor, map[string]string{"main.go": "package main\n", "lib/lib.go": "package lib\n"})
					cfg = Config{Mode: mode, Anchor: anchor, DataDir: t.TempDir(), Session: "plain-1", Now: fixedClock()}
				}
				s, err := New(cfg)
				must(t, err)
				// Kept across the restore: the target holds it as the checkpoint does.
				must(t, os.Symlink("/usr/lib", filepath.Join(cfg.Anchor, "usrlib")))
				must(t, os.Symlink(tc.target, filepath.Join(cfg.Anchor, filepath.FromSlash(tc.link))))
				synctest.Write(t, cfg.Anchor, map[string]string{"main.go": "package main // turn 1\n"})
				cp, _, err := s.Create(ctx)
				must(t, err)

				must(t, os.Remove(filepath.Join(cfg.Anchor, filepath.FromSlash(tc.link))))
				synctest.Write(t, cfg.Anchor, map[string]string{"main.go": "package main // turn 2\n"})
				before := synctest.SnapshotWithoutGit(t, cfg.Anchor)
				_, err = s.Restore(ctx, cp, cfg.Anchor)
				if err == nil || !strings.Contains(err.Error(), tc.link) {
					t.Fatalf("restore: %v, want a refusal naming %s", err, tc.link)
				}
				t.Logf("refused: %v", err)
				after := synctest.SnapshotWithoutGit(t, cfg.Anchor)
				if len(after) != len(before) || after["main.go"] != before["main.go"] || after["usrlib"] != "link:/usr/lib" {
					t.Fatalf("a refused restore wrote into the target:\n%v\nwas\n%v", after, before)
				}
				for p, v := range before {
					if after[p] != v {
						t.Fatalf("a refused restore changed %s: %q, was %q", p, after[p], v)
					}
				}

				// Without the escaping link, the same target takes a checkpoint with usrlib in it.
				must(t, os.Symlink("lib/lib.go", filepath.Join(cfg.Anchor, "inside")))
				cp2, _, err := s.Create(ctx)
				must(t, err)
				synctest.Write(t, cfg.Anchor, map[string]string{"main.go": "package main // turn 3\n"})
				_, err = s.Restore(ctx, cp2, cfg.Anchor)
				must(t, err)
				if got := synctest.Read(t, cfg.Anchor, "main.go"); got != "package main // turn 2\n" {
					t.Fatalf("main.go %q after restoring checkpoint 2", got)
				}
			})
		}
	}
}

// TestGitCheckpointRunsNoFilter: a filter driver that the gateway's configuration defines and a
// worker's .gitattributes in the anchor names runs neither when a checkpoint is taken (clean)
// nor when it is restored (smudge); the files are stored and restored byte for byte.
func TestGitCheckpointRunsNoFilter(t *testing.T) {
	ctx := synctest.Context(t)
	user, a := gitAnchor(t)
	marker := filepath.Join(t.TempDir(), "ran")
	run := "sh -c 'echo ran >> " + marker + "; tr a-z A-Z'"
	for k, v := range map[string]string{"filter.shout.clean": run, "filter.shout.smudge": run, "filter.shout.required": "true"} {
		synctest.Git(t, user, "config", k, v)
	}
	// What a worker's pull-back brought: untracked, so in the checkpoint.
	synctest.Write(t, a.Dir, map[string]string{".gitattributes": "*.txt filter=shout\n", "notes.txt": "quiet words\n"})
	s, err := New(Config{Mode: manifest.ModeGit, Anchor: a.Dir, Session: "sess-1", Now: fixedClock()})
	must(t, err)
	cp, _, err := s.Create(ctx)
	must(t, err)
	if b, err := os.ReadFile(marker); err == nil {
		t.Fatalf("taking a checkpoint ran the filter: %q", b)
	}
	if got := synctest.Git(t, a.Dir, "cat-file", "blob", cp.Commit+":notes.txt"); got != "quiet words" {
		t.Fatalf("notes.txt stored as %q", got)
	}
	must(t, os.Remove(filepath.Join(a.Dir, "notes.txt")))
	_, err = s.Restore(ctx, cp, a.Dir)
	must(t, err)
	if b, err := os.ReadFile(marker); err == nil {
		t.Fatalf("restoring a checkpoint ran the filter: %q", b)
	}
	if got := synctest.Read(t, a.Dir, "notes.txt"); got != "quiet words\n" {
		t.Fatalf("notes.txt restored as %q", got)
	}
}

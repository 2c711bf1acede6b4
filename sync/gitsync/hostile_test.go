package gitsync

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/openclaw/cloudworkers/internal/testrig/testenv"
	"github.com/openclaw/cloudworkers/sync/gitexec"
	"github.com/openclaw/cloudworkers/sync/internal/synctest"
	"github.com/openclaw/cloudworkers/sync/stream"
)

// rawFile is one entry of a worker's tree as commitRaw writes it: content (a symlink's target, a
// gitlink's commit) under mode; "" for mode deletes the path.
type rawFile struct{ mode, content string }

func file(c string) rawFile { return rawFile{"100644", c} }
func link(t string) rawFile { return rawFile{"120000", t} }
func script(c string) rawFile {
	return rawFile{"100755", c}
}

var deleted = rawFile{}

// commitRaw commits on the box's branch the tree of its HEAD with files changed, building every
// tree with git mktree, which (unlike git add) takes names that git would refuse to check out,
// as a hostile worker's git would. It returns the commit.
func (w *world) commitRaw(t *testing.T, files map[string]rawFile) string {
	t.Helper()
	head := synctest.Git(t, w.box, "rev-parse", "HEAD")
	entries := map[string]rawFile{} // path → mode, object
	out := synctest.Git(t, w.box, "ls-tree", "-r", "-z", "--full-tree", head)
	for _, rec := range strings.Split(out, "\x00") {
		meta, p, ok := strings.Cut(rec, "\t")
		if f := strings.Fields(meta); ok && len(f) == 3 {
			entries[p] = rawFile{f[0], f[2]}
		}
	}
	for p, f := range files {
		switch f.mode {
		case "":
			delete(entries, p)
		case "160000":
			entries[p] = f
		default:
			sha, err := gitexec.RunInput(synctest.Context(t), w.box, []byte(f.content), "hash-object", "-w", "--no-filters", "--stdin")
			must(t, err)
			entries[p] = rawFile{f.mode, strings.TrimSpace(string(sha))}
		}
	}
	tree := mktree(t, w.box, entries, "")
	commit := synctest.Git(t, w.box, "commit-tree", tree, "-p", head, "-m", "worker")
	synctest.Git(t, w.box, "update-ref", "HEAD", commit)
	return commit
}

// mktree writes the tree of the entries below dir ("" for the root) and returns it.
func mktree(t *testing.T, repo string, entries map[string]rawFile, dir string) string {
	t.Helper()
	prefix := ""
	if dir != "" {
		prefix = dir + "/"
	}
	subdirs := map[string]bool{}
	var in strings.Builder
	for _, p := range slices.Sorted(maps.Keys(entries)) {
		rest, ok := strings.CutPrefix(p, prefix)
		if !ok {
			continue
		}
		if name, _, nested := strings.Cut(rest, "/"); nested {
			subdirs[name] = true
			continue
		}
		e := entries[p]
		kind := "blob"
		if e.mode == "160000" {
			kind = "commit"
		}
		fmt.Fprintf(&in, "%s %s %s\t%s\x00", e.mode, kind, e.content, rest)
	}
	for name := range subdirs {
		fmt.Fprintf(&in, "040000 tree %s\t%s\x00", mktree(t, repo, entries, prefix+name), name)
	}
	out, err := gitexec.RunInput(synctest.Context(t), repo, []byte(in.String()), "mktree", "-z", "--missing")
	must(t, err)
	return strings.TrimSpace(string(out))
}

// anchorState is everything of the anchor that a failed adoption must leave as it was: refs,
// HEAD, index, status, every file with its mode and content, and what lies beside the anchor.
func anchorState(t *testing.T, a *Anchor) string {
	t.Helper()
	st, err := gitexec.Run(synctest.Context(t), a.Dir, "status", "--porcelain", "--ignored")
	must(t, err)
	snap := synctest.SnapshotWithoutGit(t, a.Dir)
	var files strings.Builder
	for _, p := range slices.Sorted(maps.Keys(snap)) {
		fmt.Fprintf(&files, "%s %x\n", p, sha256.Sum256([]byte(snap[p])))
	}
	des, err := os.ReadDir(filepath.Dir(a.Dir))
	must(t, err)
	var beside []string
	for _, de := range des {
		beside = append(beside, de.Name())
	}
	return strings.Join([]string{
		synctest.Git(t, a.Dir, "for-each-ref", "--format=%(refname) %(objectname)"),
		synctest.Git(t, a.Dir, "rev-parse", "HEAD"),
		synctest.Git(t, a.Dir, "symbolic-ref", "HEAD"),
		synctest.Git(t, a.Dir, "ls-files", "-s"),
		string(st), files.String(), strings.Join(beside, " "),
	}, "\n--\n")
}

// TestAdoptRefusesHostileTree: a worker commit whose tree holds a symlink leaving the repository
// or pointing into .git, a path git or some file system reads as .git, a symlinked .gitmodules or
// a submodule URL the repository does not have is refused with the path named, also when only an
// intermediate commit holds it, and the anchor stays exactly as it was.
func TestAdoptRefusesHostileTree(t *testing.T) {
	for _, tc := range []struct {
		name    string
		commits []map[string]rawFile
		path    string // named by the refusal
	}{
		{"absolute symlink", []map[string]rawFile{{"link": link("/etc/shadow")}}, "link"},
		{"symlink climbing out", []map[string]rawFile{{"up": link("../../../../root")}}, "up"},
		{"symlink climbing out of a subdirectory", []map[string]rawFile{{"lib/up": link("../../x")}}, "lib/up"},
		{"symlink climbing after a name", []map[string]rawFile{{"l": link("lib/../..")}}, "l"},
		{"symlink longer than a path", []map[string]rawFile{{"long": link(strings.Repeat("a/", 2100))}}, "long"},
		{"symlink into .git", []map[string]rawFile{{"cfg": link(".git/config")}}, "cfg"},
		{".GIT directory", []map[string]rawFile{{".GIT/hooks/post-checkout": script("#!/bin/sh\n")}}, ".GIT/hooks/post-checkout"},
		{"nested .git", []map[string]rawFile{{"lib/.git/config": file("[core]\n")}}, "lib/.git/config"},
		{".git with a trailing dot", []map[string]rawFile{{".git./config": file("[core]\n")}}, ".git./config"},
		{"8.3 short name of .git", []map[string]rawFile{{"GIT~1/config": file("[core]\n")}}, "GIT~1/config"},
		{".git with an HFS+ ignorable", []map[string]rawFile{{".g\u200cit/config": file("[core]\n")}}, ".g\u200cit/config"},
		{"symlinked .gitmodules", []map[string]rawFile{{".gitmodules": link("lib/lib.go")}}, ".gitmodules"},
		{"submodule from a new URL", []map[string]rawFile{{
			".gitmodules": file("[submodule \"x\"]\n\tpath = x\n\turl = https://example.invalid/x.git\n"),
			"x":           {"160000", strings.Repeat("1", 40)},
		}}, ".gitmodules"},
		{"only an intermediate commit", []map[string]rawFile{{"link": link("/etc/shadow")}, {"link": deleted, "ok.txt": file("fine")}}, "link"},
		// a gitlink where the workspace has no submodule: the gateway would fill it from whatever
		// repository the user keeps at that path
		{"a submodule the workspace does not have", []map[string]rawFile{{"vendor/x": {"160000", strings.Repeat("1", 40)}}}, "vendor/x"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := synctest.Context(t)
			w := dispatch(t, setup{})
			var first string
			for i, files := range tc.commits {
				c := w.commitRaw(t, files)
				if i == 0 {
					first = c
				}
			}
			bundle := w.bundle(t)
			before := anchorState(t, w.anchor)

			_, err := w.anchor.Adopt(ctx, "sess-1", bundle)
			te, ok := errors.AsType[*TreeError](err)
			if !ok || te.Path != tc.path || !strings.Contains(err.Error(), fmt.Sprintf("%q", tc.path)) {
				t.Fatalf("err %v, want a *TreeError naming %q", err, tc.path)
			}
			if te.Commit != first {
				t.Fatalf("refused commit %s, want %s", te.Commit, first)
			}
			t.Logf("refused: %v", err)
			if after := anchorState(t, w.anchor); after != before {
				t.Fatalf("anchor changed by a refused adoption:\n%s\n---- was ----\n%s", after, before)
			}
		})
	}
}

// TestAdoptKeepsInTreeSymlinks: links that stay inside the repository, and names that only
// start like .git, are adopted.
func TestAdoptKeepsInTreeSymlinks(t *testing.T) {
	ctx := synctest.Context(t)
	w := dispatch(t, setup{})
	w.commitRaw(t, map[string]rawFile{"l1": link("lib/lib.go"), "lib/l2": link("../main.go"), "lib/l3": link("./lib.go"),
		".github/workflows/ci.yml": file("on: push\n"), "lib/.gitkeep": file(""), ".gitattributes": file("*.go diff=golang\n"),
		"docs/.git-blame-ignore-revs": file(""), "gitx/readme": file("x")})
	_, err := w.anchor.Adopt(ctx, "sess-1", w.bundle(t))
	must(t, err)
	if got, err := os.Readlink(filepath.Join(w.anchor.Dir, "lib", "l2")); err != nil || got != "../main.go" {
		t.Fatalf("lib/l2 -> %q (%v)", got, err)
	}
	if got := synctest.Read(t, w.anchor.Dir, ".github/workflows/ci.yml"); got != "on: push\n" {
		t.Fatalf(".github/workflows/ci.yml %q", got)
	}
}

func TestDotGit(t *testing.T) {
	for c, want := range map[string]bool{
		".git": true, ".GIT": true, ".Git.": true, ".git ": true, ".git. . ": true, "git~1": true, "GIT~1": true,
		".git::$INDEX_ALLOCATION": true, "\u200c.git": true, ".gi\ufefft": true,
		".github": false, ".gitignore": false, ".gitkeep": false, "git": false, ".git-foo": false, "git~2": false, "..git": false,
	} {
		if got := DotGit(c); got != want {
			t.Errorf("DotGit(%q) = %v, want %v", c, got, want)
		}
	}
	for p, want := range map[string]bool{".gitmodules": true, "a/.GITMODULES.": true, "gitmod~1": true, ".gitmodules2": false, "gitmodules": false} {
		if got := isDotGitmodules(p); got != want {
			t.Errorf("isDotGitmodules(%q) = %v, want %v", p, got, want)
		}
	}
}

// TestAdoptRunsNothingFromTheWorker: the worker's .lfsconfig sends git-lfs nowhere (a loopback
// server counts requests: none), a filter driver the gateway's configuration defines and the
// worker's .gitattributes names does not run, and hooks the worker committed where
// core.hooksPath points do not run. A configuration that includes a file of the anchor's
// worktree is refused, naming it.
func TestAdoptRunsNothingFromTheWorker(t *testing.T) {
	var requests atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		http.Error(rw, "no", http.StatusNotFound)
	}))
	t.Cleanup(srv.Close)
	oid := fmt.Sprintf("%x", sha256.Sum256([]byte("hello")))
	pointer := "version https://git-lfs.github.com/spec/v1\noid sha256:" + oid + "\nsize 5\n"

	for _, tc := range []struct {
		name   string
		needs  string                                         // a command the case needs
		config func(marker, anchor string) [][2]string        // the gateway's configuration, in the repository
		work   func(marker, anchor string) map[string]rawFile // the worker's commit
		refuse string                                         // the file a *gitexec.ConfigError names
	}{
		{
			name:  ".lfsconfig pointing git-lfs at a server",
			needs: "git-lfs",
			config: func(string, string) [][2]string {
				return [][2]string{{"filter.lfs.process", "git-lfs filter-process"}, {"filter.lfs.smudge", "git-lfs smudge -- %f"},
					{"filter.lfs.clean", "git-lfs clean -- %f"}, {"filter.lfs.required", "true"}}
			},
			work: func(string, string) map[string]rawFile {
				return map[string]rawFile{
					".gitattributes": file("*.bin filter=lfs diff=lfs merge=lfs -text\n"),
					".lfsconfig":     file("[lfs]\n\turl = " + srv.URL + "/lfs\n"),
					"big.bin":        file(pointer),
				}
			},
		},
		{
			name: "filter driver named by .gitattributes",
			config: func(marker, _ string) [][2]string {
				run := "sh -c 'echo ran >> " + marker + "; cat'"
				return [][2]string{{"filter.indent.smudge", run}, {"filter.indent.clean", run}, {"filter.indent.required", "true"}}
			},
			work: func(string, string) map[string]rawFile {
				return map[string]rawFile{".gitattributes": file("*.go filter=indent\n"), "main.go": file("package main // worker\n")}
			},
		},
		{
			name: "hooks where core.hooksPath points",
			config: func(string, string) [][2]string {
				return [][2]string{{"core.hooksPath", ".githooks"}}
			},
			work: func(marker, _ string) map[string]rawFile {
				hook := script("#!/bin/sh\necho ran >> " + marker + "\n")
				return map[string]rawFile{".githooks/post-merge": hook, ".githooks/post-checkout": hook,
					".githooks/reference-transaction": hook, "main.go": file("package main // worker\n")}
			},
		},
		{
			name: "configuration including a file of the worktree",
			config: func(_, anchor string) [][2]string {
				return [][2]string{{"include.path", filepath.Join(anchor, "team.gitconfig")}}
			},
			work: func(marker, _ string) map[string]rawFile {
				return map[string]rawFile{"team.gitconfig": file("[core]\n\thooksPath = .githooks\n"),
					".githooks/post-checkout": script("#!/bin/sh\necho ran >> " + marker + "\n")}
			},
			refuse: "team.gitconfig",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.needs != "" {
				testenv.RequireCommands(t, tc.needs)
			}
			ctx := synctest.Context(t)
			w := dispatch(t, setup{})
			marker := filepath.Join(t.TempDir(), "ran")
			w.commitRaw(t, tc.work(marker, w.anchor.Dir))
			bundle := w.bundle(t)
			for _, kv := range tc.config(marker, w.anchor.Dir) {
				synctest.Git(t, w.user, "config", kv[0], kv[1])
			}
			before := requests.Load()

			tip, err := w.anchor.Adopt(ctx, "sess-1", bundle)
			if n := requests.Load() - before; n != 0 {
				t.Errorf("the adoption sent %d requests to the worker's server", n)
			}
			if b, err := os.ReadFile(marker); err == nil {
				t.Errorf("the worker's program ran: %q", b)
			}
			if tc.refuse != "" {
				ce, ok := errors.AsType[*gitexec.ConfigError](err)
				if !ok || path.Base(filepath.ToSlash(ce.File)) != tc.refuse || !strings.Contains(err.Error(), tc.refuse) {
					t.Fatalf("err %v, want a *gitexec.ConfigError naming %s", err, tc.refuse)
				}
				return
			}
			must(t, err)
			if got := synctest.Git(t, w.anchor.Dir, "rev-parse", "HEAD"); got != tip {
				t.Fatalf("anchor at %s, want %s", got, tip)
			}
			if tc.needs == "git-lfs" {
				if got := synctest.Read(t, w.anchor.Dir, "big.bin"); got != pointer {
					t.Fatalf("big.bin %q, want the pointer as committed", got)
				}
			}
		})
	}
}

// TestAdoptFailureLeavesAnchorAsBefore: an adoption whose fast-forward is refused (an untracked
// file of the anchor in the way) or stops midway (a directory it cannot write in, after it wrote
// and deleted other files) leaves refs, HEAD, index, status and every file as they were.
func TestAdoptFailureLeavesAnchorAsBefore(t *testing.T) {
	for _, tc := range []struct {
		name    string
		prepare func(t *testing.T, w *world)
	}{
		{"untracked file in the way", func(t *testing.T, w *world) {
			synctest.Write(t, w.anchor.Dir, map[string]string{"a/new.txt": "the anchor's own"})
		}},
		{"write fails midway", func(t *testing.T, w *world) {
			freezeDir(t, filepath.Join(w.anchor.Dir, "lib"))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := synctest.Context(t)
			w := dispatch(t, setup{anchorEdits: map[string]string{"scratch.txt": "untracked"}, status: "?? scratch.txt\n"})
			// The checkout deletes the file .worktreeinclude first, then, sorted, writes
			// .worktreeinclude/x (a directory now) and a/new.txt, and fails on lib/new.go before
			// main.go.
			w.commitRaw(t, map[string]rawFile{"a/new.txt": file("worker"), "lib/new.go": file("package lib\n"),
				"main.go": file("package main // worker\n"), ".worktreeinclude": deleted,
				".worktreeinclude/x": file("now a directory"), "run.sh": script("#!/bin/sh\n")})
			bundle := w.bundle(t)
			tc.prepare(t, w)
			before := anchorState(t, w.anchor)

			_, err := w.anchor.Adopt(ctx, "sess-1", bundle)
			if err == nil {
				t.Fatal("adopted")
			}
			t.Logf("error: %v", err)
			if after := anchorState(t, w.anchor); after != before {
				t.Fatalf("anchor changed by a failed adoption:\n%s\n---- was ----\n%s", after, before)
			}
		})
	}
}

// freezeDir makes dir refuse new entries until the test ends: immutable for root (whom
// permissions do not stop), read-only otherwise.
func freezeDir(t *testing.T, dir string) {
	t.Helper()
	if os.Geteuid() == 0 {
		if out, err := exec.Command("chattr", "+i", dir).CombinedOutput(); err != nil {
			testenv.Integration(t, fmt.Sprintf("chattr +i: %v %s (package e2fsprogs, a file system with attributes)", err, out))
		}
		t.Cleanup(func() { _ = exec.Command("chattr", "-i", dir).Run() })
	} else {
		must(t, os.Chmod(dir, 0o555))
		t.Cleanup(func() { _ = os.Chmod(dir, 0o755) })
	}
	if f, err := os.Create(filepath.Join(dir, "probe")); err == nil {
		f.Close()
		os.Remove(f.Name())
		testenv.Integration(t, "cannot make a directory unwritable here")
	}
}

// A worker commit that points many paths at one large blob (a bundle of kilobytes that checks out
// to far more) is refused by CheckoutSize before anything is adopted, against the inbound limits
// of entries, file size and total bytes; the same commit within them is counted.
func TestCheckoutSizeRefusesACheckoutBomb(t *testing.T) {
	ctx := synctest.Context(t)
	w := dispatch(t, setup{})
	blob := strings.Repeat("0123456789abcdef", 64<<10) // 1 MiB, compresses to almost nothing
	files := map[string]rawFile{}
	for i := range 200 {
		files[fmt.Sprintf("bomb/%03d.txt", i)] = file(blob)
	}
	w.commitRaw(t, files)
	bundle := w.bundle(t)
	if fi, err := os.Stat(bundle); err != nil || fi.Size() > 64<<10 {
		t.Fatalf("bundle %v, %v: want a small one", fi, err)
	}
	before := anchorState(t, w.anchor)
	for _, tc := range []struct {
		lim  stream.Limits
		want string // "" for within the limits
	}{
		{stream.Limits{MaxEntries: 1000, MaxFileSize: 1 << 30, MaxTotalSize: 100 << 20}, "bytes"},
		{stream.Limits{MaxEntries: 100, MaxFileSize: 1 << 30, MaxTotalSize: 1 << 30}, "entries"},
		{stream.Limits{MaxEntries: 1000, MaxFileSize: 512 << 10, MaxTotalSize: 1 << 30}, "a file"},
		{stream.Limits{MaxEntries: 1000, MaxFileSize: 1 << 30, MaxTotalSize: 1 << 30}, ""},
	} {
		var size int64
		_, err := w.anchor.AdoptChecked(ctx, "sess-1", bundle, func(ctx context.Context, g *gitexec.Untrusted, head, tip string) error {
			var err error
			size, err = CheckoutSize(ctx, g, head, tip, tc.lim)
			if err == nil {
				return errors.New("stop here")
			}
			return err
		})
		tooLarge, ok := errors.AsType[*CheckoutTooLargeError](err)
		switch {
		case tc.want != "" && (!ok || tooLarge.What != tc.want):
			t.Fatalf("limits %+v: %v, want the %s named", tc.lim, err, tc.want)
		case tc.want == "" && (ok || size != 200*int64(len(blob))):
			t.Fatalf("limits %+v: %v with size %d, want %d counted", tc.lim, err, size, 200*len(blob))
		}
		if after := anchorState(t, w.anchor); after != before {
			t.Fatal("the anchor changed")
		}
	}
}

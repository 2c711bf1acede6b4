package gitsync

import (
	"context"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/openclaw/cloudworkers/internal/untrusted"
	"github.com/openclaw/cloudworkers/sync/internal/synctest"
	"github.com/openclaw/cloudworkers/sync/manifest"
	"github.com/openclaw/cloudworkers/sync/mirror"
	"github.com/openclaw/cloudworkers/sync/stream"
)

// TestGitRoundTripOverSSH runs the git-mode round trip against real boxes through the real
// worker binary (`openclaw worker unpack|pack|manifest`): out go the anchor's files and its base
// pack; on the box a shallow repository is created at the base, a worker commits twice and leaves an
// untracked file; back come the commits as a bundle made on the box (adopted by fast-forward) and
// the untracked file through mirror.Pull. The user's checkout is untouched.
func TestGitRoundTripOverSSH(t *testing.T) {
	for _, kind := range []string{"localbox", "netns-sshd"} {
		t.Run(kind, func(t *testing.T) {
			synctest.HaveGit(t)
			var box synctest.Box
			if kind == "localbox" {
				box = synctest.LocalBox(t)
			} else {
				box = synctest.NetnsBox(t, "ocl_syncgit01")
			}
			bin := synctest.BuildBinary(t, "github.com/openclaw/cloudworkers/cmd/openclaw")
			client := synctest.Dial(t, box)
			remote := stream.Remote{Client: client, Command: untrusted.Quote(bin) + " worker"}
			gitRoundTrip(t, remote, box)
		})
	}
}

func gitRoundTrip(t *testing.T, remote stream.Remote, box synctest.Box) {
	ctx := synctest.Context(t)
	tmp := t.TempDir()
	user := filepath.Join(tmp, "user")
	synctest.InitRepo(t, user, map[string]string{
		".gitignore":       ".env\nbuild/\n",
		".worktreeinclude": ".env\n",
		"main.go":          "package main\n",
		"lib/lib.go":       "package lib\n",
	})
	// A submodule, recorded at v1; the user's checkout of it has moved on to v2 since.
	addSubmodule(t, tmp, user, "lib")
	synctest.Git(t, user, "commit", "--quiet", "-m", "add lib")
	moveSubmodule(t, user, "lib")
	synctest.Write(t, user, map[string]string{".env": "TOKEN=local", "build/x": "ignored", "wip.txt": "user's uncommitted work"})
	userHead := synctest.Git(t, user, "rev-parse", "HEAD")
	userBefore := synctest.SnapshotWithoutGit(t, user)

	a, err := CreateAnchor(ctx, user, filepath.Join(tmp, "data"), "rt1", "")
	must(t, err)
	base, err := a.Manifest(ctx, manifest.Options{})
	must(t, err)

	// Out: the files, then the base pack, then the repository on the box.
	ws := filepath.Join(box.Home, "ws")
	inbox := filepath.Join(box.Home, ".openclaw-sync-in")
	if _, _, err := stream.Push(ctx, remote, a.Dir, ws, base, false, stream.ManifestOptions{}); err != nil {
		t.Fatal(err)
	}
	// The submodule goes at the commit the base records, read-only in effect.
	subs, _, err := PushSubmodules(ctx, remote, a, ws, t.TempDir(), nil, nil)
	must(t, err)
	if len(subs) != 1 || subs[0].Path != "third_party/lib" {
		t.Fatalf("submodules sent: %+v", subs)
	}
	if got := synctest.Exec(t, remote.Client, "cat "+untrusted.Quote(filepath.Join(ws, "third_party", "lib", "lib.go"))); got != "package lib // v1" {
		t.Fatalf("submodule on the box: %q, want the recorded v1", got)
	}
	pdir := filepath.Join(tmp, "base-pack")
	must(t, os.Mkdir(pdir, 0o700))
	must(t, a.BasePack(ctx, filepath.Join(pdir, "base.pack")))
	pm, _, err := manifest.Build(ctx, pdir, manifest.Options{})
	must(t, err)
	if _, err := remote.Unpack(ctx, inbox, pdir, stream.PlanFor(nil, pm)); err != nil {
		t.Fatal(err)
	}
	client := remote.Client
	synctest.Exec(t, client, BoxRepoCommand(ws, filepath.Join(inbox, "base.pack"), a.Name, a.Base, Identity{}))
	if head := synctest.Exec(t, client, "cd "+untrusted.Quote(ws)+" && git rev-parse HEAD && git rev-list --count HEAD && git status --porcelain"); head != a.Base+"\n1" {
		t.Fatalf("box repository: %q, want one commit, clean at %s", head, a.Base)
	}
	if got := synctest.Exec(t, client, "cat "+untrusted.Quote(filepath.Join(ws, ".env"))); got != "TOKEN=local" {
		t.Fatalf(".worktreeinclude file on the box: %q", got)
	}

	// The worker's turn, through ssh exec.
	synctest.Exec(t, client, "set -e; cd "+untrusted.Quote(ws)+`
g() { git -c user.name=worker -c user.email=worker@box.invalid "$@"; }
printf 'package main // changed\n' > main.go; printf 'package main // new\n' > feature.go
g add -A; g commit -q -m 'worker: feature'
printf 'package lib // second\n' > lib/more.go; g add -A; g commit -q -m 'worker: more'
mkdir -p notes; printf artifact > notes/untracked.md
printf 'package lib // edited on the box\n' > third_party/lib/lib.go; printf out > third_party/lib/build.out; g add -A`)
	boxTip := synctest.Exec(t, client, "cd "+untrusted.Quote(ws)+" && git rev-parse HEAD")

	// In: the commits as a bundle made on the box, adopted by fast-forward.
	bundle := filepath.Join(tmp, "result.bundle")
	f, err := os.Create(bundle)
	must(t, err)
	must(t, remote.Exec(ctx, BoxBundleCommand(ws, a.Base), f, MaxBundleBytes))
	must(t, f.Close())
	tip, err := a.Adopt(ctx, "sess-rt", bundle)
	must(t, err)
	if tip != boxTip || synctest.Git(t, a.Dir, "rev-parse", "HEAD") != boxTip {
		t.Fatalf("adopted %s, anchor HEAD %s, want %s", tip, synctest.Git(t, a.Dir, "rev-parse", "HEAD"), boxTip)
	}
	if got := synctest.Read(t, a.Dir, "lib/more.go"); got != "package lib // second\n" {
		t.Fatalf("worktree not fast-forwarded: %q", got)
	}

	// Uncommitted and untracked work through the manifest diff against the fast-forwarded anchor.
	now, err := a.Manifest(ctx, manifest.Options{})
	must(t, err)
	boxM, err := remote.Manifest(ctx, ws, stream.ManifestOptions{Mode: manifest.ModeGit})
	must(t, err)
	res, err := mirror.Pull(ctx, mirror.Config{Anchor: a.Dir, Base: now, Box: boxM, Mode: manifest.ModeGit,
		Fetch: func(ctx context.Context, plan stream.Plan, root string, opts stream.ApplyOptions) (stream.Stats, error) {
			return remote.Pack(ctx, ws, plan, root, opts)
		}})
	must(t, err)
	if got := manifest.Paths(res.Plan.Entries); len(got) != 2 || got[1] != "notes/untracked.md" {
		t.Fatalf("pulled %v, want notes/ and notes/untracked.md", got)
	}
	if got := synctest.Read(t, a.Dir, "notes/untracked.md"); got != "artifact" {
		t.Fatalf("untracked file did not land: %q", got)
	}
	if got := synctest.Read(t, a.Dir, "third_party/lib/lib.go"); got != "package lib // v1\n" {
		t.Fatalf("the submodule in the anchor changed: %q", got)
	}

	// A second bundle with nothing new is empty and changes nothing.
	var empty strings.Builder
	must(t, remote.Exec(ctx, BoxBundleCommand(ws, boxTip), &empty, MaxBundleBytes))
	if empty.Len() != 0 {
		t.Fatalf("no-op bundle wrote %d bytes", empty.Len())
	}

	if got := synctest.Git(t, user, "rev-parse", "HEAD"); got != userHead {
		t.Fatalf("user HEAD moved to %s", got)
	}
	if !maps.Equal(userBefore, synctest.SnapshotWithoutGit(t, user)) {
		t.Fatal("the user's checkout changed")
	}
}

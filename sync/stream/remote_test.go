package stream

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/openclaw/cloudworkers/gateway/tunnel"
	"github.com/openclaw/cloudworkers/internal/untrusted"
	"github.com/openclaw/cloudworkers/providers/local/localtest"
	"github.com/openclaw/cloudworkers/sync/internal/synctest"
	"github.com/openclaw/cloudworkers/sync/manifest"
)

// startBox runs an in-process local box and returns its directory and a sync connection to it,
// with the test binary as the worker executable.
func startBox(t *testing.T) (string, Remote) {
	t.Helper()
	b := localtest.Start(t)
	c, err := tunnel.Dial(synctest.Context(t), tunnel.Target{
		EnvironmentID: "env-sync", Host: b.Host, Port: b.Port, User: b.User,
		KeyPath: b.ClientKeyPath, HostKeys: []string{b.HostKey}, SocketPath: "x.sock",
	}, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return b.Dir, Remote{Client: c, Command: untrusted.Quote(exe) + " worker"}
}

func TestPushOverSSHColdThenWarm(t *testing.T) {
	ctx := synctest.Context(t)
	boxDir, remote := startBox(t)
	src := t.TempDir()
	synctest.Write(t, src, map[string]string{"a.txt": "a", "dir/b.txt": "b", "dir/c.txt": "c", "keep/big": string(make([]byte, 3<<20))})
	base := build(t, src)
	dst := filepath.Join(boxDir, "ws")

	plan, st, err := Push(ctx, remote, src, dst, base, true, ManifestOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(plan.Entries) != len(base.Entries) || st.Files != 4 {
		t.Fatalf("cold push sent %d entries (%+v), want all %d", len(plan.Entries), st, len(base.Entries))
	}
	sameTree(t, base, build(t, dst))

	// No-op resync sends nothing, with the local tree listed while the box builds its manifest.
	res, err := PushTree(ctx, remote, src, dst, TreeOptions{})
	if err != nil || !res.Plan.Empty() || res.Kind != "unchanged" {
		t.Fatalf("no-op resync: %+v, err %v", res, err)
	}
	sameTree(t, base, res.Base)

	// A warm resync sends only the change and the deletion.
	must(t, os.WriteFile(filepath.Join(src, "a.txt"), []byte("A!"), 0o644))
	must(t, os.Remove(filepath.Join(src, "dir/c.txt")))
	next := build(t, src)
	plan, st, err = Push(ctx, remote, src, dst, next, true, ManifestOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := manifest.Paths(plan.Entries); !slices.Equal(got, []string{"a.txt"}) || !slices.Equal(plan.Deletes, []string{"dir/c.txt"}) {
		t.Fatalf("warm plan sends %v deletes %v", got, plan.Deletes)
	}
	if st.Bytes != 2 {
		t.Fatalf("warm push sent %d bytes", st.Bytes)
	}
	sameTree(t, next, build(t, dst))

	// And back: the box's changes fetched with pack.
	must(t, os.WriteFile(filepath.Join(dst, "new.txt"), []byte("from the box"), 0o644))
	boxM, err := remote.Manifest(ctx, dst, ManifestOptions{})
	if err != nil {
		t.Fatal(err)
	}
	back := t.TempDir()
	if _, err := remote.Pack(ctx, dst, PlanFor(nil, boxM), back, ApplyOptions{}); err != nil {
		t.Fatal(err)
	}
	sameTree(t, boxM, build(t, back))
}

// TestPushTreeStreamsToAColdBox: a cold box gets one streamed archive, hashed while it is sent;
// the result is the tree's manifest, both hash caches learn every file, and a warm resync then
// hashes nothing and sends only the change.
func TestPushTreeStreamsToAColdBox(t *testing.T) {
	ctx := synctest.Context(t)
	boxDir, remote := startBox(t)
	src := t.TempDir()
	synctest.Write(t, src, map[string]string{"a.txt": "a", "dir/b.txt": "b", "dir/sub/c.txt": "c", "big": strings.Repeat("x", 3<<20)})
	must(t, os.Symlink("dir/b.txt", filepath.Join(src, "link")))
	ageFiles(t, src)
	dst := filepath.Join(boxDir, "ws")
	boxCache := filepath.Join(boxDir, "cache.json")
	cache := manifest.NewCache()
	opts := TreeOptions{Cache: cache, Manifest: ManifestOptions{CacheFile: boxCache}}

	res, err := PushTree(ctx, remote, src, dst, opts)
	if err != nil {
		t.Fatal(err)
	}
	want := build(t, src)
	if res.Kind != "cold" || !res.Plan.SumsLast || res.Stats.Files != 4 {
		t.Fatalf("cold push: kind %q sumsLast %v stats %+v", res.Kind, res.Plan.SumsLast, res.Stats)
	}
	sameTree(t, want, res.Base)
	sameTree(t, want, build(t, dst))
	if cache.Len() != 4 {
		t.Fatalf("gateway hash cache holds %d files, want 4", cache.Len())
	}
	if got := manifest.LoadCache(boxCache).Len(); got != 4 {
		t.Fatalf("box hash cache holds %d files, want 4", got)
	}
	if _, st, err := manifest.Build(ctx, dst, manifest.Options{Cache: manifest.LoadCache(boxCache)}); err != nil || st.Hashed != 0 || st.Cached != 4 {
		t.Fatalf("the box's manifest after a cold push hashed %d files, cached %d (err %v); want 0 and 4", st.Hashed, st.Cached, err)
	}
	if _, st, err := manifest.Build(ctx, src, manifest.Options{Cache: cache}); err != nil || st.Hashed != 0 {
		t.Fatalf("rebuild after a cold push hashed %d files (err %v), want 0", st.Hashed, err)
	}

	must(t, os.WriteFile(filepath.Join(src, "dir/b.txt"), []byte("B"), 0o644))
	res, err = PushTree(ctx, remote, src, dst, opts)
	if err != nil {
		t.Fatal(err)
	}
	if res.Kind != "warm" || res.Plan.SumsLast || !slices.Equal(manifest.Paths(res.Plan.Entries), []string{"dir/b.txt"}) {
		t.Fatalf("warm push: kind %q plan %v", res.Kind, manifest.Paths(res.Plan.Entries))
	}
	sameTree(t, build(t, src), build(t, dst))
}

// TestPushTreeNoticesAChangedFile: a file that changes between the listing and its sending fails
// the streamed sync with ErrChanged, and the box keeps nothing.
func TestPushTreeNoticesAChangedFile(t *testing.T) {
	ctx := synctest.Context(t)
	boxDir, remote := startBox(t)
	src := t.TempDir()
	synctest.Write(t, src, map[string]string{"a.txt": "a"})
	listing, err := manifest.List(ctx, src, manifest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	must(t, os.WriteFile(filepath.Join(src, "a.txt"), []byte("changed"), 0o644))
	dst := filepath.Join(boxDir, "ws")
	_, err = remote.Unpack(ctx, dst, src, Plan{Version: PlanVersion, Entries: listing.Unhashed().Entries, SumsLast: true})
	if !errors.Is(err, ErrChanged) {
		t.Fatalf("err = %v, want ErrChanged", err)
	}
	if _, err := os.Stat(dst); !os.IsNotExist(err) {
		t.Fatalf("box kept %s after a failed sync (%v)", dst, err)
	}
	if entries, _ := os.ReadDir(boxDir); slices.ContainsFunc(entries, func(e os.DirEntry) bool { return strings.HasPrefix(e.Name(), manifest.StagingPrefix) }) {
		t.Fatalf("staging left on the box: %v", entries)
	}
}

func TestPushReportsBoxFailure(t *testing.T) {
	ctx := synctest.Context(t)
	boxDir, remote := startBox(t)
	src := t.TempDir()
	synctest.Write(t, src, map[string]string{"a": "a"})
	// The target is a file on the box: unpack fails there and says why.
	must(t, os.WriteFile(filepath.Join(boxDir, "ws"), []byte("x"), 0o644))
	_, _, err := Push(ctx, remote, src, filepath.Join(boxDir, "ws"), build(t, src), false, ManifestOptions{})
	if _, ok := errors.AsType[*RemoteError](err); !ok {
		t.Fatalf("err %v", err)
	}
	t.Logf("error: %v", err)
}

func TestPushReportsProgressAndFillsBoxCache(t *testing.T) {
	ctx := synctest.Context(t)
	boxDir, remote := startBox(t)
	src := t.TempDir()
	synctest.Write(t, src, map[string]string{"a.txt": "a", "dir/b.txt": "bb", "big": string(make([]byte, 2<<20))})
	must(t, os.Symlink("a.txt", filepath.Join(src, "link")))
	// Hashes of files modified less than 2 s ago are never cached (racy timestamps): age them.
	old := time.Now().Add(-time.Hour)
	for _, p := range []string{"a.txt", "dir/b.txt", "big"} {
		must(t, os.Chtimes(filepath.Join(src, p), old, old))
	}
	base := build(t, src)

	var reports []Progress
	tick := make(chan time.Time)
	remote.progressTick = tick
	remote.Progress = func(p Progress) { reports = append(reports, p) }
	cacheFile := filepath.Join(boxDir, "cache.json")
	plan, _, err := Push(ctx, remote, src, filepath.Join(boxDir, "ws"), base, true, ManifestOptions{CacheFile: cacheFile})
	if err != nil {
		t.Fatal(err)
	}
	if len(reports) == 0 {
		t.Fatal("no progress reported")
	}
	last := reports[len(reports)-1]
	if !last.Done || last.Files != 4 || last.TotalFiles != 4 || last.Bytes != plan.Bytes() || last.TotalBytes != plan.Bytes() {
		t.Fatalf("last report %+v, want all 4 files and %d bytes, done", last, plan.Bytes())
	}
	for i := 1; i < len(reports); i++ {
		if reports[i].Bytes < reports[i-1].Bytes || reports[i].Files < reports[i-1].Files {
			t.Fatalf("progress went backwards: %+v", reports)
		}
	}
	t.Logf("last report: %s", last)

	// The box recorded the files it wrote: its next manifest does not re-hash them.
	if n := manifest.LoadCache(cacheFile).Len(); n != 3 {
		t.Fatalf("box hash cache holds %d files after the push, want 3", n)
	}
	plan, _, err = Push(ctx, remote, src, filepath.Join(boxDir, "ws"), base, true, ManifestOptions{CacheFile: cacheFile})
	if err != nil || !plan.Empty() {
		t.Fatalf("no-op resync with the cache: plan %+v, err %v", plan, err)
	}
}

// TestPushTreeInParts: a cold sync of a large tree goes over several channels (one `unpack
// --parts` and `feed` commands) and lands exactly as over one; a file that changes after the
// listing fails the whole sync with nothing left on the box.
func TestPushTreeInParts(t *testing.T) {
	ctx := synctest.Context(t)
	boxDir, remote := startBox(t)
	remote.Channels = 3
	src := partsTree(t)
	must(t, os.Symlink("d1", filepath.Join(src, "link")))
	ageFiles(t, src)
	if n := len(splitPlan(Plan{Entries: build(t, src).Entries, SumsLast: true}, remote.channels(Plan{Entries: build(t, src).Entries, SumsLast: true}))); n != 3 {
		t.Fatalf("the tree would go in %d parts, want 3", n)
	}
	dst := filepath.Join(boxDir, "ws")
	boxCache := filepath.Join(boxDir, "cache.json")
	res, err := PushTree(ctx, remote, src, dst, TreeOptions{Manifest: ManifestOptions{CacheFile: boxCache}})
	if err != nil {
		t.Fatal(err)
	}
	want := build(t, src)
	sameTree(t, want, res.Base)
	sameTree(t, want, build(t, dst))
	if res.Stats.Files != 41 || res.Stats.Symlinks != 1 {
		t.Fatalf("stats %+v", res.Stats)
	}
	if got := manifest.LoadCache(boxCache).Len(); got != 41 {
		t.Fatalf("box hash cache holds %d files, want 41", got)
	}
	if l := leftovers(boxDir); len(l) > 0 {
		t.Fatalf("left next to the workspace: %v", l)
	}

	// A file of the last part changes between the listing and its sending.
	listing, err := manifest.List(ctx, src, manifest.Options{})
	must(t, err)
	must(t, os.WriteFile(filepath.Join(src, "d6/f34.txt"), []byte("changed meanwhile"), 0o644))
	dst2 := filepath.Join(boxDir, "ws2")
	_, err = remote.Unpack(ctx, dst2, src, Plan{Version: PlanVersion, Entries: listing.Unhashed().Entries, SumsLast: true})
	if !errors.Is(err, ErrChanged) {
		t.Fatalf("err = %v, want ErrChanged", err)
	}
	if _, err := os.Stat(dst2); !os.IsNotExist(err) {
		t.Fatalf("box kept %s after a failed sync in parts (%v)", dst2, err)
	}
	waitNoLeftovers(t, boxDir)
}

// leftovers lists what our sync left in dir: staging and feed socket directories.
func leftovers(dir string) []string {
	var out []string
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".openclaw-") {
			out = append(out, e.Name())
		}
	}
	return out
}

// waitNoLeftovers waits (up to FeedTimeout) for a box that is refusing a sync to clean up, and
// fails the test if something is left.
func waitNoLeftovers(t *testing.T, dir string) {
	t.Helper()
	deadline := time.Now().Add(FeedTimeout)
	for len(leftovers(dir)) > 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if l := leftovers(dir); len(l) > 0 {
		t.Fatalf("left next to the workspace after a failure: %v", l)
	}
}

// ageFiles sets every file's mtime an hour back: older than the racy window, so hashes are cached.
func ageFiles(t *testing.T, dir string) {
	t.Helper()
	old := time.Now().Add(-time.Hour)
	must(t, filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			err = os.Chtimes(p, old, old)
		}
		return err
	}))
}

// partsTree writes a tree large enough to be sent in parts (with parallelMin lowered for the
// test): a 3 MiB file and 40 small ones in 7 directories.
// lowerParallelMin lets small test trees go in parts (4 entries or 1 MiB) until the test ends.
func lowerParallelMin(t *testing.T) {
	saved := parallelMin
	parallelMin.entries, parallelMin.bytes = 4, 1<<20
	t.Cleanup(func() { parallelMin = saved })
}

func partsTree(t *testing.T) string {
	t.Helper()
	lowerParallelMin(t)
	src := t.TempDir()
	files := map[string]string{"big": strings.Repeat("x", 3<<20)}
	for i := range 40 {
		files[fmt.Sprintf("d%d/f%02d.txt", i%7, i)] = fmt.Sprintf("file %d\n", i)
	}
	synctest.Write(t, src, files)
	return src
}

// TestPushTreeStartsUnpackWhileListing: when the box answers that it has nothing before the tree
// is listed, the unpack's commands start at once; the sync lands as usual (in parts for a large
// tree, in one when the tree has fewer entries than channels). A listing that fails after that
// start leaves nothing on the box.
func TestPushTreeStartsUnpackWhileListing(t *testing.T) {
	ctx := synctest.Context(t)
	boxDir, remote := startBox(t)
	remote.Channels = 3
	// The listing waits for the box's answer, as a large tree's does.
	gate := func(r *Remote) *bool {
		prestarted := new(bool)
		answered := make(chan struct{})
		r.beforeList = func() { <-answered }
		r.boxAnswered = func(p bool) { *prestarted = p; close(answered) }
		return prestarted
	}

	for _, tc := range []struct {
		name  string
		files map[string]string
	}{
		{"large tree in parts", nil},
		{"one file for three channels", map[string]string{"only": "one"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := partsTree(t)
			if tc.files != nil {
				src = t.TempDir()
				synctest.Write(t, src, tc.files)
			}
			ageFiles(t, src)
			r := remote
			prestarted := gate(&r)
			dst := filepath.Join(boxDir, strings.ReplaceAll(tc.name, " ", "-"))
			res, err := PushTree(ctx, r, src, dst, TreeOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if !*prestarted {
				t.Fatal("the unpack did not start before the listing")
			}
			if res.Kind != "cold" {
				t.Fatalf("kind %q, want cold", res.Kind)
			}
			sameTree(t, build(t, src), build(t, dst))
		})
	}

	t.Run("listing fails", func(t *testing.T) {
		src := partsTree(t)
		r := remote
		prestarted := gate(&r)
		inner := r.beforeList
		r.beforeList = func() {
			inner()
			must(t, os.RemoveAll(src)) // the tree goes away once the box's commands are running
		}
		dst := filepath.Join(boxDir, "gone")
		if _, err := PushTree(ctx, r, src, dst, TreeOptions{}); err == nil || !strings.Contains(err.Error(), src) {
			t.Fatalf("err = %v, want the listing's failure naming %s", err, src)
		}
		if !*prestarted {
			t.Fatal("the unpack did not start before the listing")
		}
		if _, err := os.Stat(dst); !os.IsNotExist(err) {
			t.Fatalf("box holds %s after a failed listing (%v)", dst, err)
		}
		if l := leftovers(boxDir); len(l) > 0 {
			t.Fatalf("left next to the workspace: %v", l) // abort waits for the box's commands
		}
	})
}

// TestPushTreeOnlyDeletions: a resync whose only change is a deleted file sends a plan with no
// entries and one deletion; the box drops the file.
func TestPushTreeOnlyDeletions(t *testing.T) {
	ctx := synctest.Context(t)
	boxDir, remote := startBox(t)
	src := t.TempDir()
	synctest.Write(t, src, map[string]string{"keep": "k", "drop": "d"})
	dst := filepath.Join(boxDir, "ws")
	if _, err := PushTree(ctx, remote, src, dst, TreeOptions{}); err != nil {
		t.Fatal(err)
	}
	must(t, os.Remove(filepath.Join(src, "drop")))
	res, err := PushTree(ctx, remote, src, dst, TreeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if res.Kind != "warm" || len(res.Plan.Entries) != 0 || len(res.Plan.Deletes) != 1 {
		t.Fatalf("kind %q, plan %+v: want a warm plan of one deletion", res.Kind, res.Plan)
	}
	sameTree(t, build(t, src), build(t, dst))
}

// TestPushTreeReportsTheUnpacksRefusal: an unpack started early that fails at once (its feeds
// fail later, having nothing to connect to) is reported as the cause, whatever order the
// commands are collected in.
func TestPushTreeReportsTheUnpacksRefusal(t *testing.T) {
	ctx := synctest.Context(t)
	boxDir, remote := startBox(t)
	remote.Channels = 3
	exe := remote.Command
	remote.Command = `f() { case "$*" in *--parts*) echo "SIMULATED UNPACK REFUSAL" >&2; exit 1;; feed*) sleep 0.3; echo "feed: nothing to connect to" >&2; exit 1;; esac; exec ` + exe + ` "$@"; }; f`
	answered := make(chan struct{})
	remote.beforeList = func() { <-answered; time.Sleep(time.Second) } // both fail while the tree is listed
	remote.boxAnswered = func(bool) { close(answered) }
	src := partsTree(t)
	_, err := PushTree(ctx, remote, src, filepath.Join(boxDir, "ws"), TreeOptions{})
	if err == nil || !strings.Contains(err.Error(), "SIMULATED UNPACK REFUSAL") {
		t.Fatalf("err = %v, want the unpack's refusal", err)
	}
}

// TestPushTreeNamesWhatItLeftOut: a FIFO in the tree cannot be synced; the result names it (for
// the caller to tell the user) and the rest lands.
func TestPushTreeNamesWhatItLeftOut(t *testing.T) {
	ctx := synctest.Context(t)
	boxDir, remote := startBox(t)
	src := t.TempDir()
	synctest.Write(t, src, map[string]string{"a.txt": "a"})
	must(t, syscall.Mkfifo(filepath.Join(src, "pipe"), 0o600))
	dst := filepath.Join(boxDir, "ws")
	res, err := PushTree(ctx, remote, src, dst, TreeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(res.Skipped, []string{"pipe"}) {
		t.Fatalf("skipped %v, want the FIFO", res.Skipped)
	}
	if synctest.Read(t, dst, "a.txt") != "a" || synctest.Read(t, dst, "pipe") != "<missing>" {
		t.Fatal("box tree wrong")
	}
}

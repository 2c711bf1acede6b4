package stream

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/klauspost/compress/zstd"

	"github.com/openclaw/cloudworkers/sync/internal/synctest"
	"github.com/openclaw/cloudworkers/sync/manifest"
)

// hostileArchive is a tar+zstd archive whose plan entry declares size bytes, its content read
// from plan, compressed as it is read: no more of it is generated than Apply reads. stop ends
// the generator and waits for it (also at cleanup).
func hostileArchive(t *testing.T, size int64, plan io.Reader) (_ io.Reader, stop func()) {
	t.Helper()
	pr, pw := io.Pipe()
	done := make(chan struct{})
	go func() {
		defer close(done)
		zw, err := zstd.NewWriter(pw, zstd.WithEncoderConcurrency(1), zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithWindowSize(1<<20), zstd.WithLowerEncoderMem(true))
		if err != nil {
			pw.CloseWithError(err)
			return
		}
		tw := tar.NewWriter(zw)
		err = tw.WriteHeader(&tar.Header{Name: headerName, Typeflag: tar.TypeReg, Mode: 0o600, Size: size})
		if err == nil {
			_, err = io.Copy(tw, io.LimitReader(plan, size))
		}
		if err == nil {
			err = tw.Close()
		}
		if err == nil {
			err = zw.Close()
		}
		pw.CloseWithError(err)
	}()
	stop = func() {
		pr.Close() // ends the writer's copy
		<-done
	}
	t.Cleanup(stop)
	return pr, stop
}

// maxHeap bounds what refusing a hostile plan may allocate: 64 MiB, twice that under the race
// detector, whose runtime allocates more for the same decoding (98 MiB where 55 MiB without).
const maxHeap = 64 << 20 * (1 + raceEnabled)

func fileEntryJSON(i int, b []byte) []byte {
	return fmt.Appendf(b, `{"path":"src/pkg%05d/file%04d.go","type":"file","mode":420,"size":%d,"mtime":1700000000000000000,"sha256":"%s"}`,
		i/1000, i%1000, 1000+i%5000, strings.Repeat("ab", 32))
}

// A box's plan that starts well and goes on with hundreds of MiB of entries is refused as soon
// as it passes a bound, having cost a bounded heap and nothing on disk: at the header (a plan
// declared over MaxPlanBytes is not read at all), at the entry bound (a caller that raised the
// plan's byte bound), at the version (checked before any entry is read). Reading the whole plan
// before checking it took 23 s and 3.9 GiB of heap for 200 MiB.
func TestApplyRefusesHugePlansWithBoundedHeap(t *testing.T) {
	const size = 200 << 20
	tests := []struct {
		name    string
		head    string
		lim     Limits
		want    string
		maxRead int64 // of the plan's bytes
	}{
		{name: "declared over the plan bound", head: `{"version":2,"entries":[`, want: "plan of 209715200 bytes is over the limit of 67108864", maxRead: 0},
		{name: "entries over the entry bound", head: `{"version":2,"entries":[`, lim: Limits{MaxPlanBytes: 1 << 30}, want: "more than 200000 entries", maxRead: 64 << 20},
		{name: "another version", head: `{"version":1,"entries":[`, lim: Limits{MaxPlanBytes: 1 << 30}, want: "plan version 1 not supported", maxRead: 1 << 20},
		{name: "deletions over the entry bound", head: `{"version":2,"entries":[],"deletes":[`, lim: Limits{MaxPlanBytes: 1 << 30}, want: "more than 200000 entries", maxRead: 64 << 20},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := synctest.Context(t)
			root := t.TempDir()
			synctest.Write(t, root, map[string]string{"keep.txt": "keep"})
			before := synctest.Snapshot(t, root)
			entry := fileEntryJSON
			if strings.Contains(tt.head, "deletes") {
				entry = func(i int, b []byte) []byte { return fmt.Appendf(b, `"d%08d"`, i) }
			}
			plan := &synctest.LazyJSON{Prefix: tt.head, Entry: entry, Size: 1 << 40}
			data, stop := hostileArchive(t, size, plan)
			var err error
			heap := synctest.Allocated(func() { _, err = Apply(ctx, data, root, ApplyOptions{Limits: tt.lim}) })
			stop()
			var re *RefusedError
			if !errors.As(err, &re) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err %v, want a refusal: %s", err, tt.want)
			}
			t.Logf("refused after %d MiB of the plan, %d MiB of heap allocated: %v", plan.Sent()>>20, heap>>20, err)
			if heap > maxHeap {
				t.Fatalf("refusing the plan allocated %d MiB, want < %d MiB", heap>>20, maxHeap>>20)
			}
			// What the compressor and the pipe read ahead of Apply is counted too: a MiB.
			if plan.Sent() > tt.maxRead+(2<<20) {
				t.Fatalf("read %d MiB of the plan before refusing it, want at most %d MiB", plan.Sent()>>20, tt.maxRead>>20)
			}
			if after := synctest.Snapshot(t, root); !maps.Equal(before, after) {
				t.Fatalf("target changed: %v", after)
			}
		})
	}
}

// The plan a box sends back must be the one the gateway asked for: with Expect set, it may not
// hold more entries than that, and is refused at the first one beyond.
func TestApplyRefusesMoreEntriesThanRequested(t *testing.T) {
	ctx := synctest.Context(t)
	okE, okR := fileEntry("ok.txt", "fine")
	plan := Plan{Version: PlanVersion, Entries: []manifest.Entry{okE}}
	hostile := &synctest.LazyJSON{Prefix: `{"version":2,"entries":[`, Entry: fileEntryJSON, Size: 1 << 40}
	hostileData, stop := hostileArchive(t, 60<<20, hostile)
	_, err := Apply(ctx, hostileData, t.TempDir(), ApplyOptions{Expect: &plan})
	stop()
	if err == nil || !strings.Contains(err.Error(), "more entries than requested") {
		t.Fatalf("err %v, want the requested plan's count enforced", err)
	}
	if hostile.Sent() > 4<<20 {
		t.Fatalf("read %d MiB of a plan longer than requested", hostile.Sent()>>20)
	}
	// The requested plan itself applies.
	root := t.TempDir()
	if _, err := Apply(ctx, bytes.NewReader(archive(t, plan, okR)), root, ApplyOptions{Expect: &plan}); err != nil {
		t.Fatal(err)
	}
}

// A box path with a control character is refused, and the refusal prints it quoted.
func TestApplyRefusesControlCharactersInPaths(t *testing.T) {
	for _, p := range []string{"evil\n.txt", "esc\x1b]0;title\x07", "c1\u009b2J", "del\x7f"} {
		t.Run(fmt.Sprintf("%q", p), func(t *testing.T) {
			e, r := fileEntry(p, "x")
			root := t.TempDir()
			for name, data := range map[string][]byte{
				"entry":    archive(t, Plan{Entries: []manifest.Entry{e}}, r),
				"deletion": archive(t, Plan{Deletes: []string{p}}),
			} {
				_, err := Apply(synctest.Context(t), bytes.NewReader(data), root, ApplyOptions{})
				if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("%q", p)) || !strings.Contains(err.Error(), "control character") {
					t.Fatalf("%s: err %v, want a refusal naming %q", name, err, p)
				}
				if strings.ContainsAny(err.Error(), "\n\x1b\x7f\u009b") {
					t.Fatalf("%s: the error carries the raw control character: %q", name, err.Error())
				}
			}
			if entries, _ := os.ReadDir(root); len(entries) != 0 {
				t.Fatalf("refused archive wrote %v", entries)
			}
		})
	}
}

// fakeFS is a filesystem for the space check: free and total bytes by directory prefix.
type fakeFS struct {
	id          uint64
	free, total uint64
}

func fakeStatfs(fss map[string]fakeFS) func(string) (FSSpace, error) {
	return func(dir string) (FSSpace, error) {
		best := ""
		for p := range fss {
			if (dir == p || strings.HasPrefix(dir, p+string(filepath.Separator))) && len(p) > len(best) {
				best = p
			}
		}
		if best == "" {
			return FSSpace{}, fmt.Errorf("no fake filesystem for %s", dir)
		}
		f := fss[best]
		return FSSpace{ID: f.id, Free: f.free, Total: f.total}, nil
	}
}

// An archive whose content would leave less than the reserve free on the anchor's filesystem or
// on that of the data directory (gateway.db) is refused before anything is staged, with an
// error that says how much room it needed, had and keeps; with room enough it applies.
func TestApplyKeepsTheReserveFree(t *testing.T) {
	const GiB = 1 << 30
	bigE, bigR := fileEntry("big.bin", strings.Repeat("b", 300<<10)) // 300 KiB: rounded to 4 KiB blocks
	data := archive(t, Plan{Entries: []manifest.Entry{bigE}}, bigR)
	need := uint64(300 << 10)
	tests := []struct {
		name string
		// filesystems of the anchor and of the data dir; same id: one filesystem
		anchor, dataDir fakeFS
		cold            bool
		want            string // "" applies
	}{
		{name: "room enough", anchor: fakeFS{1, 2 * GiB, 10 * GiB}, dataDir: fakeFS{1, 2 * GiB, 10 * GiB}},
		{name: "content would eat the 1 GiB reserve", anchor: fakeFS{1, GiB + need - 1, 10 * GiB}, dataDir: fakeFS{1, GiB + need - 1, 10 * GiB},
			want: "not enough free space on the filesystem of ANCHOR: need 300.0 KiB, have 1.0 GiB, keeping at least 1.0 GiB free"},
		{name: "content would eat 5% of a large disk", anchor: fakeFS{1, 40 * GiB, 1000 * GiB}, dataDir: fakeFS{2, 100 * GiB, 1000 * GiB},
			want: "need 300.0 KiB, have 40.0 GiB, keeping at least 50.0 GiB free"},
		{name: "the data directory's own filesystem is short", anchor: fakeFS{1, 50 * GiB, 100 * GiB}, dataDir: fakeFS{2, GiB / 2, 100 * GiB},
			want: "not enough free space on the filesystem of DATA: need 0 B, have 512.0 MiB, keeping at least 5.0 GiB free"},
		{name: "a new anchor counts against its parent's filesystem", cold: true, anchor: fakeFS{1, GiB, 10 * GiB}, dataDir: fakeFS{2, 5 * GiB, 10 * GiB},
			want: "not enough free space on the filesystem of ANCHOR: need 300.0 KiB, have 1.0 GiB, keeping at least 1.0 GiB free"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			base, dataDir := t.TempDir(), t.TempDir()
			root := filepath.Join(base, "anchor")
			if !tt.cold {
				synctest.Write(t, root, map[string]string{"keep.txt": "keep"})
			}
			space := &SpaceCheck{Keep: []string{dataDir}, Statfs: fakeStatfs(map[string]fakeFS{base: tt.anchor, dataDir: tt.dataDir})}
			before := synctest.Snapshot(t, base)
			_, err := Apply(synctest.Context(t), bytes.NewReader(data), root, ApplyOptions{Space: space})
			if tt.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				if got := synctest.Read(t, root, "big.bin"); got != strings.Repeat("b", 300<<10) {
					t.Fatal("big.bin not written")
				}
				return
			}
			checked := root // a new anchor is staged beside it: its parent's filesystem
			if tt.cold {
				checked = base
			}
			want := strings.NewReplacer("ANCHOR", checked, "DATA", dataDir).Replace(tt.want)
			if !errors.Is(err, ErrNoSpace) || !strings.Contains(err.Error(), want) {
				t.Fatalf("err %v, want %s", err, want)
			}
			if after := synctest.Snapshot(t, base); !maps.Equal(before, after) {
				t.Fatalf("refused archive changed the anchor's filesystem: %v", after)
			}
		})
	}
}

// The space check is taken again once the content is staged: a filesystem that filled up
// meanwhile (another writer) refuses the commit, and the staging is removed.
func TestApplyChecksSpaceAgainBeforeCommit(t *testing.T) {
	const GiB = 1 << 30
	okE, okR := fileEntry("ok.txt", "fine")
	root := t.TempDir()
	synctest.Write(t, root, map[string]string{"keep.txt": "keep"})
	before := synctest.Snapshot(t, root)
	calls := 0
	space := &SpaceCheck{Statfs: func(string) (FSSpace, error) {
		calls++
		if calls == 1 {
			return FSSpace{ID: 1, Free: 5 * GiB, Total: 10 * GiB}, nil
		}
		return FSSpace{ID: 1, Free: GiB / 4, Total: 10 * GiB}, nil // filled while staging
	}}
	_, err := Apply(synctest.Context(t), bytes.NewReader(archive(t, Plan{Entries: []manifest.Entry{okE}}, okR)), root, ApplyOptions{Space: space})
	if !errors.Is(err, ErrNoSpace) || !strings.Contains(err.Error(), "have 256.0 MiB, keeping at least 1.0 GiB free") {
		t.Fatalf("err %v, want the commit refused for space", err)
	}
	if calls != 2 {
		t.Fatalf("statfs called %d times, want before staging and before commit", calls)
	}
	if after := synctest.Snapshot(t, root); !maps.Equal(before, after) {
		t.Fatalf("refused commit changed the anchor: %v", after)
	}
}

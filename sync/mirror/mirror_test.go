package mirror

import (
	"context"
	"errors"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/openclaw/cloudworkers/sync/internal/synctest"
	"github.com/openclaw/cloudworkers/sync/manifest"
	"github.com/openclaw/cloudworkers/sync/stream"
)

// localFetch serves plans from boxDir through a real archive, as `openclaw worker pack` does.
func localFetch(boxDir string) FetchFunc {
	return func(ctx context.Context, plan stream.Plan, root string, opts stream.ApplyOptions) (stream.Stats, error) {
		plan.Version = stream.PlanVersion
		pr, pw := io.Pipe()
		go func() {
			_, err := stream.Write(ctx, pw, boxDir, plan)
			pw.CloseWithError(err)
		}()
		opts.Expect = &plan
		st, err := stream.Apply(ctx, pr, root, opts)
		pr.CloseWithError(errors.New("done"))
		return st, err
	}
}

func build(t *testing.T, root string) *manifest.Manifest {
	t.Helper()
	m, _, err := manifest.Build(synctest.Context(t), root, manifest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// setup returns an anchor and a box dir holding the same tree, and the base manifest.
func setup(t *testing.T) (anchor, box string, base *manifest.Manifest) {
	t.Helper()
	anchor, box = t.TempDir(), t.TempDir()
	files := map[string]string{"a.txt": "a", "c.txt": "c", "d.txt": "d", "src/x.go": "x", "src/y.go": "y"}
	synctest.Write(t, anchor, files)
	synctest.Write(t, box, files)
	return anchor, box, build(t, anchor)
}

func TestPullDeletionsAndRenames(t *testing.T) {
	ctx := synctest.Context(t)
	anchor, box, base := setup(t)
	must(t, os.Rename(filepath.Join(box, "a.txt"), filepath.Join(box, "renamed.txt")))
	must(t, os.Remove(filepath.Join(box, "c.txt")))
	must(t, os.WriteFile(filepath.Join(box, "d.txt"), []byte("changed on the box"), 0o644))
	synctest.Write(t, box, map[string]string{"new/dir/e.txt": "e", "build/out.o": "excluded"})
	boxM := build(t, box)
	res, err := Pull(ctx, Config{Anchor: anchor, Base: base, Box: boxM, Fetch: localFetch(box), Exclude: []string{"build/"}})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(res.Plan.Deletes, []string{"a.txt", "c.txt"}) {
		t.Fatalf("deletes %v", res.Plan.Deletes)
	}
	want := Filter(boxM, []string{"build/"}, nil)
	if c := manifest.Diff(want, build(t, anchor)); !c.Empty() {
		t.Fatalf("anchor differs from the box: %+v", c)
	}
	if synctest.Read(t, anchor, "build/out.o") != "<missing>" {
		t.Fatal("an excluded file came back")
	}
}

func TestPullStopsOnDrift(t *testing.T) {
	ctx := synctest.Context(t)
	anchor, box, base := setup(t)
	must(t, os.WriteFile(filepath.Join(box, "a.txt"), []byte("box"), 0o644))
	must(t, os.WriteFile(filepath.Join(anchor, "d.txt"), []byte("someone edited the anchor"), 0o644))
	synctest.Write(t, anchor, map[string]string{"stray.txt": "s"})
	before := synctest.Snapshot(t, anchor)
	_, err := Pull(ctx, Config{Anchor: anchor, Base: base, Box: build(t, box), Fetch: localFetch(box)})
	de, ok := errors.AsType[*DriftError](err)
	if !ok {
		t.Fatalf("err %v, want *DriftError", err)
	}
	if !slices.Equal(de.Paths, []string{"stray.txt", "d.txt"}) {
		t.Fatalf("drifted paths %v", de.Paths)
	}
	if !maps.Equal(before, synctest.Snapshot(t, anchor)) {
		t.Fatal("anchor changed")
	}
}

func TestPullDeleteBrake(t *testing.T) {
	ctx := synctest.Context(t)
	anchor, box, base := setup(t)
	for _, p := range []string{"a.txt", "c.txt", "d.txt"} {
		must(t, os.Remove(filepath.Join(box, p)))
	}
	before := synctest.Snapshot(t, anchor)
	cfg := Config{Anchor: anchor, Base: base, Box: build(t, box), Fetch: localFetch(box), MaxDeleteShare: 0.5}
	if _, err := Pull(ctx, cfg); !isTooMany(err) {
		t.Fatalf("err %v, want *TooManyDeletesError", err)
	}
	if !maps.Equal(before, synctest.Snapshot(t, anchor)) {
		t.Fatal("anchor changed")
	}
	cfg.Force = true
	if _, err := Pull(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	if synctest.Read(t, anchor, "a.txt") != "<missing>" || synctest.Read(t, anchor, "src/x.go") != "x" {
		t.Fatal("forced pull did not apply the deletions")
	}
}

func isTooMany(err error) bool { _, ok := errors.AsType[*TooManyDeletesError](err); return ok }

func TestPullRefusesEscapingSymlink(t *testing.T) {
	ctx := synctest.Context(t)
	anchor, box, base := setup(t)
	must(t, os.Symlink("/etc", filepath.Join(box, "etc")))
	before := synctest.Snapshot(t, anchor)
	_, err := Pull(ctx, Config{Anchor: anchor, Base: base, Box: build(t, box), Fetch: localFetch(box)})
	if _, ok := errors.AsType[*stream.RefusedError](err); !ok {
		t.Fatalf("err %v, want *stream.RefusedError", err)
	}
	if !maps.Equal(before, synctest.Snapshot(t, anchor)) {
		t.Fatal("anchor changed")
	}
}

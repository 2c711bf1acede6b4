package placement

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
)

// A tree a box sent back with directory modes of its choosing (000, 0500) is still removed by
// the gateway's owner; a symlink in it is not followed. (As root no mode stops a removal, so
// only an unprivileged run shows the difference.)
func TestRemoveAllTakesBackDirectoriesABoxLocked(t *testing.T) {
	if os.Geteuid() == 0 {
		t.Skip("root removes whatever the modes")
	}
	root := t.TempDir()
	dir := filepath.Join(root, "anchor")
	outside := filepath.Join(root, "outside")
	for _, d := range []string{filepath.Join(dir, "a", "b"), filepath.Join(dir, "c"), outside} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{filepath.Join(dir, "a", "b", "f"), filepath.Join(dir, "c", "g"), filepath.Join(outside, "keep")} {
		if err := os.WriteFile(f, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(outside, filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	for d, mode := range map[string]os.FileMode{filepath.Join(dir, "a", "b"): 0, filepath.Join(dir, "a"): 0o500, filepath.Join(dir, "c"): 0} {
		if err := os.Chmod(d, mode); err != nil {
			t.Fatal(err)
		}
	}
	if err := removeAll(dir); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(dir); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("anchor after removal: %v", err)
	}
	if fi, err := os.Stat(outside); err != nil || fi.Mode().Perm() != 0o755 {
		t.Fatalf("the symlink's target after removal: %v, %v; want it untouched", fi, err)
	}
}

package atomicfile

import (
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
)

// wantOnly fails unless dir holds exactly name, so a temp file left behind is seen.
func wantOnly(t *testing.T, dir, name string) {
	t.Helper()
	des, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(des) != 1 || des[0].Name() != name {
		t.Fatalf("dir holds %v, want only %s (no temp file)", des, name)
	}
}

// wantContent fails unless path holds want.
func wantContent(t *testing.T, path, want string) {
	t.Helper()
	if b, err := os.ReadFile(path); err != nil || string(b) != want {
		t.Fatalf("%s = %q, %v; want %q", path, b, err, want)
	}
}

func TestWriteCreatesWithMode(t *testing.T) {
	for _, mode := range []fs.FileMode{0o600, 0o644, 0o400} {
		t.Run(mode.String(), func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "key")
			if err := Write(path, []byte("secret"), mode); err != nil {
				t.Fatal(err)
			}
			wantContent(t, path, "secret")
			fi, err := os.Stat(path)
			if err != nil {
				t.Fatal(err)
			}
			if fi.Mode().Perm() != mode {
				t.Fatalf("mode = %v, want %v", fi.Mode().Perm(), mode)
			}
			wantOnly(t, dir, "key")
		})
	}
}

func TestWriteReplacesContentAndMode(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "state.json")
	if err := os.WriteFile(path, []byte("a much longer old content"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := Write(path, []byte("new"), 0o600); err != nil {
		t.Fatal(err)
	}
	wantContent(t, path, "new")
	fi, _ := os.Stat(path)
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode = %v, want 0600", fi.Mode().Perm())
	}
}

func TestWriteFuncErrorKeepsOldContentAndLeavesNoTemp(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "manifest")
	if err := os.WriteFile(path, []byte("old"), 0o600); err != nil {
		t.Fatal(err)
	}
	boom := errors.New("encoder broke")
	err := WriteFunc(path, 0o600, func(w io.Writer) error {
		if _, err := io.WriteString(w, "half of the new"); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("err = %v, want the writer's error", err)
	}
	wantContent(t, path, "old")
	wantOnly(t, dir, "manifest")
}

func TestWriteRenameFailureKeepsOldAndLeavesNoTemp(t *testing.T) {
	dir := t.TempDir()
	// A non-empty directory at path: the rename over it fails after the temp file is written.
	path := filepath.Join(dir, "target")
	if err := os.MkdirAll(filepath.Join(path, "child"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := Write(path, []byte("new"), 0o600); err == nil {
		t.Fatal("write over a non-empty directory succeeded")
	}
	fi, err := os.Stat(path)
	if err != nil || !fi.IsDir() {
		t.Fatalf("target is no longer the directory: %v %v", fi, err)
	}
	wantOnly(t, dir, "target")
}

func TestWriteMissingDirFails(t *testing.T) {
	path := filepath.Join(t.TempDir(), "no", "such", "file")
	if err := Write(path, []byte("x"), 0o600); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("err = %v, want not exist", err)
	}
}

func TestWriteUnsynced(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "cache")
	if err := os.WriteFile(path, []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := WriteUnsynced(path, []byte("new"), 0o644); err != nil {
		t.Fatal(err)
	}
	wantContent(t, path, "new")
	wantOnly(t, dir, "cache")
}

func TestWriteThroughSymlinkReplacesLinkNotTarget(t *testing.T) {
	// A rename replaces the name: a symlink planted at path is replaced, its target untouched.
	dir := t.TempDir()
	target := filepath.Join(dir, "elsewhere")
	if err := os.WriteFile(target, []byte("victim"), 0o600); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "file")
	if err := os.Symlink(target, path); err != nil {
		t.Fatal(err)
	}
	if err := Write(path, []byte("new"), 0o600); err != nil {
		t.Fatal(err)
	}
	wantContent(t, target, "victim")
	fi, _ := os.Lstat(path)
	if fi.Mode()&fs.ModeSymlink != 0 {
		t.Fatal("path is still a symlink")
	}
}

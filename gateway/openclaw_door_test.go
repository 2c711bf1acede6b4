package gateway

import (
	"os"
	"path/filepath"
	"testing"
)

// A new session workspace is always a fresh real directory of the gateway's own: a workspaces
// area replaced by a symlink, or a directory already there, is refused and nothing is made
// through it.
func TestNewSessionWorkspaceIsFreshAndOurOwn(t *testing.T) {
	data := t.TempDir()
	dir, err := newSessionWorkspace(data, "ses_1")
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Lstat(dir); err != nil || !fi.IsDir() || fi.Mode().Perm() != 0o700 || dir != filepath.Join(data, "workspaces", "ses_1") {
		t.Fatalf("workspace %s: %v %v", dir, fi, err)
	}
	if _, err := newSessionWorkspace(data, "ses_1"); err == nil {
		t.Fatal("an existing workspace directory was accepted as new")
	}

	elsewhere := t.TempDir()
	planted := t.TempDir()
	if err := os.Symlink(elsewhere, filepath.Join(planted, "workspaces")); err != nil {
		t.Fatal(err)
	}
	if _, err := newSessionWorkspace(planted, "ses_2"); err == nil {
		t.Fatal("a workspaces symlink was followed")
	}
	if entries, _ := os.ReadDir(elsewhere); len(entries) != 0 {
		t.Fatalf("a directory was made through the symlink: %v", entries)
	}
}

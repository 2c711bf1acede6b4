package openclaw

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/openclaw/cloudworkers/gateway/sessions"
	"github.com/openclaw/cloudworkers/gateway/store"
)

// browseRig is a gateway whose workspace root is a temp dir holding its data dir, a file, a hidden
// directory and symlinks leading inside and outside the root.
func browseRig(t *testing.T) (r *rig, root, outside string) {
	t.Helper()
	root, outside = t.TempDir(), t.TempDir()
	for _, d := range []string{"alpha", "beta/.git", ".hidden", "data"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(root, "notes.txt"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(root, "alpha"), filepath.Join(root, "link-in")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(root, "link-out")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(root, "data"), filepath.Join(root, "link-data")); err != nil {
		t.Fatal(err)
	}
	roots, err := sessions.NewRoots("workspaces.roots", []string{root}, filepath.Join(root, "data"), root)
	if err != nil {
		t.Fatal(err)
	}
	r = newRig(t, func(c *Config) {
		db, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "gw.db"))
		if err != nil {
			t.Fatal(err)
		}
		ss, err := sessions.New(sessions.Config{DB: db, Roots: roots})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = ss.Close(context.Background()); _ = db.Close() })
		c.Sessions = ss
	})
	return r, root, outside
}

func names(t *testing.T, m map[string]any) string {
	t.Helper()
	p, _ := m["payload"].(map[string]any)
	if p == nil {
		t.Fatalf("fs.listDir: %v", m)
	}
	var out []string
	for _, e := range p["entries"].([]any) {
		out = append(out, e.(map[string]any)["name"].(string))
	}
	return strings.Join(out, ",")
}

// TestFolderBrowserStaysInsideTheRoots: the New Session page's folder browser lists only
// directories a session's cwd may name: never the data dir, a file, a symlink leading out of the
// roots or into the data dir, nor a directory outside the roots, and it takes operator.admin.
func TestFolderBrowserStaysInsideTheRoots(t *testing.T) {
	r, root, outside := browseRig(t)
	c := adminClient(t, r)
	m := call(c, "1", "fs.listDir", map[string]any{})
	if got := names(t, m); got != "alpha,beta,link-in,.hidden" {
		t.Fatalf("fs.listDir of the start: %s, want alpha,beta,link-in,.hidden", got)
	}
	p := m["payload"].(map[string]any)
	if p["path"] != root || p["home"] != root || p["parent"] != nil {
		t.Fatalf("fs.listDir of the start: path %v home %v parent %v; want the root, no parent outside it", p["path"], p["home"], p["parent"])
	}
	if m := call(c, "2", "fs.listDir", map[string]any{"path": filepath.Join(root, "link-in")}); m["payload"].(map[string]any)["parent"] != root {
		t.Fatalf("fs.listDir of a symlink inside the root: %v, want it resolved with the root as parent", m)
	}
	for _, tc := range []struct {
		params map[string]any
		msg    string
	}{
		{map[string]any{"path": outside}, "outside the workspace roots"},
		{map[string]any{"path": filepath.Join(root, "link-out")}, "outside the workspace roots"},
		{map[string]any{"path": filepath.Join(root, "data")}, "data dir"},
		{map[string]any{"path": filepath.Join(root, "link-data")}, "data dir"},
		{map[string]any{"path": "/etc"}, "/etc"},
		{map[string]any{"path": "/proc/self"}, "/proc"},
		{map[string]any{"path": "alpha"}, "absolute"},
		{map[string]any{"path": filepath.Join(root, "nope")}, "cannot be resolved"},
		{map[string]any{"path": filepath.Join(root, "notes.txt")}, "not a directory"},
		{map[string]any{"nodeId": "mac-1"}, "no nodes"},
	} {
		m := call(c, "x", "fs.listDir", tc.params)
		if code, msg, _ := errCode(m); m["ok"] == true || code != CodeInvalidRequest || !strings.Contains(msg, tc.msg) {
			t.Errorf("fs.listDir %v: %v, want INVALID_REQUEST saying %q", tc.params, m, tc.msg)
		}
	}
	b := call(c, "3", "worktrees.branches", map[string]any{"repoRoot": filepath.Join(root, "beta"), "includeRepositoryStatus": true})
	a := call(c, "4", "worktrees.branches", map[string]any{"repoRoot": filepath.Join(root, "alpha"), "includeRepositoryStatus": true})
	if b["payload"].(map[string]any)["repositoryStatus"] != "git" || a["payload"].(map[string]any)["repositoryStatus"] != "not_git" {
		t.Fatalf("worktrees.branches: beta %v, alpha %v; want git and not_git", b, a)
	}
	if m := call(c, "5", "worktrees.branches", map[string]any{"repoRoot": outside}); m["ok"] == true {
		t.Fatalf("worktrees.branches outside the roots: %v", m)
	}

	narrow := dial(t, r)
	if m := narrow.connect(connectBody(testToken)); m["ok"] != true {
		t.Fatalf("connect: %v", m)
	}
	for _, method := range []string{"fs.listDir", "worktrees.branches"} {
		m := call(narrow, "n", method, map[string]any{"repoRoot": root})
		if code, _, _ := errCode(m); code != CodeForbidden {
			t.Errorf("%s with operator.write only: %v, want FORBIDDEN", method, m)
		}
	}
}

// TestFolderBrowserIsBounded: a directory with more subdirectories than one answer holds is cut at
// maxListEntries.
func TestFolderBrowserIsBounded(t *testing.T) {
	r, root, _ := browseRig(t)
	big := filepath.Join(root, "big")
	for i := range maxListEntries + 100 {
		if err := os.MkdirAll(filepath.Join(big, fmt.Sprintf("d%05d", i)), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	m := call(adminClient(t, r), "1", "fs.listDir", map[string]any{"path": big})
	if n := len(strings.Split(names(t, m), ",")); n != maxListEntries {
		t.Fatalf("fs.listDir of %d directories returned %d, want %d", maxListEntries+100, n, maxListEntries)
	}
}

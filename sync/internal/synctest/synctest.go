// Package synctest holds test helpers shared by the sync packages: an isolated git environment,
// repositories and file trees.
package synctest

import (
	"context"
	"encoding/json"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/openclaw/cloudworkers/internal/testrig/testenv"
	"github.com/openclaw/cloudworkers/sync/gitexec"
)

// IsolateGit points git at an empty HOME and no system config, with a fixed identity, for the
// whole test binary. Call it from TestMain; it returns a cleanup.
//
// The go command keeps its build and module caches and its settings under HOME by default: they
// are pinned to the real ones first, so that BuildBinary does not rebuild everything (the
// standard library included) and fetch every module again in the empty HOME.
func IsolateGit() func() {
	pinGoDirs()
	home, err := os.MkdirTemp("", "synctest-home")
	if err != nil {
		panic(err)
	}
	for k, v := range map[string]string{
		"HOME":                home,
		"XDG_CONFIG_HOME":     filepath.Join(home, ".config"),
		"GIT_CONFIG_NOSYSTEM": "1",
		"GIT_CONFIG_GLOBAL":   filepath.Join(home, ".gitconfig"),
		"GIT_AUTHOR_NAME":     "Test Author",
		"GIT_AUTHOR_EMAIL":    "author@example.invalid",
		"GIT_COMMITTER_NAME":  "Test Committer",
		"GIT_COMMITTER_EMAIL": "committer@example.invalid",
	} {
		os.Setenv(k, v)
	}
	_ = os.WriteFile(filepath.Join(home, ".gitconfig"), []byte("[init]\n\tdefaultBranch = main\n[protocol \"file\"]\n\tallow = always\n"), 0o600)
	return func() { os.RemoveAll(home) }
}

// Main runs a sync package's tests with git isolated (IsolateGit) and exits with their status,
// removing what BuildBinary built on the way out. Call it from TestMain.
func Main(m *testing.M) {
	cleanup := IsolateGit()
	code := m.Run()
	CleanupBinaries()
	cleanup()
	os.Exit(code)
}

// pinGoDirs sets GOCACHE, GOMODCACHE, GOPATH and GOENV to what the go command uses now, where
// the environment does not set them already (nothing when go is not installed).
func pinGoDirs() {
	keys := []string{"GOCACHE", "GOMODCACHE", "GOPATH", "GOENV"}
	out, err := exec.Command("go", append([]string{"env", "-json"}, keys...)...).Output()
	if err != nil {
		return
	}
	var env map[string]string
	if json.Unmarshal(out, &env) != nil {
		return
	}
	for _, k := range keys {
		if _, set := os.LookupEnv(k); !set && env[k] != "" {
			os.Setenv(k, env[k])
		}
	}
}

// HaveGit skips the test when git is missing, failing it when integration tests are required.
func HaveGit(t testing.TB) {
	t.Helper()
	if _, err := exec.LookPath("git"); err != nil {
		if os.Getenv("OPENCLAW_REQUIRE_INTEGRATION") == "1" {
			t.Fatalf("git is required: %v", err)
		}
		t.Skipf("SKIP: git not installed: %v", err)
	}
}

// Context is a bounded context for one test.
func Context(t testing.TB) context.Context { return testenv.Context(t, 60*time.Second) }

// Git runs git in dir and returns trimmed stdout, failing the test on error.
func Git(t testing.TB, dir string, args ...string) string {
	t.Helper()
	out, err := gitexec.Run(context.Background(), dir, args...)
	if err != nil {
		t.Fatalf("%v", err)
	}
	return strings.TrimSpace(string(out))
}

// Write writes files (path → content) below root, creating directories (testenv.WriteFiles).
func Write(t testing.TB, root string, files map[string]string) {
	t.Helper()
	testenv.WriteFiles(t, root, files)
}

// Read returns a file's content below root, or "<missing>".
func Read(t testing.TB, root, p string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(p)))
	if os.IsNotExist(err) {
		return "<missing>"
	}
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// Snapshot returns every path below root with its type and content (symlink targets for links),
// for "nothing changed" assertions.
func Snapshot(t testing.TB, root string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.Walk(root, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		switch {
		case fi.Mode()&os.ModeSymlink != 0:
			t, _ := os.Readlink(p)
			out[rel] = "link:" + t
		case fi.IsDir():
			out[rel] = "dir:" + fi.Mode().Perm().String()
		default:
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			out[rel] = fi.Mode().Perm().String() + ":" + string(b)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// SnapshotWithoutGit is Snapshot of a checkout or worktree without its .git (which a worktree added
// to the repository, or refs written by the gateway, change).
func SnapshotWithoutGit(t testing.TB, root string) map[string]string {
	t.Helper()
	s := Snapshot(t, root)
	maps.DeleteFunc(s, func(k, _ string) bool { return k == ".git" || strings.HasPrefix(k, ".git/") })
	return s
}

// InitRepo creates a repository at dir with files committed on main and returns the commit.
func InitRepo(t testing.TB, dir string, files map[string]string) string {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	Git(t, dir, "init", "-q", "-b", "main")
	Write(t, dir, files)
	Git(t, dir, "add", "-A")
	Git(t, dir, "commit", "-q", "-m", "initial")
	return Git(t, dir, "rev-parse", "HEAD")
}

package gitexec_test

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/openclaw/cloudworkers/sync/gitexec"
	"github.com/openclaw/cloudworkers/sync/internal/synctest"
)

func TestMain(m *testing.M) {
	synctest.Main(m)
}

// TestUntrustedTurnsOffEveryFilter: whatever a filter driver is called (a subsection with dots
// and capitals, defined in the repository or on the command line of the gateway's environment),
// a checkout through Untrusted runs none of it, while plain Run does.
func TestUntrustedTurnsOffEveryFilter(t *testing.T) {
	synctest.HaveGit(t)
	ctx := synctest.Context(t)
	dir := filepath.Join(t.TempDir(), "repo")
	synctest.InitRepo(t, dir, map[string]string{
		".gitattributes": "*.a filter=My.Drv\n*.b filter=env\n",
		"x.a":            "one\n", "x.b": "two\n",
	})
	marker := filepath.Join(t.TempDir(), "ran")
	run := "sh -c 'echo ran >> " + marker + "; cat'"
	synctest.Git(t, dir, "config", "filter.My.Drv.smudge", run)
	synctest.Git(t, dir, "config", "filter.My.Drv.required", "true")
	t.Setenv("GIT_CONFIG_COUNT", "2")
	t.Setenv("GIT_CONFIG_KEY_0", "filter.env.process")
	t.Setenv("GIT_CONFIG_VALUE_0", "sh -c 'echo ran >> "+marker+"; exit 1'")
	t.Setenv("GIT_CONFIG_KEY_1", "filter.env.required")
	t.Setenv("GIT_CONFIG_VALUE_1", "true")

	g, err := gitexec.NewUntrusted(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"x.a", "x.b"} {
		if err := os.Remove(filepath.Join(dir, f)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := g.Run(ctx, "checkout-index", "-f", "x.a", "x.b"); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(marker); err == nil {
		t.Fatalf("a filter ran through Untrusted: %q", b)
	}
	if synctest.Read(t, dir, "x.a") != "one\n" || synctest.Read(t, dir, "x.b") != "two\n" {
		t.Fatal("files not checked out as committed")
	}
	// The same checkout without it runs the driver: the test would see one. The file goes first:
	// git skips a file whose stat data still matches the index (same inode, size and second).
	if err := os.Remove(filepath.Join(dir, "x.a")); err != nil {
		t.Fatal(err)
	}
	_, _ = gitexec.Run(ctx, dir, "checkout-index", "-f", "x.a")
	if _, err := os.Stat(marker); err != nil {
		t.Fatalf("the driver did not run without Untrusted either (%v): the test proves nothing", err)
	}
}

// TestUntrustedRefusesWorktreeConfig: an include (plain or conditional) of a file inside the
// worktree, existing or not yet, is refused with the file named; one inside .git is not.
func TestUntrustedRefusesWorktreeConfig(t *testing.T) {
	synctest.HaveGit(t)
	ctx := synctest.Context(t)
	for _, tc := range []struct {
		key, value string
		refuse     bool
	}{
		{"include.path", "../shared.gitconfig", true}, // relative to .git/config
		{"includeIf.onbranch:main.path", "../team/cfg", true},
		{"include.path", "extra.config", false}, // .git/extra.config
	} {
		t.Run(tc.key+" "+tc.value, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "repo")
			synctest.InitRepo(t, dir, map[string]string{"f": "x"})
			synctest.Git(t, dir, "config", tc.key, tc.value)
			_, err := gitexec.NewUntrusted(ctx, dir)
			if !tc.refuse {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			ce, ok := errors.AsType[*gitexec.ConfigError](err)
			if !ok || !strings.HasSuffix(filepath.ToSlash(ce.File), strings.TrimPrefix(tc.value, "../")) {
				t.Fatalf("err %v, want a *gitexec.ConfigError naming %s", err, tc.value)
			}
		})
	}
}

func TestSplitZ(t *testing.T) {
	for _, tc := range []struct {
		out  string
		want []string
	}{
		{"", nil},
		{"a\x00", []string{"a"}},
		{"a b\x00dir/c\x00", []string{"a b", "dir/c"}},
		{"a\x00\x00b", []string{"a", "b"}}, // an empty record is left out; the last needs no NUL
	} {
		if got := gitexec.SplitZ([]byte(tc.out)); !slices.Equal(got, tc.want) {
			t.Errorf("SplitZ(%q) = %q, want %q", tc.out, got, tc.want)
		}
	}
}

// Files a box sent back can be shaped like a git directory (HEAD, config, objects/, refs/) whose
// config names a worktree and an fsmonitor program. Git run by the gateway there does not take the
// directory for a repository, and runs no program of its config.
func TestAPlantedGitDirectoryIsNotARepository(t *testing.T) {
	ctx := synctest.Context(t)
	dir := filepath.Join(t.TempDir(), "anchor")
	synctest.Git(t, t.TempDir(), "init", "-q", "--bare", dir)
	marker := filepath.Join(t.TempDir(), "ran")
	for _, kv := range [][2]string{{"core.bare", "false"}, {"core.worktree", "."}, {"core.fsmonitor", "sh -c 'touch " + marker + "'"}} {
		synctest.Git(t, t.TempDir(), "--git-dir="+dir, "config", kv[0], kv[1])
	}
	for _, args := range [][]string{{"rev-parse", "--is-inside-work-tree"}, {"status", "--porcelain"}, {"ls-files"}} {
		if out, err := gitexec.Run(ctx, dir, args...); err == nil {
			t.Errorf("git %v in a planted git directory: %q, want it refused", args, out)
		}
	}
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("the planted config's fsmonitor ran")
	}
}

package placement

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/openclaw/cloudworkers/internal/testrig/testenv"
	"github.com/openclaw/cloudworkers/sync/gitexec"
)

// TestAnchorGitRefusesAWorkerFileAsConfig: git in a managed worktree runs through
// gitexec.Untrusted: a configuration that reads a file inside the worktree (which a worker's
// files could replace) is refused before git runs there, and a clean worktree answers.
func TestAnchorGitRefusesAWorkerFileAsConfig(t *testing.T) {
	testenv.RequireCommands(t, "git")
	ctx := testenv.Context(t, 30*time.Second)
	dir := t.TempDir()
	git := func(args ...string) {
		t.Helper()
		if out, err := gitexec.Run(ctx, dir, args...); err != nil {
			t.Fatalf("git %v: %v %s", args, err, out)
		}
	}
	git("init", "-q")
	git("-c", "user.name=t", "-c", "user.email=t@example.invalid", "commit", "-q", "--allow-empty", "-m", "base")
	head, err := AnchorGit(ctx, dir, "rev-parse", "HEAD")
	if err != nil || len(head) != 40 {
		t.Fatalf("clean worktree: %q, %v", head, err)
	}
	worker := filepath.Join(dir, "worker.cfg")
	if err := os.WriteFile(worker, []byte("[core]\n\tfsmonitor = touch fsmonitor-ran\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	git("config", "include.path", worker)
	var ce *gitexec.ConfigError
	if _, err := AnchorGit(ctx, dir, "rev-parse", "HEAD"); !errors.As(err, &ce) {
		t.Fatalf("worktree whose config includes %s: %v, want a *gitexec.ConfigError", worker, err)
	}
}

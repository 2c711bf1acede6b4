package sessions

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"

	"github.com/openclaw/cloudworkers/gateway/store"
	"github.com/openclaw/cloudworkers/providers"
	"github.com/openclaw/cloudworkers/sync/gitexec"
)

// SetWorkspace points a session at another workspace directory (for example the gateway-owned
// anchor holding a worker's results after pull-back).
func (s *Store) SetWorkspace(ctx context.Context, id, dir string) error {
	res, err := s.db.W.ExecContext(ctx, `UPDATE sessions SET workspace=?, updated_at=? WHERE id=?`, dir, store.FormatTime(s.now()), id)
	if err != nil {
		return fmt.Errorf("set workspace of session %s: %w", id, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return notFound(id)
	}
	s.Notify(ChangeSessionUpdated, id)
	return nil
}

// CheckWorkspace refuses a workspace a session cannot run in, before anything is written or leased:
// a path that is not absolute and clean, that does not exist or is not a directory, and — when git
// is set (the user asked for git mode) — one that is not inside a git work tree. The error is a
// *providers.FieldError naming "workspace" (or "git").
func CheckWorkspace(ctx context.Context, dir string, git bool) error {
	if dir == "" {
		if git {
			return providers.Fieldf("workspace", "is required with git")
		}
		return nil
	}
	if !filepath.IsAbs(dir) || filepath.Clean(dir) != dir {
		return providers.Fieldf("workspace", "must be a clean absolute path, got %q", dir)
	}
	fi, err := os.Stat(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return providers.Fieldf("workspace", "%s does not exist (a session never creates its user's workspace)", dir)
	case err != nil:
		return providers.Fieldf("workspace", "%s cannot be read: %v", dir, err)
	case !fi.IsDir():
		return providers.Fieldf("workspace", "%s is not a directory", dir)
	}
	if git {
		if err := gitWorkTree(ctx, dir); err != nil {
			if strings.Contains(err.Error(), "not a git repository") {
				// git's own words add nothing but a second sentence
				return providers.Fieldf("git", "workspace %s is not a git work tree (run git init there, or leave out --git)", dir)
			}
			return providers.Fieldf("git", "workspace %s is not a git work tree: %v", dir, err)
		}
	}
	return nil
}

// gitWorkTree reports (as nil) that dir is inside a git work tree, with the same isolated
// configuration the dispatch uses to decide the sync mode; otherwise git's bounded reason.
func gitWorkTree(ctx context.Context, dir string) error {
	cmd := exec.CommandContext(ctx, "git", append(slices.Clone(gitexec.SafeConfig), "-C", dir, "rev-parse", "--is-inside-work-tree")...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.TempDir(), "GIT_CONFIG_NOSYSTEM=1"}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err == nil && strings.TrimSpace(string(out)) == "true" {
		return nil
	}
	msg := strings.Join(strings.Fields(stderr.String()), " ")
	if len(msg) > 300 {
		msg = msg[:300] + "…"
	}
	switch {
	case msg != "":
		return errors.New(msg)
	case err != nil:
		return err
	}
	return errors.New("it is inside a git directory but not in a work tree")
}

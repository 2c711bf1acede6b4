package placement

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/openclaw/cloudworkers/gateway/sessions"
	"github.com/openclaw/cloudworkers/sync/gitexec"
	"github.com/openclaw/cloudworkers/sync/gitsync"
)

// DeleteTx deletes a removed session's placement and its events in tx.
func (ps *Placements) DeleteTx(ctx context.Context, tx *sql.Tx, sessionID string) error {
	for _, q := range []string{`DELETE FROM placement_events WHERE session_id = ?`, `DELETE FROM placements WHERE session_id = ?`} {
		if _, err := tx.ExecContext(ctx, q, sessionID); err != nil {
			return fmt.Errorf("remove placement of %s: %w", sessionID, err)
		}
	}
	return nil
}

// RefsOf lists the refs under refs/openclaw/ of the session named name (the session id without
// ses_) in the repository whose common git directory is gitDir: each kind's ref of that name and
// everything under it (refs/openclaw/checkpoints/<name>/<n>).
func RefsOf(ctx context.Context, gitDir, name string) ([]string, error) {
	out, err := gitexec.RunEnv(ctx, "/", []string{"GIT_DIR=" + gitDir}, nil, "for-each-ref", "--format=%(refname)", gitsync.RefsRoot)
	if err != nil {
		return nil, err
	}
	var refs []string
	for _, ref := range strings.Fields(string(out)) {
		if n, ok := gitsync.SessionOfRef(ref); ok && n == name {
			refs = append(refs, ref)
		}
	}
	return refs, nil
}

// RemoveFiles removes what the gateway keeps of a session outside SQLite — its managed worktree
// (unregistered from the user's repository), its refs/openclaw/* refs there, its plain-mode anchor
// and its gateway-side workspace — and reports what it removed and what it kept (the branch
// openclaw/<name>, which holds the work pulled back: `openclaw session prune` removes it once
// merged). The session must be resting (no worker holds it, no turn runs).
func (d *Dispatcher) RemoveFiles(ctx context.Context, sess sessions.Session, p Placement) (removed, kept []string, err error) {
	name := anchorName(sess.ID)
	if !gitsync.ValidName(name) {
		return nil, nil, fmt.Errorf("session %s: not a name the gateway made", sess.ID)
	}
	var errs []error
	if sess.Workspace != "" && isGit(ctx, sess.Workspace) {
		r, k, err := d.removeGit(ctx, sess.Workspace, name)
		removed, kept = append(removed, r...), append(kept, k...)
		if err != nil {
			errs = append(errs, err)
		}
	}
	for _, dir := range []string{filepath.Join(d.cfg.DataDir, "anchors", sess.ID), filepath.Join(d.cfg.DataDir, "workspaces", sess.ID)} {
		if _, err := os.Lstat(dir); err != nil {
			continue
		}
		if err := removeAll(dir); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, dir)
	}
	return removed, kept, errors.Join(errs...)
}

// removeAll is os.RemoveAll for a tree whose modes a box chose: a directory it left unreadable or
// unwritable (mode 000, 0500) is given back to its owner (0700) first, symlinks not followed.
func removeAll(dir string) error {
	if err := os.RemoveAll(dir); err == nil {
		return nil
	}
	var open func(d string)
	open = func(d string) {
		_ = os.Chmod(d, 0o700)
		ents, _ := os.ReadDir(d)
		for _, e := range ents {
			if e.IsDir() { // the entry's own type: a symlink to a directory is not one
				open(filepath.Join(d, e.Name()))
			}
		}
	}
	open(dir)
	return os.RemoveAll(dir)
}

// removeGit removes the session's managed worktree and refs from the repository of workspace.
func (d *Dispatcher) removeGit(ctx context.Context, workspace, name string) (removed, kept []string, err error) {
	gitDir, err := gitexec.Line(ctx, workspace, "rev-parse", "--path-format=absolute", "--git-common-dir")
	if err != nil {
		return nil, nil, fmt.Errorf("find the repository of %s: %w", workspace, err)
	}
	fp, err := gitsync.Fingerprint(ctx, workspace)
	if err != nil {
		return nil, nil, err
	}
	git := func(args ...string) error {
		_, err := gitexec.RunEnv(ctx, "/", []string{"GIT_DIR=" + gitDir}, nil, args...)
		return err
	}
	var errs []error
	wt := filepath.Join(d.cfg.DataDir, "worktrees", fp, name)
	if _, err := os.Lstat(wt); err == nil {
		// the session is gone: its worktree's state (pulled back, or discarded by the user) goes too
		if err := git("worktree", "remove", "--force", "--force", wt); err != nil {
			if rerr := os.RemoveAll(wt); rerr != nil {
				errs = append(errs, err)
			}
			_ = git("worktree", "prune")
		}
		removed = append(removed, "worktree "+wt)
	}
	for _, f := range []string{wt + ".submodules.json", wt + ".source"} {
		_ = os.Remove(f)
	}
	refs, err := RefsOf(ctx, gitDir, name)
	if err != nil {
		errs = append(errs, err)
	}
	for _, ref := range refs {
		if err := git("update-ref", "-d", ref); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, ref)
	}
	branch := gitsync.BranchPrefix + name
	if git("rev-parse", "--verify", "-q", "refs/heads/"+branch) == nil {
		kept = append(kept, "branch "+branch+" (the work that came back; `openclaw session prune` removes it once merged)")
	}
	return removed, kept, errors.Join(errs...)
}

// ResultsOnBox reports whether a failed placement's worker results are still on its box: its
// pull-back failed (the worker fenced, its work not home).
func (ps *Placements) ResultsOnBox(ctx context.Context, p Placement) (bool, error) {
	if p.State != Failed {
		return false, nil
	}
	evs, err := ps.Events(ctx, p.SessionID)
	if err != nil {
		return false, err
	}
	return failedFrom(evs).pullingBack(), nil
}

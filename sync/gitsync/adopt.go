package gitsync

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"

	"github.com/openclaw/cloudworkers/sync/gitexec"
)

// MaxBundleBytes bounds a bundle read from a box.
const MaxBundleBytes = 2 << 30

// Adopt takes the worker's commits from bundle (the box made it with `git bundle create F
// <base>..HEAD`, hostile input): it verifies the bundle against the anchor, requires exactly one
// tip, requires the recorded base to be an ancestor of the tip and the managed branch to still be
// at the base or behind the tip, checks the tree of every commit the anchor did not have
// (CheckCommits: *TreeError names what it refused), then fast-forwards the worktree and, in one
// transaction, the managed branch and refs/openclaw/worker-results/<session>. Every git command
// runs through gitexec.Untrusted: no filter, hook, LFS transfer or fsmonitor runs. A failure
// leaves refs, index and worktree as they were — a fast-forward that stopped midway is undone
// (unreferenced objects may remain until gc).
func (a *Anchor) Adopt(ctx context.Context, session, bundle string) (string, error) {
	return a.AdoptChecked(ctx, session, bundle, nil)
}

// AdoptChecked is Adopt with one more check of the worker's commits (a secret scan), run after
// CheckCommits and before anything changes: check sees the anchor's objects (the bundle's
// unbundled), the branch head and the tip; an error it returns stops the adoption as it is.
func (a *Anchor) AdoptChecked(ctx context.Context, session, bundle string, check func(ctx context.Context, g *gitexec.Untrusted, head, tip string) error) (string, error) {
	if !ValidName(session) {
		return "", fmt.Errorf("invalid session name %q", session)
	}
	fi, err := os.Stat(bundle)
	if err != nil {
		return "", err
	}
	if fi.Size() > MaxBundleBytes {
		return "", fmt.Errorf("bundle of %d bytes over the limit of %d", fi.Size(), int64(MaxBundleBytes))
	}
	g, err := gitexec.NewUntrusted(ctx, a.Dir)
	if err != nil {
		return "", err
	}
	if _, err := g.Run(ctx, "bundle", "verify", "-q", bundle); err != nil {
		return "", fmt.Errorf("verify worker bundle: %w", err)
	}
	heads, err := g.Run(ctx, "bundle", "list-heads", bundle)
	if err != nil {
		return "", fmt.Errorf("list bundle heads: %w", err)
	}
	tips := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(heads))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) >= 1 {
			tips[f[0]] = true
		}
	}
	if len(tips) != 1 {
		return "", fmt.Errorf("worker bundle must carry exactly one tip, has %d", len(tips))
	}
	var tip string
	for t := range tips {
		tip = t
	}
	if len(tip) != 40 && len(tip) != 64 {
		return "", fmt.Errorf("worker bundle tip %q is not an object id", tip)
	}
	// Objects only: no ref of the anchor changes yet.
	if _, err := g.Run(ctx, "bundle", "unbundle", bundle); err != nil {
		return "", fmt.Errorf("unbundle: %w", err)
	}
	if _, err := g.Run(ctx, "cat-file", "-e", tip+"^{commit}"); err != nil {
		return "", fmt.Errorf("worker bundle tip is not a commit: %w", err)
	}
	if !isAncestor(ctx, g, a.Base, tip) {
		return "", &DivergedError{Base: a.Base, Tip: tip, Branch: a.Branch, Reason: "the tip does not descend from the recorded base"}
	}
	head, err := g.Line(ctx, "rev-parse", "--verify", "refs/heads/"+a.Branch)
	if err != nil {
		return "", err
	}
	if !isAncestor(ctx, g, head, tip) {
		return "", &DivergedError{Base: a.Base, Tip: tip, Branch: a.Branch, Reason: "the managed branch moved to " + short(head) + " meanwhile"}
	}
	if cur, err := g.Line(ctx, "symbolic-ref", "HEAD"); err != nil || cur != "refs/heads/"+a.Branch {
		return "", fmt.Errorf("managed worktree %s is not on %s", a.Dir, a.Branch)
	}
	if err := CheckCommits(ctx, g, head, tip); err != nil {
		return "", err
	}
	if check != nil {
		if err := check(ctx, g, head, tip); err != nil {
			return "", err
		}
	}
	defer a.lockSubmodules()()
	restore, done, err := a.setAsideReplaced(ctx, tip)
	if err != nil {
		return "", err
	}
	if err := a.fastForward(ctx, g, session, head, tip); err != nil {
		return "", errors.Join(err, restore())
	}
	// The branch has moved: a record not updated here is checked against HEAD next time.
	_ = done()
	// Submodules the worker moved to other commits: their files follow (when the user's checkouts
	// have those commits; the next sync out tries again and reports what it could not fill).
	_, _ = a.fillSubmodules(ctx)
	return tip, nil
}

func isAncestor(ctx context.Context, g *gitexec.Untrusted, anc, desc string) bool {
	_, err := g.Run(ctx, "merge-base", "--is-ancestor", anc, desc)
	return err == nil
}

// fastForward moves index and worktree from head to tip (a two-way `read-tree -m -u`, which
// refuses to overwrite local changes and untracked files before it writes anything), then the
// managed branch (only if still at head) and the session's result ref in one transaction. Should
// either step fail, what the checkout wrote is undone.
func (a *Anchor) fastForward(ctx context.Context, g *gitexec.Untrusted, session, head, tip string) error {
	u, err := a.prepareUndo(ctx, g, head, tip)
	if err != nil {
		return err
	}
	// Stat data, as merge refreshes it: a file whose inode changed (the hard links of prepareUndo
	// change its ctime) but not its content is not a local change; one that is modified stays so,
	// and read-tree names it.
	_, _ = g.Run(ctx, "update-index", "-q", "--refresh")
	if _, err := g.Run(ctx, "read-tree", "-m", "-u", head, tip); err != nil {
		return errors.Join(fmt.Errorf("fast-forward %s: %w", a.Branch, err), u.rollback())
	}
	txn := fmt.Sprintf("start\nupdate refs/heads/%s %s %s\nupdate %s%s %s\nprepare\ncommit\n", a.Branch, tip, head, ResultRefPrefix, session, tip)
	if _, err := g.RunEnv(ctx, nil, []byte(txn), "update-ref", "-m", "openclaw: adopt worker result", "--stdin"); err != nil {
		return errors.Join(fmt.Errorf("fast-forward %s: %w", a.Branch, err), u.rollback())
	}
	return u.discard()
}

// undo puts back what a checkout from head to tip changed in the worktree and the index: each
// path that differs between them was, before the checkout, either absent (removed again, with
// the directories made for it), a directory (made again if removed) or a file or symlink (a hard
// link to it is kept: git unlinks before it writes, so the link keeps the old inode, content and
// mode). The index is copied.
type undo struct {
	root, aside, index string
	paths              []undoPath
	dirs               map[string]os.FileMode // directories that were there (rel → mode)
	made               []string               // directories that were not there
}

type undoPath struct {
	rel, saved string // saved: its hard link (or copy) in aside; "" when absent or a directory
	dir        bool
}

func (a *Anchor) prepareUndo(ctx context.Context, g *gitexec.Untrusted, head, tip string) (*undo, error) {
	out, err := g.Run(ctx, "diff-tree", "-r", "-z", "--name-only", "--no-renames", head, tip)
	if err != nil {
		return nil, err
	}
	index, err := g.Line(ctx, "rev-parse", "--path-format=absolute", "--git-path", "index")
	if err != nil {
		return nil, err
	}
	aside, err := os.MkdirTemp(filepath.Dir(a.Dir), "."+filepath.Base(a.Dir)+".undo-")
	if err != nil {
		return nil, err
	}
	u := &undo{root: a.Dir, aside: aside, index: index, dirs: map[string]os.FileMode{}}
	fail := func(err error) (*undo, error) {
		return nil, errors.Join(err, os.RemoveAll(aside))
	}
	if err := copyPath(index, filepath.Join(aside, "index")); err != nil {
		return fail(fmt.Errorf("save the index: %w", err))
	}
	made := map[string]bool{}
	for i, p := range bytes.Split(bytes.TrimSuffix(out, []byte{0}), []byte{0}) {
		rel := filepath.FromSlash(string(p))
		if rel == "" {
			continue
		}
		// The directories above: there (kept with their mode) or to be made by the checkout.
		for d := filepath.Dir(rel); d != "."; d = filepath.Dir(d) {
			if _, seen := u.dirs[d]; seen || made[d] {
				break
			}
			fi, err := os.Lstat(filepath.Join(a.Dir, d))
			switch {
			case err == nil && fi.IsDir():
				u.dirs[d] = fi.Mode().Perm()
			case errors.Is(err, os.ErrNotExist):
				made[d] = true
			}
		}
		up := undoPath{rel: rel}
		fi, err := os.Lstat(filepath.Join(a.Dir, rel))
		switch {
		case errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ENOTDIR): // below a file, which goes first
		case err != nil:
			return fail(err)
		case fi.IsDir():
			up.dir = true
			u.dirs[rel] = fi.Mode().Perm()
		default:
			up.saved = filepath.Join(aside, fmt.Sprint(i))
			if err := os.Link(filepath.Join(a.Dir, rel), up.saved); err != nil {
				if err := copyPath(filepath.Join(a.Dir, rel), up.saved); err != nil {
					return fail(fmt.Errorf("save %s: %w", rel, err))
				}
			}
		}
		u.paths = append(u.paths, up)
	}
	for d := range made {
		u.made = append(u.made, d)
	}
	return u, nil
}

// deeper orders paths deepest first (then in reverse, so that a directory's entries come
// before it).
func deeper(a, b string) bool {
	da, db := strings.Count(a, string(filepath.Separator)), strings.Count(b, string(filepath.Separator))
	if da != db {
		return da > db
	}
	return a > b
}

func (u *undo) rollback() error {
	var errs []error
	note := func(err error) {
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	sort.Slice(u.paths, func(i, j int) bool { return deeper(u.paths[i].rel, u.paths[j].rel) })
	for _, p := range u.paths {
		full := filepath.Join(u.root, p.rel)
		// Nothing is removed or renamed through a symlink (or below a file): git writes below
		// real directories only, so what lies beyond one is not the checkout's.
		if p.saved == "" && !p.dir {
			// Whatever the checkout put there goes (a directory it made for new files holds only those).
			if realParents(u.root, p.rel) {
				note(os.RemoveAll(full))
			}
			continue
		}
		if err := u.mkdirs(filepath.Dir(p.rel)); err != nil || !realParents(u.root, p.rel) {
			note(fmt.Errorf("put back %s: a directory above it is not one (%v)", p.rel, err))
			continue
		}
		if p.dir {
			if fi, err := os.Lstat(full); err == nil && fi.IsDir() {
				continue
			}
			note(os.RemoveAll(full))
			note(u.mkdirs(p.rel))
			continue
		}
		if fi, err := os.Lstat(full); err == nil {
			if si, err := os.Lstat(p.saved); err == nil && os.SameFile(fi, si) {
				continue // not replaced
			}
			note(os.RemoveAll(full))
		}
		note(os.Rename(p.saved, full))
	}
	sort.Slice(u.made, func(i, j int) bool { return deeper(u.made[i], u.made[j]) })
	for _, d := range u.made {
		if realParents(u.root, d) {
			_ = os.Remove(filepath.Join(u.root, d)) // only if empty: something else may be there now
		}
	}
	note(os.Rename(filepath.Join(u.aside, "index"), u.index))
	if len(errs) > 0 {
		return fmt.Errorf("undo the fast-forward (what could not be put back is kept in %s): %w", u.aside, errors.Join(errs...))
	}
	return os.RemoveAll(u.aside)
}

// mkdirs makes rel and the directories above it that are missing, with the modes they had
// (never through a symlink: Mkdir fails on one).
func (u *undo) mkdirs(rel string) error {
	if rel == "." {
		return nil
	}
	if err := u.mkdirs(filepath.Dir(rel)); err != nil {
		return err
	}
	if fi, err := os.Lstat(filepath.Join(u.root, rel)); err == nil && fi.IsDir() {
		return nil
	}
	mode, ok := u.dirs[rel]
	if !ok {
		mode = 0o755
	}
	full := filepath.Join(u.root, rel)
	if err := os.Mkdir(full, mode); err != nil {
		return err
	}
	return os.Chmod(full, mode) // past the umask
}

func (u *undo) discard() error { return os.RemoveAll(u.aside) }

// copyPath copies a file (with its permission bits) or a symlink.
func copyPath(src, dst string) error {
	fi, err := os.Lstat(src)
	if err != nil {
		return err
	}
	if fi.Mode()&os.ModeSymlink != 0 {
		t, err := os.Readlink(src)
		if err != nil {
			return err
		}
		return os.Symlink(t, dst)
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("%s is not a file", src)
	}
	if err := copyFile(src, dst, fi.Mode().Perm()); err != nil {
		return err
	}
	return os.Chmod(dst, fi.Mode().Perm()) // past the umask
}

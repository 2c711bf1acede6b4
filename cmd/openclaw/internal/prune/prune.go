// Package prune removes what dispatch added to a user's repository (managed worktrees,
// refs/openclaw/* refs, openclaw/<name> branches) for sessions the gateway no longer has:
// `openclaw session prune`.
package prune

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"regexp"
	"slices"
	"strings"

	"github.com/openclaw/cloudworkers/sync/gitexec"
	"github.com/openclaw/cloudworkers/sync/gitsync"
)

// Open finds the repository dir is in (its common git directory, so a linked worktree prunes its
// main repository).
func Open(ctx context.Context, dir string) (Repo, error) {
	gitDir, err := gitexec.Line(ctx, dir, "rev-parse", "--path-format=absolute", "--git-common-dir")
	if err != nil {
		return Repo{}, fmt.Errorf("%s is not in a git repository (--repo names the repository to prune)", dir)
	}
	return Repo{gitDir: gitDir}, nil
}

// sessionRefName matches the <name> of a session id (ses_<name>) in what dispatch adds to a
// repository; branches and refs of any other name are never the gateway's.
var sessionRefName = regexp.MustCompile(`^[0-9a-f]{24}$`)

// Repo is one repository's git, reached through its common git directory.
type Repo struct {
	gitDir string
}

func (r Repo) git(ctx context.Context, args ...string) (string, error) {
	out, err := gitexec.RunEnv(ctx, "/", []string{"GIT_DIR=" + r.gitDir}, nil, args...)
	return strings.TrimSpace(string(out)), err
}

// unmerged counts the commits of tip on no local branch outside openclaw/.
func (r Repo) unmerged(ctx context.Context, tip string) (string, error) {
	return r.git(ctx, "rev-list", "--count", tip, "--not", "--exclude=openclaw/*", "--branches")
}

// Item is one thing of a finished session dispatch added to the repository.
type Item struct {
	Kind, What string // "worktree" /path, "ref" refs/openclaw/…, "branch" openclaw/<name>
}

// Finished lists, per session name, what dispatch added to the repository for sessions that no
// longer exist: gone answers for each session id (asked one by one: a listing could miss one), and
// any error of it stops the prune before anything is removed.
func (r Repo) Finished(ctx context.Context, gone func(ctx context.Context, sessionID string) (bool, error)) (map[string][]Item, error) {
	found := map[string][]Item{}
	add := func(name string, it Item) {
		if sessionRefName.MatchString(name) {
			found[name] = append(found[name], it)
		}
	}
	wts, err := r.git(ctx, "worktree", "list", "--porcelain")
	if err != nil {
		return nil, err
	}
	var path string
	for _, line := range strings.Split(wts, "\n") {
		if p, ok := strings.CutPrefix(line, "worktree "); ok {
			path = p
		}
		if b, ok := strings.CutPrefix(line, "branch refs/heads/"+gitsync.BranchPrefix); ok {
			add(b, Item{"worktree", path})
		}
	}
	refs, err := r.git(ctx, "for-each-ref", "--format=%(refname)", gitsync.RefsRoot, "refs/heads/"+gitsync.BranchPrefix)
	if err != nil {
		return nil, err
	}
	for _, ref := range strings.Fields(refs) {
		if b, ok := strings.CutPrefix(ref, "refs/heads/"+gitsync.BranchPrefix); ok {
			add(b, Item{"branch", gitsync.BranchPrefix + b})
		} else if name, ok := gitsync.SessionOfRef(ref); ok {
			add(name, Item{"ref", ref})
		}
	}
	for name := range found {
		g, err := gone(ctx, "ses_"+name)
		if err != nil {
			return nil, fmt.Errorf("ask the gateway for session ses_%s (nothing was removed): %w", name, err)
		}
		if !g {
			delete(found, name) // the session exists: all of it stays
		}
	}
	return found, nil
}

// pruneOrder is the order of a session's items: its worktree first (its branch cannot go while
// checked out), its refs, then its branch.
var pruneOrder = map[string]int{"worktree": 0, "ref": 1, "branch": 2}

// pruning is one prune run: what it removed and kept, and the errors it met.
type pruning struct {
	r             Repo
	out           io.Writer
	dry, force    bool
	verb          string
	removed, kept int
	errs          []error
}

func (p *pruning) keep(what, why string) {
	p.kept++
	fmt.Fprintf(p.out, "kept %s: %s\n", what, why)
}

func (p *pruning) done(what string) {
	p.removed++
	fmt.Fprintf(p.out, "%s %s\n", p.verb, what)
}

// Prune removes (or, dry, lists) the items of each session in pruneOrder, telling out of each;
// force removes unmerged branches and worktrees with uncommitted changes too.
func (r Repo) Prune(ctx context.Context, out io.Writer, found map[string][]Item, dry, force bool) error {
	p := &pruning{r: r, out: out, dry: dry, force: force, verb: "removed"}
	if dry {
		p.verb = "would remove"
	}
	for _, name := range slices.Sorted(maps.Keys(found)) {
		items := slices.SortedStableFunc(slices.Values(found[name]), func(a, b Item) int {
			return pruneOrder[a.Kind] - pruneOrder[b.Kind]
		})
		wtKept := false
		for _, it := range items {
			switch it.Kind {
			case "worktree":
				if !p.worktree(ctx, it.What) {
					wtKept = true
				}
			case "ref":
				p.ref(ctx, it.What)
			case "branch":
				p.branch(ctx, it.What, wtKept)
			}
		}
	}
	fmt.Fprintf(out, "%s %d, kept %d (sessions the gateway still has are not looked at)\n", p.verb, p.removed, p.kept)
	return errors.Join(p.errs...)
}

// worktree removes a managed worktree unless it has uncommitted changes (or --force); it reports
// whether the worktree is gone (or, dry, would be).
func (p *pruning) worktree(ctx context.Context, path string) bool {
	dirty := ""
	if _, err := os.Stat(path); err == nil {
		out, err := gitexec.Run(ctx, path, "status", "--porcelain", "--untracked-files=normal")
		if err != nil {
			p.errs = append(p.errs, err)
			return true // as before: an unreadable worktree does not hold its branch back
		}
		dirty = strings.TrimSpace(string(out))
	} // else the directory is gone: git removes its registration
	if dirty != "" && !p.force {
		p.keep("worktree "+path, "it has uncommitted changes (--force removes it)")
		return false
	}
	if !p.dry {
		args := []string{"worktree", "remove", path}
		if p.force {
			args = []string{"worktree", "remove", "--force", "--force", path}
		}
		if _, err := p.r.git(ctx, args...); err != nil {
			if _, perr := p.r.git(ctx, "worktree", "prune"); perr != nil || exists(path) {
				p.errs = append(p.errs, err)
				return false
			}
		}
	}
	p.done("worktree " + path)
	return true
}

func (p *pruning) ref(ctx context.Context, ref string) {
	if !p.dry {
		if _, err := p.r.git(ctx, "update-ref", "-d", ref); err != nil {
			p.errs = append(p.errs, err)
			return
		}
	}
	p.done("ref " + ref)
}

// branch deletes a session's branch once merged (or --force), never while its worktree is kept.
func (p *pruning) branch(ctx context.Context, branch string, wtKept bool) {
	n, err := p.r.unmerged(ctx, "refs/heads/"+branch)
	switch {
	case err != nil:
		p.errs = append(p.errs, err)
		return
	case wtKept:
		p.keep("branch "+branch, "its worktree is kept")
		return
	case n != "0" && !p.force:
		p.keep("branch "+branch, n+" commit(s) on no other branch: merge it, or --force deletes it")
		return
	}
	if !p.dry {
		if _, err := p.r.git(ctx, "branch", "-D", branch); err != nil {
			p.errs = append(p.errs, err)
			return
		}
	}
	if n == "0" {
		p.done("branch " + branch + " (merged)")
	} else {
		p.done("branch " + branch + " (" + n + " unmerged commit(s), --force)")
	}
}

func exists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}

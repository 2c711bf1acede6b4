package main

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/openclaw/cloudworkers/gateway/api"
	"github.com/openclaw/cloudworkers/gateway/turns"
	"github.com/openclaw/cloudworkers/sync/gitexec"
	"github.com/openclaw/cloudworkers/sync/gitsync"
)

func newSessionRmCmd(g *globals) *cobra.Command {
	var force, pullBack, discard bool
	cmd := &cobra.Command{
		Use: "rm ID [--force --pull-back|--discard]",
		Example: `  openclaw session rm ses_123
  openclaw session rm ses_123 --force --pull-back
  openclaw session rm ses_123 --force --discard`,
		Aliases: []string{"remove"},
		Short:   "Remove a session: its rows, transcript, managed worktree and refs/openclaw/* refs",
		Long: `Remove a session. A turn running on the gateway is canceled first. Its rows and transcript go, and so
do what dispatch added for it: the managed worktree and its refs/openclaw/* refs in your repository, its
anchor in the data directory. The branch openclaw/<name> stays: it holds the work that came back
(` + "`openclaw session prune`" + ` removes it once merged).

A session a worker holds (active on a worker, or whose pull-back failed with the results still on the
box) is refused unless --force says what happens to its work: --pull-back brings it home first (a
failed pull-back removes nothing), --discard drops it. The environment is released either way.`,
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: completeSessions(g),
		PreRunE: func(*cobra.Command, []string) error {
			switch {
			case pullBack && discard:
				return errors.New("--pull-back and --discard exclude each other: say which happens to the worker's work")
			case force && !pullBack && !discard:
				return errors.New("--force needs --pull-back (bring the worker's work home first) or --discard (drop it)")
			case !force && (pullBack || discard):
				return errors.New("--pull-back and --discard go with --force")
			}
			return nil
		},
		RunE: g.withClient(func(ctx context.Context, c *api.Client, args []string) error {
			mode := turns.RemoveRefuseHeld
			switch {
			case pullBack:
				mode = turns.RemovePullBack
			case discard:
				mode = turns.RemoveDiscard
			}
			rep, err := c.RemoveSession(ctx, args[0], mode)
			if err != nil {
				return err
			}
			if g.structured() {
				return g.emit(stdout, rep)
			}
			if rep.CanceledTurn {
				fmt.Fprintln(stdout, "canceled the running turn")
			}
			switch {
			case rep.PulledBack:
				fmt.Fprintln(stdout, "pulled the worker's work back first")
			case rep.Discarded:
				fmt.Fprintln(stdout, "discarded the worker's work")
			}
			if rep.EnvironmentID != "" {
				fmt.Fprintf(stdout, "environment %s: %s\n", rep.EnvironmentID, rep.EnvironmentState)
			}
			for _, r := range rep.Removed {
				fmt.Fprintln(stdout, "removed "+r)
			}
			for _, k := range rep.Kept {
				fmt.Fprintln(stdout, "kept "+k)
			}
			fmt.Fprintf(stdout, "session %s removed\n", rep.SessionID)
			return nil
		}),
	}
	cmd.Flags().BoolVar(&force, "force", false, "remove a session a worker holds; needs --pull-back or --discard")
	cmd.Flags().BoolVar(&pullBack, "pull-back", false, "with --force: bring the worker's work home first")
	cmd.Flags().BoolVar(&discard, "discard", false, "with --force: drop the worker's work")
	addOutput(cmd, g)
	return cmd
}

func newSessionArchiveCmd(g *globals, archive bool) *cobra.Command {
	use, short, example := "archive ID", "Archive a session: hidden from session list, read-only, transcript kept", "  openclaw session archive ses_123\n  openclaw session list --archived"
	if !archive {
		use, short, example = "unarchive ID", "Unarchive a session: listed and writable again", "  openclaw session unarchive ses_123"
	}
	cmd := &cobra.Command{
		Use: use, Short: short, Example: example,
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: completeSessions(g),
		RunE: g.withClient(func(ctx context.Context, c *api.Client, args []string) error {
			s, err := c.ArchiveSession(ctx, args[0], archive)
			if err != nil {
				return err
			}
			verb := "unarchived"
			if archive {
				verb = "archived (session list --archived shows it; session unarchive " + s.ID + " undoes it)"
			}
			return printResult(g, s, "session "+s.ID+" "+verb)
		}),
	}
	if archive {
		cmd.Long = `Archive a session: session list no longer shows it (--all or --archived does), its transcript is kept
(session show and export still read it), and it is read-only: a message or a dispatch is refused until
session unarchive. A session a worker holds or that runs a turn is refused.`
	}
	addOutput(cmd, g)
	return cmd
}

// sessionRefName matches the <name> of a session id (ses_<name>) in what dispatch adds to a
// repository; branches and refs of any other name are never the gateway's.
var sessionRefName = regexp.MustCompile(`^[0-9a-f]{24}$`)

// pruneRepo is one repository's git, reached through its common git directory.
type pruneRepo struct {
	gitDir string
}

func (r pruneRepo) git(ctx context.Context, args ...string) (string, error) {
	out, err := gitexec.RunEnv(ctx, "/", []string{"GIT_DIR=" + r.gitDir}, nil, args...)
	return strings.TrimSpace(string(out)), err
}

// unmerged counts the commits of tip on no local branch outside openclaw/.
func (r pruneRepo) unmerged(ctx context.Context, tip string) (string, error) {
	return r.git(ctx, "rev-list", "--count", tip, "--not", "--exclude=openclaw/*", "--branches")
}

// pruneItem is one thing of a finished session dispatch added to the repository.
type pruneItem struct {
	kind, what string // "worktree" /path, "ref" refs/openclaw/…, "branch" openclaw/<name>
}

func newSessionPruneCmd(g *globals) *cobra.Command {
	var repo string
	var dryRun, force bool
	cmd := &cobra.Command{
		Use: "prune [--repo DIR] [--dry-run] [--force]",
		Example: `  openclaw session prune --dry-run
  openclaw session prune --repo ~/src/app`,
		Short: "Remove what dispatch added to your repository for sessions that no longer exist",
		Long: `Remove, from the repository of --repo (default: the current directory), what dispatch added for
sessions the gateway no longer has (removed with session rm): their managed worktrees, their
refs/openclaw/* refs and their branches openclaw/<name> (see docs/dispatch.md "What dispatch adds to
your repository"). A session that still exists (archived or not) keeps everything.

A branch openclaw/<name> is deleted only when it is merged (every commit of it is on a local branch
outside openclaw/), a worktree only when it has no uncommitted changes; --force deletes the unmerged
ones too. --dry-run prints what would be removed and removes nothing. Only names the gateway makes
(the 24 hex digits of a session id) are looked at.`,
		Args: cobra.NoArgs,
		RunE: g.withClient(func(ctx context.Context, c *api.Client, _ []string) error {
			abs, err := filepath.Abs(repo)
			if err != nil {
				return err
			}
			gitDir, err := gitexec.Line(ctx, abs, "rev-parse", "--path-format=absolute", "--git-common-dir")
			if err != nil {
				return fmt.Errorf("%s is not in a git repository (--repo names the repository to prune)", abs)
			}
			r := pruneRepo{gitDir: gitDir}
			items, err := r.finished(ctx, c)
			if err != nil {
				return err
			}
			return r.prune(ctx, items, dryRun, force)
		}),
	}
	cmd.Flags().StringVar(&repo, "repo", ".", "the repository to prune")
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "print what would be removed; remove nothing")
	cmd.Flags().BoolVar(&force, "force", false, "also delete unmerged branches and worktrees with uncommitted changes")
	return cmd
}

// finished lists, per session name, what dispatch added to the repository for sessions the gateway
// answers not-found for (each asked by id: a listing could miss one). Any other answer stops the
// prune before anything is removed.
func (r pruneRepo) finished(ctx context.Context, c *api.Client) (map[string][]pruneItem, error) {
	found := map[string][]pruneItem{}
	add := func(name string, it pruneItem) {
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
			add(b, pruneItem{"worktree", path})
		}
	}
	refs, err := r.git(ctx, "for-each-ref", "--format=%(refname)", gitsync.RefsRoot, "refs/heads/"+gitsync.BranchPrefix)
	if err != nil {
		return nil, err
	}
	for _, ref := range strings.Fields(refs) {
		if b, ok := strings.CutPrefix(ref, "refs/heads/"+gitsync.BranchPrefix); ok {
			add(b, pruneItem{"branch", gitsync.BranchPrefix + b})
		} else if name, ok := gitsync.SessionOfRef(ref); ok {
			add(name, pruneItem{"ref", ref})
		}
	}
	for name := range found {
		_, err := c.Session(ctx, "ses_"+name)
		var ae *api.Error
		switch {
		case err == nil:
			delete(found, name) // the session exists: all of it stays
		case errors.As(err, &ae) && ae.Status == http.StatusNotFound && ae.Code == "not-found":
		default:
			return nil, fmt.Errorf("ask the gateway for session ses_%s (nothing was removed): %w", name, err)
		}
	}
	return found, nil
}

// pruneOrder is the order of a session's items: its worktree first (its branch cannot go while
// checked out), its refs, then its branch.
var pruneOrder = map[string]int{"worktree": 0, "ref": 1, "branch": 2}

// pruning is one prune run: what it removed and kept, and the errors it met.
type pruning struct {
	r             pruneRepo
	dry, force    bool
	verb          string
	removed, kept int
	errs          []error
}

func (p *pruning) keep(what, why string) {
	p.kept++
	fmt.Fprintf(stdout, "kept %s: %s\n", what, why)
}

func (p *pruning) done(what string) {
	p.removed++
	fmt.Fprintf(stdout, "%s %s\n", p.verb, what)
}

// prune removes (or, dry, lists) the items of each session in pruneOrder.
func (r pruneRepo) prune(ctx context.Context, found map[string][]pruneItem, dry, force bool) error {
	p := &pruning{r: r, dry: dry, force: force, verb: "removed"}
	if dry {
		p.verb = "would remove"
	}
	for _, name := range slices.Sorted(maps.Keys(found)) {
		items := slices.SortedStableFunc(slices.Values(found[name]), func(a, b pruneItem) int {
			return pruneOrder[a.kind] - pruneOrder[b.kind]
		})
		wtKept := false
		for _, it := range items {
			switch it.kind {
			case "worktree":
				if !p.worktree(ctx, it.what) {
					wtKept = true
				}
			case "ref":
				p.ref(ctx, it.what)
			case "branch":
				p.branch(ctx, it.what, wtKept)
			}
		}
	}
	fmt.Fprintf(stdout, "%s %d, kept %d (sessions the gateway still has are not looked at)\n", p.verb, p.removed, p.kept)
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

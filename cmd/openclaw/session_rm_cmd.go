package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/openclaw/cloudworkers/cmd/openclaw/internal/prune"
	"github.com/openclaw/cloudworkers/gateway/api"
	"github.com/openclaw/cloudworkers/gateway/turns"
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
			r, err := prune.Open(ctx, abs)
			if err != nil {
				return err
			}
			items, err := r.Finished(ctx, func(ctx context.Context, id string) (bool, error) {
				_, err := c.Session(ctx, id)
				var ae *api.Error
				if errors.As(err, &ae) && ae.Status == http.StatusNotFound && ae.Code == "not-found" {
					return true, nil
				}
				return false, err
			})
			if err != nil {
				return err
			}
			return r.Prune(ctx, stdout, items, dryRun, force)
		}),
	}
	cmd.Flags().StringVar(&repo, "repo", ".", "the repository to prune")
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "print what would be removed; remove nothing")
	cmd.Flags().BoolVar(&force, "force", false, "also delete unmerged branches and worktrees with uncommitted changes")
	return cmd
}

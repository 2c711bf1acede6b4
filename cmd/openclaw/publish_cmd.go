package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/openclaw/cloudworkers/gateway/publish"
	"github.com/openclaw/cloudworkers/gateway/workspace"
)

func newSessionPublishCmd(g *globals) *cobra.Command {
	var req workspace.PublishRequest
	cmd := &cobra.Command{
		Use:   "publish ID [--remote NAME] [--pr] [--title T]",
		Short: "Push a session's branch openclaw/<session> to its forge with the gateway's credential",
		Long: `Push the session's managed branch from the gateway's managed worktree to the workspace's configured
remote (its URL from the repository's configuration), authenticated with the git credential the
profile's publish.credential names (held by the gateway, given to git through a credential helper
for that one command; the box never sees it). Every destination ref must match the profile's
publish.pushRefAllowlist (default refs/heads/openclaw/*) and a force push publish.forcePushAllowlist,
or nothing is pushed. --pr opens the branch's pull request on GitHub (or GitHub Enterprise at the
profile's publish.githubApiUrl), or reuses the open one.`,
		Example: `  openclaw session publish ses_… --pr
  openclaw session publish ses_… --remote upstream --title "Fix the flaky test"`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			res, err := c.Publish(cmd.Context(), args[0], req)
			if err != nil {
				return err
			}
			fmt.Fprintf(stdout, "%s %s at %s (%s)\n", res.RemoteURL, res.Ref, res.Commit[:min(12, len(res.Commit))], res.Status)
			if pr := res.PullRequest; pr != nil {
				verb := "reused"
				if pr.Created {
					verb = "opened"
				}
				fmt.Fprintf(stdout, "pull request #%d %s: %s\n", pr.Number, verb, pr.URL)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&req.Remote, "remote", "", "the workspace's remote to push to (default origin)")
	cmd.Flags().StringVar(&req.To, "to", "", "destination ref (default refs/heads/openclaw/<session>)")
	cmd.Flags().BoolVar(&req.Force, "force", false, "force the push (only where the profile's publish.forcePushAllowlist allows)")
	cmd.Flags().BoolVar(&req.PR, "pr", false, "open the branch's pull request (or reuse the open one)")
	cmd.Flags().StringVar(&req.Title, "title", "", "the pull request's title (default the session's title)")
	return cmd
}

// newGitCredentialCmd is the credential helper the gateway gives git for one push (hidden):
// `openclaw git-credential get` answers with the credential in its environment for the one host
// it names.
func newGitCredentialCmd() *cobra.Command {
	return &cobra.Command{
		Use:    "git-credential get|store|erase",
		Hidden: true,
		Args:   cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return publish.RunHelper(args, os.Stdin, stdout, os.Getenv(publish.HelperEnv))
		},
	}
}

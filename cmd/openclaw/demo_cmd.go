package main

import (
	"context"
	"errors"
	"time"

	"github.com/spf13/cobra"

	"github.com/openclaw/cloudworkers/cmd/openclaw/internal/demo"
)

func newDemoCmd(g *globals) *cobra.Command {
	var o demo.Options
	var timeout time.Duration
	cmd := &cobra.Command{
		Use: "demo",
		Example: `  openclaw demo
  openclaw demo --keep`,
		Short: "Run the product end to end on a temp data dir: gateway, worker session, turn, pull-back, teardown",
		Long: `demo runs the whole product once on this machine, with nothing to set up but git:

  1. start a gateway (this executable, as a child process) on a temp data dir and a free port, with the
     built-in scripted model (examples/demo/script.json) and the built-in local box profile "local"
  2. create a git workspace: a small project with one commit, made with a clean git environment, its
     origin a local smart-HTTP forge (git http-backend on loopback) that already has main
  3. start a worker session on it: create the session, dispatch it to profile "local" and print each
     placement step (requested → provisioning → syncing → starting → active) until it is active
  4. send a message; the scripted turn runs on the worker: it reads greeting.txt, edits it, commits
     the change with git and runs the project's check. The turn streams to the terminal
  5. pull the session back and print each step (draining → reconciling → local)
  6. show the managed branch openclaw/<session> fast-forwarded with the worker's commit, and its diff
     against the base commit
  7. publish that branch: set the forge's token with 'openclaw credential set forge --git-token', run
     'openclaw session publish', print the pushed ref and check the forge has it at the branch's tip
  8. show that the user's own checkout is untouched (same branch, same commit, clean tree)
  9. destroy the environment (returns on proof of teardown) and check no box or worker process is left
 10. a second session, on the gateway, whose agent calls sessions_spawn: a child session forks the
     workspace onto a worker of its own, runs the same task there, comes back with its branch, commit
     and cost (listed under its parent), and its environment is destroyed after the pull-back
 11. stop the gateway (with --keep: leave it running and print the Control UI's sign-in link)

Each stage is checked, printed with its timing and listed in a summary table. The command exits 0 only
when every stage really happened. The temp dir, the gateway and any local box are cleaned up even on
failure; a failed demo keeps the temp dir, prints its path and the tail of the gateway log.
--data-dir, --gateway and --token are ignored: the demo always runs its own gateway.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			o.Out, o.Err = stdout, stderr
			err := demo.Run(ctx, o)
			if errors.Is(err, demo.ErrFailed) {
				return &exitError{code: 1, msg: "demo failed"}
			}
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.Script, "script", "", "scripted model turns to use (default: the built-in copy of examples/demo/script.json)")
	f.BoolVar(&o.Keep, "keep", false, "keep the temp dir and leave the gateway running, printing the Control UI's sign-in link")
	f.StringVar(&o.TmpParent, "tmp", "", "parent directory of the demo's temp dir (default $TMPDIR)")
	f.DurationVar(&timeout, "timeout", 3*time.Minute, "give up after this long")
	return cmd
}

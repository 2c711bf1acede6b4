package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/openclaw/cloudworkers/cmd/openclaw/internal/console"
	"github.com/openclaw/cloudworkers/gateway/api"
	"github.com/openclaw/cloudworkers/gateway/envs"
	"github.com/openclaw/cloudworkers/gateway/placement"
)

// watchPlacement prints each placement step after the first skip as it happens, until the
// placement rests.
func watchPlacement(ctx context.Context, c *api.Client, id string, skip int) (api.PlacementView, error) {
	return c.WaitPlacement(ctx, id, skip, console.PlacementSteps(stderr))
}

// placementEvents counts the steps a placement has already taken (0 when it cannot be read).
func placementEvents(ctx context.Context, c *api.Client, id string) int {
	v, _ := c.Placement(ctx, id)
	return len(v.Events)
}

func newSessionDispatchCmd(g *globals) *cobra.Command {
	var profile, class, busy string
	var noWait bool
	cmd := &cobra.Command{
		Use: "dispatch ID --profile P",
		Example: `  openclaw session dispatch ses_123 --profile local
  openclaw session dispatch ses_123 --profile hetzner --class cx32 --no-wait
  openclaw session dispatch ses_123 --profile local --busy cancel`,
		Short: "Move a session to a worker of a profile (provision or reuse, sync, start)",
		Long: `Move a session to a cloud worker: lease (or reuse a warm, idle) machine of the profile, sync the
session's workspace to it (a managed git worktree for a git workspace, a gateway-owned copy otherwise),
attach the worker and fence the previous owner. Each step is recorded, so a gateway restart resumes it.
Later turns run on the worker. The user's own checkout is never written.

A session whose turn runs is moved by --busy: drain (the default) waits for the turn to end, up to the
gateway's placement.drainTimeout (10m), then refuses; cancel stops the turn first; live stops it at its
next model call and goes on with the same turn on the worker (see session move --live).`,
		Args: cobra.ExactArgs(1),
		RunE: g.withClient(func(ctx context.Context, c *api.Client, args []string) error {
			if profile == "" {
				return errors.New("--profile P is required: the worker profile (see openclaw profile list)")
			}
			if _, err := placement.ParseBusyPolicy("--busy", busy); err != nil {
				return err
			}
			return dispatchSession(ctx, c, placement.DispatchRequest{ProfileID: profile, MachineClass: class, Busy: busy}, args[0], !noWait)
		}),
	}
	cmd.Flags().StringVar(&profile, "profile", "", "profile of the worker (see openclaw profile list)")
	cmd.Flags().StringVar(&profile, "worker", "", "same as --profile")
	_ = cmd.Flags().MarkHidden("worker")
	cmd.Flags().StringVar(&class, "class", "", "machine class for this session (overrides the profile's settings.class; lease-CLI providers)")
	cmd.Flags().BoolVar(&noWait, "no-wait", false, "return once the dispatch is recorded")
	cmd.Flags().StringVar(&busy, "busy", "", busyFlagHelp)
	return cmd
}

// busyFlagHelp describes --busy of the commands that move a session.
const busyFlagHelp = "a running turn: drain (wait for it to end; the default), cancel (stop it) or live (stop it at its next model call and go on with it after the move)"

func dispatchSession(ctx context.Context, c *api.Client, req placement.DispatchRequest, id string, wait bool) error {
	skip := placementEvents(ctx, c, id)
	p, err := c.Dispatch(ctx, id, req)
	if err != nil {
		return err
	}
	if !wait {
		fmt.Fprintf(stdout, "session %s %s\n", id, p.State)
		return nil
	}
	return awaitDispatch(ctx, c, id, skip)
}

// awaitDispatch follows a recorded dispatch (printing its steps after the first skip events) until
// the placement rests, and fails unless it is active.
func awaitDispatch(ctx context.Context, c *api.Client, id string, skip int) error {
	v, err := watchPlacement(ctx, c, id, skip)
	if err != nil {
		return err
	}
	if v.Placement.State != placement.Active {
		return &exitError{code: 1, msg: fmt.Sprintf("dispatch of %s ended %s: %s", id, v.Placement.State, v.Placement.Error)}
	}
	fmt.Fprintf(stderr, "session %s active on %s\n", id, v.Placement.EnvironmentID)
	return nil
}

func newSessionPullbackCmd(g *globals) *cobra.Command {
	var noWait, force, destroy bool
	var allowSecrets []string
	var busy string
	cmd := &cobra.Command{
		Use: "pullback ID",
		Example: `  openclaw session pullback ses_123
  openclaw session pullback ses_123 --busy cancel
  openclaw session pullback ses_123 --force
  openclaw session pullback ses_123 --destroy`,
		Short: "Bring a session home from its worker, with the worker's results",
		Long: `Pass the migration barrier: stop new turns, drain the running one, fence the worker (owner epoch),
reconcile the workspace (the worker's commits fast-forward the managed branch openclaw/<session>;
untracked and plain-mode changes are mirrored after drift checks; divergence stops with a recovery action
and changes nothing), then run later turns on the gateway in that workspace.

A pull-back that would delete more than the profile's sync.maxDeleteShare of the workspace's files
(default half) stops (the session shows failed, with the count) and changes nothing; --force confirms
the deletions. A pull-back whose reconciliation
failed (that brake, drift, divergence, a lost link) can be run again: the worker stays fenced and its
results stay on the box until then.

A running turn is drained (--busy drain, the default: the pull-back waits for it to end, up to the
gateway's placement.drainTimeout, then cancels it), stopped at once (--busy cancel) or moved live
(--busy live: it stops at its next model call and goes on here as the same turn). Each step of
the barrier is recorded in the placement's timeline (openclaw session show ID).

--destroy releases the session's environment once the pull-back succeeded (never after a failed one,
whose results are still on the box).`,
		Args: cobra.ExactArgs(1),
		RunE: g.withClient(func(ctx context.Context, c *api.Client, args []string) error {
			if destroy && noWait {
				return errors.New("--destroy waits for the pull-back to succeed; drop --no-wait")
			}
			if _, err := placement.ParseBusyPolicy("--busy", busy); err != nil {
				return err
			}
			skip := placementEvents(ctx, c, args[0])
			p, err := c.PullBack(ctx, args[0], placement.PullBackRequest{Force: force, AllowSecrets: allowSecrets, Busy: busy})
			if err != nil {
				return err
			}
			if noWait {
				fmt.Fprintf(stdout, "session %s %s\n", args[0], p.State)
				return nil
			}
			v, err := watchPlacement(ctx, c, args[0], skip)
			if err != nil {
				return err
			}
			if v.Placement.State != placement.Local {
				return &exitError{code: 1, msg: fmt.Sprintf("pull-back of %s ended %s: %s", args[0], v.Placement.State, v.Placement.Error)}
			}
			fmt.Fprintf(stdout, "session %s is local again; workspace %s\n", args[0], v.Placement.AnchorDir)
			printChanges(ctx, c, args[0])
			if destroy {
				return destroyAfterPullback(ctx, c, firstNonEmpty(v.Placement.EnvironmentID, p.EnvironmentID))
			}
			return nil
		}),
	}
	cmd.Flags().BoolVar(&destroy, "destroy", false, "after a successful pull-back, destroy (release) the session's environment")
	cmd.Flags().BoolVar(&noWait, "no-wait", false, "return once the pull-back is recorded")
	cmd.Flags().BoolVar(&force, "force", false, "apply the worker's deletions even beyond the deletion brake (profile sync.maxDeleteShare, default half of the files)")
	cmd.Flags().StringVar(&busy, "busy", "", busyFlagHelp)
	cmd.Flags().StringArrayVar(&allowSecrets, "allow-secret", nil, "let a known false positive of the secret scan through: RULE:PATH as the refusal named it (repeatable)")
	return cmd
}

func newSessionMoveCmd(g *globals) *cobra.Command {
	var local, force, live, noWait bool
	var to, class, busy string
	cmd := &cobra.Command{
		Use: "move ID --to gateway|worker:PROFILE [--live]",
		Example: `  openclaw session move ses_123 --to worker:hetzner --live
  openclaw session move ses_123 --to gateway --live
  openclaw session move ses_123 --to worker:big --class cx52
  openclaw session move ses_123 --local`,
		Short: "Move a session between the gateway and workers, live while its turn runs",
		Long: `Move a session to the gateway (--to gateway, or --local) or to a lease of a worker profile
(--to worker:PROFILE). From the gateway to a worker this is session dispatch; from a worker to the
gateway, session pullback; from one worker to another, a pull-back (its work comes home into the
anchor) followed by a dispatch from there.

--live moves a session while its turn runs: the agent loop stops at its next model call, after its tool
results are committed; the barrier runs with the turn kept open; and the new owner goes on with the same
turn from the transcript, without new user input. No tool runs twice, nothing of the transcript is
written twice, and a watching client sees one turn (its live events say where it moved). --busy drain
(the default) and cancel work as for dispatch and pullback.

A session asked for a worker never runs on the gateway by itself: when its dispatch failed, its
messages are refused until it is dispatched again or moved here. It then runs on the gateway in its
workspace, or, when its last worker's work never came home through a pull-back (the worker was lost),
in the anchor, which holds that work as of the last checkpoint. A session whose pull-back failed still
has the worker's results on the box: pull back again, or move it with --force, which abandons them.`,
		Args: cobra.ExactArgs(1),
		RunE: g.withClient(func(ctx context.Context, c *api.Client, args []string) error {
			req, err := moveRequest(to, local, live, busy, class, force)
			if err != nil {
				return err
			}
			id := args[0]
			skip := placementEvents(ctx, c, id)
			p, err := c.Move(ctx, id, req)
			if err != nil {
				return err
			}
			if p.State == placement.Local { // moved as it was (a failed or lost placement): nothing to follow
				ses, _ := c.Session(ctx, id)
				fmt.Fprintf(stdout, "session %s is local; its turns run on the gateway in %s\n", id, ses.Workspace)
				return nil
			}
			if noWait {
				fmt.Fprintf(stdout, "session %s %s\n", id, p.State)
				return nil
			}
			v, err := watchPlacement(ctx, c, id, skip)
			if err != nil {
				return err
			}
			want := placement.Local
			if req.To == "worker" {
				want = placement.Active
			}
			if v.Placement.State != want {
				return &exitError{code: 1, msg: fmt.Sprintf("move of %s ended %s: %s", id, v.Placement.State, v.Placement.Error)}
			}
			if want == placement.Active {
				fmt.Fprintf(stdout, "session %s active on %s\n", id, v.Placement.EnvironmentID)
				return nil
			}
			fmt.Fprintf(stdout, "session %s is local again; workspace %s\n", id, v.Placement.AnchorDir)
			printChanges(ctx, c, id)
			return nil
		}),
	}
	cmd.Flags().StringVar(&to, "to", "", "where: gateway, or worker:PROFILE")
	cmd.Flags().BoolVar(&local, "local", false, "same as --to gateway")
	cmd.Flags().BoolVar(&live, "live", false, "move while the turn runs: it stops at its next model call and goes on after the move (same as --busy live)")
	cmd.Flags().StringVar(&busy, "busy", "", busyFlagHelp)
	cmd.Flags().StringVar(&class, "class", "", "machine class of the worker (--to worker:PROFILE; lease-CLI providers)")
	cmd.Flags().BoolVar(&noWait, "no-wait", false, "return once the move is recorded")
	cmd.Flags().BoolVar(&force, "force", false, "after a failed pull-back: abandon the worker's results on the box")
	return cmd
}

// moveRequest checks session move's flags, before anything is asked of the gateway.
func moveRequest(to string, local, live bool, busy, class string, force bool) (placement.MoveRequest, error) {
	req := placement.MoveRequest{Live: live, Busy: busy, MachineClass: class, Force: force}
	switch {
	case local && to != "" && to != "gateway":
		return req, fmt.Errorf("--local and --to %s say different places: give one", to)
	case local, to == "gateway", to == "local":
		req.To = "gateway"
	case strings.HasPrefix(to, "worker:") && len(to) > len("worker:"):
		req.To, req.ProfileID = "worker", strings.TrimPrefix(to, "worker:")
	case to == "worker":
		return req, errors.New("--to worker:PROFILE names the worker profile (see openclaw profile list)")
	case to == "":
		return req, errors.New("say where: --to gateway (or --local), or --to worker:PROFILE; a session goes to a worker also with `openclaw session dispatch ID --profile P`")
	default:
		return req, fmt.Errorf("--to %q: want gateway or worker:PROFILE", to)
	}
	if class != "" && req.To != "worker" {
		return req, errors.New("--class is for --to worker:PROFILE")
	}
	if _, err := placement.ParseBusyPolicy("--busy", busy); err != nil {
		return req, err
	}
	if live && busy != "" && busy != string(placement.BusyLive) {
		return req, fmt.Errorf("--live and --busy %s say different things: give one", busy)
	}
	return req, nil
}

// printChanges says what a pull-back brought back: the branch and its tip, the commits since the
// base (subjects), the files changed and where to look.
func printChanges(ctx context.Context, c *api.Client, id string) {
	ch, err := c.Changes(ctx, id)
	if err != nil {
		fmt.Fprintf(stderr, "(what came back cannot be listed: %v)\n", err)
		return
	}
	if ch.Branch != "" {
		tip := "-"
		if len(ch.Commits) > 0 {
			tip = ch.Commits[0].ID[:12]
		}
		fmt.Fprintf(stdout, "branch %s at %s: %d commit(s) since its base\n", ch.Branch, tip, len(ch.Commits))
		for _, cm := range ch.Commits {
			fmt.Fprintf(stdout, "  %s %s\n", cm.ID[:12], cm.Subject)
		}
	}
	fmt.Fprintf(stdout, "%d file(s) changed in commits, %d uncommitted\n", len(ch.Files), len(ch.Uncommitted))
	for _, f := range ch.Files {
		fmt.Fprintf(stdout, "  %-2s %s\n", f.Status, f.Path)
	}
	for _, f := range ch.Uncommitted {
		fmt.Fprintf(stdout, "  %-2s %s (uncommitted)\n", f.Status, f.Path)
	}
	if ch.Branch != "" {
		fmt.Fprintf(stdout, "look: git log %s (in your repository), openclaw session diff %s\n", ch.Branch, id)
	} else if ch.AnchorDir != "" {
		fmt.Fprintf(stdout, "look: %s\n", ch.AnchorDir)
	}
}

func newSessionDiffCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:     "diff ID",
		Short:   "Show what a session's worker committed: each commit of its managed branch since the base, with its diff",
		Example: "  openclaw session diff ses_123\n  openclaw session diff ses_123 | less -R",
		Args:    cobra.ExactArgs(1),
		RunE: g.withClient(func(ctx context.Context, c *api.Client, args []string) error {
			ch, err := c.Changes(ctx, args[0])
			if err != nil {
				return err
			}
			if ch.Branch == "" {
				return fmt.Errorf("session %s has no managed branch (a plain-mode or never dispatched session); its files are in %s", args[0], dash(ch.AnchorDir))
			}
			// oldest first, as git log --reverse
			for i := len(ch.Commits) - 1; i >= 0; i-- {
				d, err := c.CommitDiff(ctx, args[0], ch.Commits[i].ID)
				if err != nil {
					return err
				}
				fmt.Fprintln(stdout, d)
			}
			if len(ch.Commits) == 0 {
				fmt.Fprintf(stderr, "branch %s has no commits since its base\n", ch.Branch)
			}
			return nil
		}),
	}
	return cmd
}

// destroyAfterPullback releases the environment a pulled-back session ran on and says how it ended.
func destroyAfterPullback(ctx context.Context, c *api.Client, envID string) error {
	if envID == "" {
		fmt.Fprintln(stdout, "no environment to destroy: the session's placement names none")
		return nil
	}
	e, err := c.DestroyEnvironment(ctx, envID, api.DestroyOptions{Wait: 2 * time.Minute})
	if err != nil {
		return fmt.Errorf("the session is home, but destroying environment %s failed: %w (retry with `openclaw env destroy %s`)", envID, err, envID)
	}
	if e.State == envs.Destroyed {
		fmt.Fprintf(stdout, "environment %s destroyed\n", envID)
	} else {
		fmt.Fprintf(stdout, "environment %s is %s (the gateway keeps tearing it down; see `openclaw env show %s`)\n", envID, e.State, envID)
	}
	return nil
}

func firstNonEmpty(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

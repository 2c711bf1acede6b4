package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/openclaw/cloudworkers/gateway/api"
	"github.com/openclaw/cloudworkers/gateway/envs"
)

func newEnvCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use: "env",
		Example: `  openclaw env create --profile local --wait
  openclaw env list`,
		Aliases: []string{"environment", "environments"},
		Short:   "Lease, inspect and destroy environments (leased machines)",
	}
	cmd.AddCommand(newEnvCreateCmd(g), newEnvListCmd(g), newEnvShowCmd(g), newEnvEventsCmd(g),
		newEnvDestroyCmd(g), newEnvSweepCmd(g), newEnvSSHCmd(g), newEnvExecCmd(g), newEnvLogsCmd(g), newEnvExtendCmd(g))
	return cmd
}

// watchStates prints each state an environment reaches until done(e) holds or ctx ends.
// The first skip events (already shown) are not printed.
func watchStates(ctx context.Context, c *api.Client, id string, skip int, done func(envs.Environment) bool) (envs.Environment, error) {
	return c.WaitEnvironment(ctx, id, skip, func(ev envs.Event) { fmt.Fprintln(stderr, eventLine(ev)) }, done)
}

func newEnvCreateCmd(g *globals) *cobra.Command {
	var profile, key string
	var wait bool
	var timeout time.Duration
	cmd := &cobra.Command{
		Use: "create --profile P [--wait]",
		Example: `  openclaw env create --profile local --wait
  openclaw env create --profile hetzner --idempotency-key nightly-1 -o json`,
		Short: "Lease a machine through a profile",
		Long: `Lease a machine through a profile. The intent is recorded before the provider is called, so a
gateway restart adopts the lease instead of leasing twice. With --wait, each state is printed as it is
reached and the command exits non-zero if the environment fails.`,
		Args: cobra.NoArgs,
		RunE: g.withClient(func(ctx context.Context, c *api.Client, _ []string) error {
			e, err := c.CreateEnvironment(ctx, profile, key)
			if err != nil {
				return err
			}
			fmt.Fprintf(stderr, "environment %s requested (profile %s, operation %s)\n", e.ID, e.ProfileID, e.OperationID)
			if wait {
				info, _ := c.Gateway(ctx)
				bootstrap := info.Features["bootstrap"]
				wctx, cancel := context.WithTimeout(ctx, timeout)
				defer cancel()
				e, err = watchStates(wctx, c, e.ID, 0, func(e envs.Environment) bool {
					return e.State.Dead() || e.State == envs.Ready || e.State == envs.Attached || e.State == envs.Idle ||
						(!bootstrap && e.State == envs.Bootstrapping)
				})
				if err != nil {
					return err
				}
				if e.State == envs.Bootstrapping {
					fmt.Fprintln(stderr, "lease recorded; this gateway has no worker bootstrap yet, so the environment stays in bootstrapping")
				}
			}
			if err := printResult(g, e, e.ID); err != nil {
				return err
			}
			if e.State.Dead() {
				return &exitError{code: 1, msg: fmt.Sprintf("environment %s %s: %s", e.ID, e.State, e.Error)}
			}
			return nil
		}),
	}
	f := cmd.Flags()
	f.StringVar(&profile, "profile", "", "profile id (see openclaw profile list)")
	f.StringVar(&key, "idempotency-key", "", "a repeated key returns the same environment")
	f.BoolVar(&wait, "wait", false, "wait and print each state until the environment is up or failed")
	f.DurationVar(&timeout, "timeout", 30*time.Minute, "how long --wait waits")
	_ = cmd.MarkFlagRequired("profile")
	addOutput(cmd, g)
	return cmd
}

func newEnvListCmd(g *globals) *cobra.Command {
	var all bool
	cmd := listCmd(g, &cobra.Command{Use: "list", Example: `  openclaw env list
  openclaw env list --all -o yaml`, Short: "List environments (destroyed ones with --all)", Args: cobra.NoArgs},
		func(ctx context.Context, c *api.Client, _ []string) ([]envs.Environment, error) {
			return c.Environments(ctx, all)
		},
		[]string{"ID", "PROFILE", "STATE", "LEASE", "TUNNEL", "AGE", "IDLE", "ERROR"}, func(e envs.Environment) []string {
			return []string{e.ID, e.ProfileID, string(e.State), dash(e.LeaseID), e.TunnelStatus,
				humanMs(e.AgeMs), humanMs(e.IdleMs), dash(truncate(e.Error, 60))}
		})
	cmd.Flags().BoolVar(&all, "all", false, "include destroyed environments")
	return cmd
}

func newEnvShowCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use: "show ID",
		Example: `  openclaw env show env_123
  openclaw env show env_123 -o json`,
		Short: "Show one environment",
		Args:  cobra.ExactArgs(1),
		RunE: g.withClient(func(ctx context.Context, c *api.Client, args []string) error {
			v, err := c.Environment(ctx, args[0])
			if err != nil {
				return err
			}
			steps, err := c.EnvironmentTimeline(ctx, args[0])
			if err != nil {
				return err
			}
			if g.asJSON() {
				return printJSON(stdout, struct {
					api.EnvironmentView
					Timeline []envs.Step `json:"timeline"`
				}{v, steps})
			}
			if err := printShow(g, v, func(row func(k, v string)) {
				envRows(v.Environment, row)
				row("shedding", sheddingText(v.Shedding))
			}); err != nil {
				return err
			}
			return printTimeline(steps)
		}),
	}
	addOutput(cmd, g)
	return cmd
}

func envRows(e envs.Environment, row func(k, v string)) {
	row("id", e.ID)
	row("profile", e.ProfileID)
	row("provider", e.ProviderID)
	row("state", string(e.State))
	row("error", e.Error)
	row("lease", e.LeaseID)
	row("operation", e.OperationID)
	if e.Lease.SSHHost != "" {
		row("ssh", fmt.Sprintf("%s@%s:%d", e.Lease.SSHUser, e.Lease.SSHHost, e.Lease.SSHPort))
	}
	row("host keys", strings.Join(e.Lease.HostKeys, "\n\t"))
	if !e.Lease.ExpiresAt.IsZero() {
		row("expires", e.Lease.ExpiresAt.Local().Format(time.RFC3339))
	}
	if !e.TTLDeadline.IsZero() {
		row("ttl deadline", e.TTLDeadline.Local().Format(time.RFC3339))
	}
	row("tunnel", e.TunnelStatus)
	row("sessions", strings.Join(e.AttachedSessionIDs, ", "))
	row("age", humanMs(e.AgeMs))
	row("idle", humanMs(e.IdleMs))
	if e.LeasedProfileID != "" && e.LeasedProfileID != e.ProfileID {
		row("leased from", e.LeasedProfileID+" (fallback)")
	}
	if e.SetupKey != "" {
		row("setup", "done (cache key "+e.SetupKey+")")
	}
}

// printTimeline prints the timeline: one line per step (kind, name, start, duration, result,
// detail), then the last lines of the output of a step that failed.
func printTimeline(steps []envs.Step) error {
	if len(steps) == 0 {
		return nil
	}
	fmt.Fprintln(stdout, "\ntimeline")
	w := table(stdout)
	fmt.Fprintln(w, "  KIND\tSTEP\tSTART\tDURATION\tRESULT\tDETAIL")
	for _, s := range steps {
		fmt.Fprintf(w, "  %s\t%s\t%s\t%s\t%s\t%s\n", s.Kind, s.Name, s.StartedAt.Local().Format("15:04:05"),
			(time.Duration(s.DurationMs) * time.Millisecond).String(), s.Result, dash(truncate(s.Detail, 80)))
	}
	if err := w.Flush(); err != nil {
		return err
	}
	for _, s := range steps {
		if s.Result == envs.ResultFailed && s.Output != "" {
			fmt.Fprintf(stdout, "\noutput tail of %s %s:\n%s\n", s.Kind, s.Name, tailLines(s.Output, 20))
		}
	}
	return nil
}

// tailLines is the last n lines of s.
func tailLines(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return "  " + strings.Join(lines, "\n  ")
}

// eventLine is one event as env events --follow and env create --wait print it.
func eventLine(ev envs.Event) string {
	line := fmt.Sprintf("%s  %-13s", ev.At.Local().Format("15:04:05.000"), ev.To)
	if ev.Reason != "" {
		line += "  " + ev.Reason
	}
	if s := ev.Step; s != nil && s.Result == envs.ResultFailed && s.Output != "" {
		line += "\n" + tailLines(s.Output, 10)
	}
	return line
}

// sheddingText says which capacity limit sheds the environment's load and since when ("" when none).
func sheddingText(s *api.Shedding) string {
	if s == nil {
		return ""
	}
	return fmt.Sprintf("%s (since %s)", s.Reason, s.Since.Local().Format(time.RFC3339))
}

func newEnvEventsCmd(g *globals) *cobra.Command {
	var follow bool
	cmd := listCmd(g, &cobra.Command{Use: "events ID [--follow]", Example: "  openclaw env events env_123\n  openclaw env events env_123 --follow", Short: "Show the state changes and timeline steps of an environment",
		Long: `Show the state changes of an environment and its timeline steps (provisioning attempts, bootstrap
and setup steps with their duration and result). With --follow, events are printed as they happen
until the environment is destroyed (or interrupted); a failed step's output tail is printed under it.`,
		Args: cobra.ExactArgs(1)},
		func(ctx context.Context, c *api.Client, args []string) ([]envs.Event, error) {
			return c.EnvironmentEvents(ctx, args[0])
		},
		[]string{"TIME", "FROM", "TO", "REASON"}, func(ev envs.Event) []string {
			return []string{ev.At.Local().Format(time.RFC3339), dash(string(ev.From)), string(ev.To), ev.Reason}
		})
	list := cmd.RunE
	cmd.RunE = func(c *cobra.Command, args []string) error {
		if !follow {
			return list(c, args)
		}
		return g.withClient(func(ctx context.Context, cl *api.Client, args []string) error {
			_, err := cl.WaitEnvironment(ctx, args[0], 0, func(ev envs.Event) {
				if g.asJSON() {
					_ = printJSON(stdout, ev)
					return
				}
				fmt.Fprintln(stdout, eventLine(ev))
			}, func(e envs.Environment) bool { return e.State == envs.Destroyed })
			return err
		})(c, args)
	}
	cmd.Flags().BoolVar(&follow, "follow", false, "print events as they happen until the environment is destroyed")
	return cmd
}

func newEnvDestroyCmd(g *globals) *cobra.Command {
	var force, noWait bool
	var timeout time.Duration
	cmd := &cobra.Command{
		Use: "destroy ID [--force]",
		Example: `  openclaw env destroy env_123
  openclaw env destroy env_123 --force --no-wait`,
		Short: "Destroy an environment; returns on proof of teardown",
		Long: `Destroy an environment. The command returns only when the provider's inspect proves the lease is gone;
until then the environment stays in destroying and the gateway retries with backoff (also across restarts).
--force destroys from any state, including an environment attached to a session.`,
		Args: cobra.ExactArgs(1),
		RunE: g.withClient(func(ctx context.Context, c *api.Client, args []string) error {
			e, err := c.DestroyEnvironment(ctx, args[0], api.DestroyOptions{Force: force})
			var ae *api.Error
			if errors.As(err, &ae) && ae.Code == "conflict" && !force {
				return fmt.Errorf("%s: %s; openclaw env destroy %s --force destroys it anyway (its sessions lose their worker)",
					ae.Code, strings.TrimSuffix(ae.Message, " (use force)"), args[0])
			}
			if err != nil {
				return err
			}
			if !noWait && e.State != envs.Destroyed {
				wctx, cancel := context.WithTimeout(ctx, timeout)
				defer cancel()
				e, err = watchStates(wctx, c, e.ID, 0, func(e envs.Environment) bool { return e.State == envs.Destroyed })
				if err != nil {
					return fmt.Errorf("%w (the gateway keeps retrying; last error: %s)", err, dash(e.Error))
				}
			}
			return printResult(g, e, fmt.Sprintf("environment %s %s", e.ID, e.State))
		}),
	}
	f := cmd.Flags()
	f.BoolVar(&force, "force", false, "destroy from any state, even when attached")
	f.BoolVar(&noWait, "no-wait", false, "return once teardown has started")
	f.DurationVar(&timeout, "timeout", 15*time.Minute, "how long to wait for proof of teardown")
	addOutput(cmd, g)
	return cmd
}

func newEnvSweepCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use: "sweep",
		Example: `  openclaw env sweep
  openclaw env sweep -o json`,
		Short: "Run the orphan sweep now: destroy leases of this gateway that no live environment owns",
		Args:  cobra.NoArgs,
		RunE: g.withClient(func(ctx context.Context, c *api.Client, _ []string) error {
			rep, err := c.Sweep(ctx)
			if err != nil {
				return err
			}
			if g.structured() {
				return g.emit(stdout, rep)
			}
			fmt.Fprintf(stdout, "checked %d leases, destroyed %d, orphaned %d environments\n", rep.Checked, len(rep.Destroyed), len(rep.Orphaned))
			for _, d := range rep.Destroyed {
				fmt.Fprintf(stdout, "  destroyed %s (profile %s): %s\n", d.LeaseID, d.ProfileID, d.Reason)
			}
			for _, o := range rep.Orphaned {
				fmt.Fprintf(stdout, "  orphaned %s\n", o)
			}
			for _, e := range rep.Errors {
				fmt.Fprintf(stdout, "  error: %s\n", e)
			}
			return nil
		}),
	}
	addOutput(cmd, g)
	return cmd
}

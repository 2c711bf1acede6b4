package main

import (
	"context"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/openclaw/cloudworkers/gateway/api"
)

// Dynamic shell completion: names are asked of the gateway (bounded to a couple of seconds, so
// a gateway that is down never hangs the shell); a failure completes nothing.

type completeFunc = func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective)

// completeNames completes the first argument from the names list returns (each "name\tdescription").
func completeNames(g *globals, list func(context.Context, *api.Client) ([]string, error)) completeFunc {
	return func(cmd *cobra.Command, args []string, prefix string) ([]string, cobra.ShellCompDirective) {
		if len(args) > 0 {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		return names(cmd, g, list, prefix)
	}
}

// completeFlag completes a flag's value from the names list returns.
func completeFlag(g *globals, list func(context.Context, *api.Client) ([]string, error)) completeFunc {
	return func(cmd *cobra.Command, _ []string, prefix string) ([]string, cobra.ShellCompDirective) {
		return names(cmd, g, list, prefix)
	}
}

func names(cmd *cobra.Command, g *globals, list func(context.Context, *api.Client) ([]string, error), prefix string) ([]string, cobra.ShellCompDirective) {
	g.fromEnv()
	if g.applyContext() != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	c, err := g.client()
	if err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	ctx, cancel := context.WithTimeout(cmd.Context(), 3*time.Second)
	defer cancel()
	all, err := list(ctx, c)
	if err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	out := all[:0]
	for _, n := range all {
		if strings.HasPrefix(n, prefix) {
			out = append(out, n)
		}
	}
	return out, cobra.ShellCompDirectiveNoFileComp
}

func sessionNames(ctx context.Context, c *api.Client) ([]string, error) {
	list, err := c.Sessions(ctx)
	var out []string
	for _, s := range list {
		out = append(out, s.ID+"\t"+strings.TrimSpace(s.Title+" "+string(s.Placement)))
	}
	return out, err
}

func envNames(ctx context.Context, c *api.Client) ([]string, error) {
	list, err := c.Environments(ctx, false)
	var out []string
	for _, e := range list {
		out = append(out, e.ID+"\t"+e.ProfileID+" "+string(e.State))
	}
	return out, err
}

func profileNames(ctx context.Context, c *api.Client) ([]string, error) {
	list, err := c.Profiles(ctx)
	var out []string
	for _, p := range list {
		out = append(out, p.ID+"\t"+p.Provider)
	}
	return out, err
}

func modelNames(ctx context.Context, c *api.Client) ([]string, error) {
	res, err := c.Models(ctx)
	var out []string
	for _, m := range res.Models {
		out = append(out, m.Ref+"\t"+string(m.API))
	}
	return out, err
}

func completeSessions(g *globals) completeFunc { return completeNames(g, sessionNames) }
func completeEnvs(g *globals) completeFunc     { return completeNames(g, envNames) }
func completeProfiles(g *globals) completeFunc { return completeNames(g, profileNames) }

// flagCompletions registers the dynamic completion of the worker-profile, model and environment
// flags a command has.
func flagCompletions(cmd *cobra.Command, g *globals) {
	for flag, list := range map[string]func(context.Context, *api.Client) ([]string, error){
		"profile": profileNames, "worker": profileNames, "model": modelNames,
	} {
		if cmd.Flags().Lookup(flag) != nil {
			_ = cmd.RegisterFlagCompletionFunc(flag, completeFlag(g, list))
		}
	}
}

// finishTree walks the command tree once it is built: every ID argument of a session, env or
// profile command completes from the gateway, and every worker-profile and model flag too.
func finishTree(root *cobra.Command, g *globals) {
	var walk func(*cobra.Command)
	walk = func(c *cobra.Command) {
		flagCompletions(c, g)
		if c.ValidArgsFunction == nil && c.HasParent() {
			f := strings.Fields(c.Use)
			if len(f) > 1 && (f[1] == "ID" || f[1] == "ENV" || f[1] == "S") {
				switch topLevel(c) {
				case "session":
					c.ValidArgsFunction = completeSessions(g)
				case "env":
					c.ValidArgsFunction = completeEnvs(g)
				case "profile":
					c.ValidArgsFunction = completeProfiles(g)
				}
			}
		}
		for _, k := range c.Commands() {
			walk(k)
		}
	}
	walk(root)
}

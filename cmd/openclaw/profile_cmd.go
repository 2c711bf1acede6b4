package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/openclaw/cloudworkers/gateway/api"
	"github.com/openclaw/cloudworkers/gateway/profiles"
	"github.com/openclaw/cloudworkers/providers"
)

func newProfileCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use: "profile",
		Example: `  openclaw profile apply -f profiles.yaml
  openclaw profile list`,
		Short: "Manage provider profiles (how to lease machines and how to treat them)",
	}
	cmd.AddCommand(newProfileAddCmd(g), newProfileApplyCmd(g), newProfileListCmd(g), newProfileShowCmd(g), newProfileRmCmd(g))
	return cmd
}

func newProfileAddCmd(g *globals) *cobra.Command {
	var p providers.Profile
	var settings string
	var idle, ttl string
	var hygiene []string
	cmd := &cobra.Command{
		Use:   "add ID --provider P [--settings JSON]",
		Short: "Create a profile",
		Example: `  openclaw profile add hetzner --provider crabbox --settings '{"provider":"hetzner","class":"cx22"}'
  openclaw profile add dev --provider static --settings @hosts.json`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			p.ID = args[0]
			if settings != "" {
				raw := settings
				if name, ok := strings.CutPrefix(settings, "@"); ok {
					b, err := os.ReadFile(name)
					if err != nil {
						return fmt.Errorf("--settings: %w", err)
					}
					raw = string(b)
				}
				if !json.Valid([]byte(raw)) {
					return fmt.Errorf("--settings is not valid JSON")
				}
				p.Settings = json.RawMessage(raw)
			}
			for flag, v := range map[string]string{"idle-timeout": idle, "ttl": ttl} {
				if v == "" {
					continue
				}
				var d providers.Duration
				if err := d.UnmarshalJSON([]byte(`"` + v + `"`)); err != nil {
					return fmt.Errorf("--%s: %w", flag, err)
				}
				if flag == "ttl" {
					p.Lifetime.TTL = d
				} else {
					p.Lifetime.IdleTimeout = d
				}
			}
			for _, h := range hygiene {
				k, v, ok := strings.Cut(h, "=")
				if !ok {
					return fmt.Errorf("--hygiene %q must be check=enforce|warn", h)
				}
				if p.Hygiene == nil {
					p.Hygiene = map[string]string{}
				}
				p.Hygiene[k] = v
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			out, err := c.CreateProfile(cmd.Context(), p)
			if err != nil {
				return err
			}
			printWarnings(out)
			fmt.Fprintf(stdout, "profile %s created (provider %s)\n", out.ID, out.Provider)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&p.Provider, "provider", "", "provider: command, crabbox, static or local")
	f.StringVar(&settings, "settings", "", "provider settings as JSON, or @file")
	f.StringVar(&idle, "idle-timeout", "", "idle auto-stop (e.g. 30m)")
	f.StringVar(&ttl, "ttl", "", "maximum lifetime (e.g. 24h)")
	f.IntVar(&p.MaxEnvironments, "max-environments", 0, "at most this many live environments (default 4)")
	f.StringSliceVar(&p.Sync.Exclude, "exclude", nil, "sync exclude pattern (repeatable)")
	f.StringSliceVar(&p.Sync.Include, "include", nil, "sync include pattern (repeatable)")
	f.StringSliceVar(&hygiene, "hygiene", nil, "box hygiene policy CHECK=enforce|warn (sshAgent, dockerSocket, cleanEnv, metadataRoute; repeatable)")
	_ = cmd.MarkFlagRequired("provider")
	return cmd
}

func printWarnings(p providers.Profile) {
	for _, w := range p.Warnings {
		fmt.Fprintf(stderr, "warning: profile %s: %s\n", p.ID, w)
	}
}

func newProfileApplyCmd(g *globals) *cobra.Command {
	var file string
	var dry bool
	cmd := &cobra.Command{
		Use:   "apply -f profiles.yaml [--dry-run]",
		Short: "Create or replace the profiles of a YAML file, all or none",
		Long: `Create or replace every profile listed in a YAML file of the shape

  profiles:
    - id: netns
      provider: command
      settings: {provision: [...], inspect: [...], destroy: [...]}
      lifetime: {idleTimeout: 30m, ttl: 24h}
      sync: {exclude: [node_modules, .venv]}
      maxEnvironments: 4

The gateway validates every profile before it writes any: the first bad one stops the apply,
named with its field (a YAML error names its line), and nothing is written. A profile equal to the
stored one is reported unchanged and not rewritten. --dry-run prints what would be created, updated
or left unchanged, and writes nothing.`,
		Example: `  openclaw profile apply -f profiles.yaml --dry-run
  openclaw profile apply -f profiles.yaml
  cat profiles.yaml | openclaw profile apply -f -`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if file == "" {
				return fmt.Errorf("-f FILE is required (use - for stdin)")
			}
			r := os.Stdin
			if file != "-" {
				f, err := os.Open(file)
				if err != nil {
					return err
				}
				defer f.Close()
				r = f
			}
			list, err := profiles.ParseYAML(r)
			if err != nil {
				return fmt.Errorf("%s: %w", file, err)
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			res, err := c.ApplyProfiles(cmd.Context(), api.ApplyProfilesRequest{Profiles: list, DryRun: dry})
			if err != nil {
				return fmt.Errorf("%s: %w (nothing was written)", file, err)
			}
			if g.structured() {
				return g.emit(stdout, res)
			}
			for _, a := range res {
				printWarnings(a.Profile)
				line := fmt.Sprintf("profile %s %s", a.Profile.ID, a.Action)
				if dry && a.Action != "unchanged" {
					line = fmt.Sprintf("profile %s would be %s", a.Profile.ID, a.Action)
				}
				fmt.Fprintln(stdout, line)
			}
			if dry {
				fmt.Fprintln(stdout, "(dry run: nothing written)")
			}
			return nil
		},
	}
	cmd.Flags().StringVarP(&file, "file", "f", "", "YAML file with a top-level profiles: list (- for stdin)")
	cmd.Flags().BoolVar(&dry, "dry-run", false, "validate and print what would change; write nothing")
	addOutput(cmd, g)
	return cmd
}

func newProfileListCmd(g *globals) *cobra.Command {
	return listCmd(g, &cobra.Command{Use: "list", Example: `  openclaw profile list
  openclaw profile list -o yaml`, Short: "List profiles", Args: cobra.NoArgs},
		func(ctx context.Context, c *api.Client, _ []string) ([]providers.Profile, error) {
			return c.Profiles(ctx)
		},
		[]string{"ID", "PROVIDER", "IDLE", "TTL", "MAX", "WARNINGS"}, func(p providers.Profile) []string {
			return []string{p.ID, p.Provider, p.Lifetime.IdleTimeout.String(), p.Lifetime.TTL.String(), strconv.Itoa(p.MaxEnvironments), strconv.Itoa(len(p.Warnings))}
		})
}

func newProfileShowCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:     "show ID",
		Short:   "Show one profile",
		Example: "  openclaw profile show local\n  openclaw profile show local -o yaml",
		Args:    cobra.ExactArgs(1),
		RunE: g.withClient(func(ctx context.Context, c *api.Client, args []string) error {
			p, err := c.Profile(ctx, args[0])
			if err != nil {
				return err
			}
			printWarnings(p)
			return printShow(g, p, func(row func(k, v string)) { profileRows(p, row) })
		}),
	}
	addOutput(cmd, g)
	return cmd
}

// profileRows are the rows of `profile show`.
func profileRows(p providers.Profile, row func(k, v string)) {
	row("id", p.ID)
	row("provider", p.Provider)
	row("idle timeout", p.Lifetime.IdleTimeout.String())
	row("ttl", p.Lifetime.TTL.String())
	row("max environments", strconv.Itoa(p.MaxEnvironments))
	row("sync exclude", strings.Join(p.Sync.Exclude, ", "))
	row("sync include", strings.Join(p.Sync.Include, ", "))
	if p.Sync.MaxDeleteShare > 0 {
		row("max delete share", strconv.FormatFloat(p.Sync.MaxDeleteShare, 'g', -1, 64))
	}
	keys := make([]string, 0, len(p.Hygiene))
	for k := range p.Hygiene {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	hyg := make([]string, 0, len(keys))
	for _, k := range keys {
		hyg = append(hyg, k+"="+p.Hygiene[k])
	}
	row("hygiene", strings.Join(hyg, ", "))
	var settings map[string]any
	_ = json.Unmarshal(p.Settings, &settings)
	keys = keys[:0]
	for k := range settings {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		b, _ := json.Marshal(settings[k])
		row("settings."+k, truncate(string(b), 200))
	}
	row("warnings", strings.Join(p.Warnings, "; "))
}

func newProfileRmCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:     "rm ID",
		Example: `  openclaw profile rm hetzner`,
		Short:   "Delete a profile that has no live environments",
		Args:    cobra.ExactArgs(1),
		RunE: g.withClient(func(ctx context.Context, c *api.Client, args []string) error {
			if err := c.DeleteProfile(ctx, args[0]); err != nil {
				return err
			}
			fmt.Fprintf(stdout, "profile %s deleted\n", args[0])
			return nil
		}),
	}
}

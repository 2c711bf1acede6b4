package main

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/openclaw/cloudworkers/gateway/api"
	"github.com/openclaw/cloudworkers/gateway/workspace"
	"github.com/openclaw/cloudworkers/sync/manifest"
	"github.com/openclaw/cloudworkers/sync/stream"
)

// newSyncCmd is `openclaw sync …`, operator commands for workspace sync.
func newSyncCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:     "sync",
		Example: `  openclaw sync plan --workspace . --git`,
		Short:   "Inspect workspace sync (what would be sent to a box)",
	}
	cmd.AddCommand(newSyncPlanCmd(g))
	return cmd
}

// planOutput is the JSON form of `openclaw sync plan`.
type planOutput struct {
	Workspace   string   `json:"workspace"`
	Mode        string   `json:"mode"`
	Base        string   `json:"baseManifest,omitempty"`
	Environment string   `json:"environment,omitempty"`
	Session     string   `json:"session,omitempty"`
	BoxDir      string   `json:"boxDir,omitempty"`
	Files       int      `json:"files"`
	Dirs        int      `json:"dirs"`
	Symlinks    int      `json:"symlinks"`
	Bytes       int64    `json:"bytes"`
	Send        []string `json:"send"`
	Deletes     []string `json:"deletes"`
	Skipped     []string `json:"skipped,omitempty"`
}

// newSyncPlanCmd is `openclaw sync plan [ENV] --workspace DIR [--box-dir D | --manifest FILE]`.
func newSyncPlanCmd(g *globals) *cobra.Command {
	var (
		wsDir, base, boxDir string
		git                 bool
		exclude, include    []string
	)
	cmd := &cobra.Command{
		Use: "plan [ENV] --workspace DIR [--box-dir D | --manifest FILE]",
		Example: `  openclaw sync plan --workspace . --git
  openclaw sync plan env_123 --workspace . --box-dir /home/worker/src`,
		Short: "Print what a sync of a workspace would send to a box",
		Long: `Builds the workspace's sync manifest (git mode with --git: tracked plus eligible untracked
files; plain mode otherwise, minus --exclude unless --include) and prints what a sync would send,
deletions included. Nothing is sent.

With ENV (an environment id), the gateway lists the environment's box: by default the workspace of
the session the environment serves, in that session's sync mode and with its profile's rules;
--box-dir names another directory on the box. Without ENV, the plan is for a cold box, or, with
--manifest FILE (a manifest as printed by 'openclaw worker manifest'), against that manifest; no
gateway is needed then.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if wsDir == "" {
				return fmt.Errorf("--workspace is required")
			}
			opts := manifest.Options{Mode: manifest.ModePlain, Exclude: exclude, Include: include}
			if git {
				opts.Mode = manifest.ModeGit
			}
			var from *manifest.Manifest
			var tree workspace.BoxTree
			switch {
			case len(args) == 1 && base != "":
				return fmt.Errorf("--manifest and ENV are exclusive: ENV reads the box's own manifest")
			case len(args) == 0 && boxDir != "":
				return fmt.Errorf("--box-dir needs ENV")
			case len(args) == 1 && (len(exclude) > 0 || len(include) > 0):
				return fmt.Errorf("--exclude and --include do not combine with ENV: the box's copy is listed with its profile's sync rules, and so is the workspace")
			case len(args) == 1:
				c, err := g.client()
				if err != nil {
					return err
				}
				var mode manifest.Mode
				if git {
					mode = manifest.ModeGit
				}
				if tree, err = c.BoxManifest(cmd.Context(), args[0], boxDir, mode); err != nil {
					var ae *api.Error
					if errors.As(err, &ae) && ae.Field == "dir" {
						// the API's field is this command's --box-dir
						msg := strings.TrimPrefix(ae.Message, "dir: ")
						msg, _, _ = strings.Cut(msg, ": name a directory on the box")
						return fmt.Errorf("%s: name a directory on the box with --box-dir DIR", msg)
					}
					return err
				}
				if tree.Manifest == nil {
					return fmt.Errorf("environment %s: the gateway returned no manifest", args[0])
				}
				// The box's tree is selected with the session's mode and the profile's rules;
				// the workspace is listed the same way.
				from = tree.Manifest
				opts.Mode = tree.Mode
				opts.Exclude, opts.Include = tree.Exclude, tree.Include
			}
			m, st, err := manifest.Build(cmd.Context(), wsDir, opts)
			if err != nil {
				return err
			}
			if base != "" {
				f, err := os.Open(base)
				if err != nil {
					return err
				}
				from, err = manifest.Decode(f, manifest.TrustedLimits)
				f.Close()
				if err != nil {
					return fmt.Errorf("%s: %w", base, err)
				}
			}
			plan := stream.PlanFor(from, m)
			out := planOutput{Workspace: wsDir, Mode: string(opts.Mode), Base: base, Bytes: plan.Bytes(),
				Environment: tree.Environment, Session: tree.Session, BoxDir: tree.Dir,
				Send: manifest.Paths(plan.Entries), Deletes: plan.Deletes, Skipped: st.Skipped}
			if out.Deletes == nil {
				out.Deletes = []string{}
			}
			for _, e := range plan.Entries {
				switch e.Type {
				case manifest.TypeFile:
					out.Files++
				case manifest.TypeDir:
					out.Dirs++
				case manifest.TypeSymlink:
					out.Symlinks++
				}
			}
			w := cmd.OutOrStdout()
			if g.structured() {
				return g.emit(w, out)
			}
			if out.Environment != "" {
				fmt.Fprintf(w, "to %s:%s", out.Environment, out.BoxDir)
				if out.Session != "" {
					fmt.Fprintf(w, " (session %s)", out.Session)
				}
				fmt.Fprintln(w)
			}
			fmt.Fprintf(w, "%s (%s mode): send %d files (%d bytes), %d dirs, %d symlinks; delete %d\n",
				wsDir, out.Mode, out.Files, out.Bytes, out.Dirs, out.Symlinks, len(out.Deletes))
			tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
			for _, e := range plan.Entries {
				if e.Type != manifest.TypeDir {
					fmt.Fprintf(tw, "send\t%s\t%d\t%s\n", e.Type, e.Size, e.Path)
				}
			}
			for _, d := range plan.Deletes {
				fmt.Fprintf(tw, "delete\t\t\t%s\n", d)
			}
			for _, s := range st.Skipped {
				fmt.Fprintf(tw, "skip\t\t\t%s\n", s)
			}
			return tw.Flush()
		},
	}
	f := cmd.Flags()
	f.StringVar(&wsDir, "workspace", "", "workspace directory")
	f.StringVar(&base, "manifest", "", "manifest of what the box already holds (JSON); default: a cold box")
	f.StringVar(&boxDir, "box-dir", "", "directory on ENV's box (default: the workspace of the session it serves)")
	f.BoolVar(&git, "git", false, "git mode: tracked plus eligible untracked files")
	f.StringArrayVar(&exclude, "exclude", nil, "gitignore-style pattern to leave out (repeatable)")
	f.StringArrayVar(&include, "include", nil, "gitignore-style pattern to keep even if excluded (repeatable)")
	addOutput(cmd, g)
	return cmd
}

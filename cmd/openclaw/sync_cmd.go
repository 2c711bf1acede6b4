package main

import (
	"fmt"
	"os"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/openclaw/cloudworkers/sync/manifest"
	"github.com/openclaw/cloudworkers/sync/stream"
)

// newSyncCmd is `openclaw sync …`, operator commands for workspace sync.
func newSyncCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "sync",
		Short: "Inspect workspace sync (what would be sent to a box)",
	}
	cmd.AddCommand(newSyncPlanCmd(g))
	return cmd
}

// planOutput is the JSON form of `openclaw sync plan`.
type planOutput struct {
	Workspace string   `json:"workspace"`
	Mode      string   `json:"mode"`
	Base      string   `json:"baseManifest,omitempty"`
	Files     int      `json:"files"`
	Dirs      int      `json:"dirs"`
	Symlinks  int      `json:"symlinks"`
	Bytes     int64    `json:"bytes"`
	Send      []string `json:"send"`
	Deletes   []string `json:"deletes"`
	Skipped   []string `json:"skipped,omitempty"`
}

// newSyncPlanCmd is `openclaw sync plan --workspace DIR [--manifest FILE]`.
func newSyncPlanCmd(g *globals) *cobra.Command {
	var (
		workspace, base  string
		git              bool
		exclude, include []string
	)
	cmd := &cobra.Command{
		Use:   "plan --workspace DIR [--manifest FILE]",
		Short: "Print what a sync of a workspace would send (no gateway needed)",
		Long: `Builds the workspace's sync manifest (git mode with --git: tracked plus eligible untracked
files; plain mode otherwise, minus --exclude unless --include) and prints what a sync would send:
everything for a cold box, or, with --manifest FILE (a manifest as printed by
'openclaw worker manifest', for example a warm box's), only the difference, deletions included.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			asJSON, err := g.json()
			if err != nil {
				return err
			}
			if workspace == "" {
				return fmt.Errorf("--workspace is required")
			}
			opts := manifest.Options{Mode: manifest.ModePlain, Exclude: exclude, Include: include}
			if git {
				opts.Mode = manifest.ModeGit
			}
			m, st, err := manifest.Build(cmd.Context(), workspace, opts)
			if err != nil {
				return err
			}
			var from *manifest.Manifest
			if base != "" {
				f, err := os.Open(base)
				if err != nil {
					return err
				}
				from, err = manifest.Decode(f, manifest.Limits{})
				f.Close()
				if err != nil {
					return fmt.Errorf("%s: %w", base, err)
				}
			}
			plan := stream.PlanFor(from, m)
			out := planOutput{Workspace: workspace, Mode: string(opts.Mode), Base: base, Bytes: plan.Bytes(),
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
			if asJSON {
				return printJSON(w, out)
			}
			fmt.Fprintf(w, "%s (%s mode): send %d files (%d bytes), %d dirs, %d symlinks; delete %d\n",
				workspace, out.Mode, out.Files, out.Bytes, out.Dirs, out.Symlinks, len(out.Deletes))
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
	f.StringVar(&workspace, "workspace", "", "workspace directory")
	f.StringVar(&base, "manifest", "", "manifest of what the box already holds (JSON); default: a cold box")
	f.BoolVar(&git, "git", false, "git mode: tracked plus eligible untracked files")
	f.StringArrayVar(&exclude, "exclude", nil, "gitignore-style pattern to leave out (repeatable)")
	f.StringArrayVar(&include, "include", nil, "gitignore-style pattern to keep even if excluded (repeatable)")
	addOutput(cmd, g)
	return cmd
}

package main

import (
	"bytes"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/openclaw/cloudworkers/internal/version"
)

func newVersionCmd(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:     "version",
		Short:   "Print version, git commit and the sha256 of this executable",
		Example: "  openclaw version\n  openclaw version -o json\n  openclaw --version",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			info, err := version.Get()
			if err != nil {
				return fmt.Errorf("hash own executable: %w", err)
			}
			if asJSON {
				g.output = "json"
			}
			return printShow(g, info, func(row func(k, v string)) { versionRows(info, row) })
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON (same as -o json)")
	_ = cmd.Flags().MarkHidden("json")
	addOutput(cmd, g)
	return cmd
}

func versionRows(info version.Info, row func(k, v string)) {
	row("openclaw", info.Version)
	row("commit", info.Commit)
	row("go", info.GoVersion+" "+info.Platform)
	row("sha256", info.SHA256)
	row("path", info.Executable)
}

// versionText is what `openclaw --version` prints: the table of `openclaw version`.
func versionText() string {
	info, err := version.Get()
	if err != nil {
		return fmt.Sprintf("openclaw: hash own executable: %v\n", err)
	}
	var b bytes.Buffer
	w := table(&b)
	versionRows(info, func(k, v string) { fmt.Fprintf(w, "%s\t%s\n", k, dash(v)) })
	_ = w.Flush()
	return b.String()
}

package main

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/openclaw/cloudworkers/internal/version"
)

func newVersionCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print version, git commit and the sha256 of this executable",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			info, err := version.Get()
			if err != nil {
				return fmt.Errorf("hash own executable: %w", err)
			}
			if asJSON {
				enc := json.NewEncoder(os.Stdout)
				enc.SetIndent("", "  ")
				return enc.Encode(info)
			}
			fmt.Printf("openclaw %s\ncommit   %s\ngo       %s %s\nsha256   %s\npath     %s\n",
				info.Version, info.Commit, info.GoVersion, info.Platform, info.SHA256, info.Executable)
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

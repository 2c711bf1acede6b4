package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/openclaw/cloudworkers/gateway"
)

// tokenCmd is `openclaw <service> token [--rotate]`: it prints a bearer token kept in the data
// dir, which ensure makes when it is missing and replaces when rotate is set.
func tokenCmd(g *globals, service, short, long, rotateHelp string, ensure func(dir string, rotate bool) (string, error)) *cobra.Command {
	var rotate bool
	cmd := &cobra.Command{
		Use:     "token [--rotate]",
		Example: fmt.Sprintf("  openclaw %s token\n  openclaw %[1]s token --rotate", service),
		Short:   short,
		Long:    long,
		Args:    cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			tok, err := ensure(g.dataDirOrDefault(), rotate)
			if err != nil {
				return err
			}
			_, err = fmt.Fprintln(stdout, tok)
			return err
		},
	}
	cmd.Flags().BoolVar(&rotate, "rotate", false, rotateHelp)
	return cmd
}

// dataDirOrDefault is --data-dir (or the context's), else the default data dir.
func (g *globals) dataDirOrDefault() string {
	if g.dataDir != "" {
		return g.dataDir
	}
	return gateway.DefaultDataDir()
}

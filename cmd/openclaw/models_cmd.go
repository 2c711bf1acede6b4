package main

import (
	"context"
	"fmt"
	"strconv"

	"github.com/spf13/cobra"

	"github.com/openclaw/cloudworkers/gateway/api"
	"github.com/openclaw/cloudworkers/gateway/inference"
)

func newModelsCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:     "models",
		Example: `  openclaw models list`,
		Aliases: []string{"model"},
		Short:   "Show the gateway's model catalog (models: in the gateway config)",
	}
	list := &cobra.Command{
		Use: "list",
		Example: `  openclaw models list
  openclaw models list -o json`,
		Short: "List the approved models (provider/model refs)",
		Args:  cobra.NoArgs,
		RunE: g.withClient(func(ctx context.Context, c *api.Client, _ []string) error {
			res, err := c.Models(ctx)
			if err != nil {
				return err
			}
			if g.structured() {
				return g.emit(stdout, res)
			}
			return printList(g, res.Models, []string{"MODEL", "API", "CONTEXT", "MAX OUT", "$ IN/OUT PER MTOK", "CREDENTIAL"}, func(m inference.Model) []string {
				ref := m.Ref
				if m.Default {
					ref += " (default)"
				}
				price := "-"
				if m.Cost.Input > 0 || m.Cost.Output > 0 {
					price = fmt.Sprintf("%g / %g", m.Cost.Input, m.Cost.Output)
				}
				return []string{ref, string(m.API), tokens(m.ContextWindow), tokens(m.MaxTokens), price, dash(m.Credential)}
			})
		}),
	}
	addOutput(list, g)
	cmd.AddCommand(list)
	return cmd
}

func tokens(n int) string {
	switch {
	case n <= 0:
		return "-"
	case n >= 1000 && n%1000 == 0:
		return strconv.Itoa(n/1000) + "k"
	}
	return strconv.Itoa(n)
}

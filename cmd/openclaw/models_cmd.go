package main

import (
	"fmt"
	"net/http"
	"strconv"

	"github.com/spf13/cobra"

	"github.com/openclaw/cloudworkers/gateway/inference"
)

func newModelsCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:     "models",
		Aliases: []string{"model"},
		Short:   "Show the gateway's model catalog (models: in the gateway config)",
	}
	list := &cobra.Command{
		Use:   "list",
		Short: "List the approved models (provider/model refs)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			asJSON, err := g.json()
			if err != nil {
				return err
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			var res inference.ModelsResponse
			if _, err := c.Do(cmd.Context(), http.MethodGet, "/api/v1/models", nil, &res); err != nil {
				return err
			}
			if asJSON {
				return printJSON(stdout, res)
			}
			w := table(stdout)
			fmt.Fprintln(w, "MODEL\tAPI\tCONTEXT\tMAX OUT\t$ IN/OUT PER MTOK\tCREDENTIAL")
			for _, m := range res.Models {
				ref := m.Ref
				if m.Default {
					ref += " (default)"
				}
				price := "-"
				if m.Cost.Input > 0 || m.Cost.Output > 0 {
					price = fmt.Sprintf("%g / %g", m.Cost.Input, m.Cost.Output)
				}
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\n", ref, m.API, tokens(m.ContextWindow), tokens(m.MaxTokens), price, dash(m.Credential))
			}
			return w.Flush()
		},
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

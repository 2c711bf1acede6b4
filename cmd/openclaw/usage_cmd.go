package main

import (
	"context"
	"encoding/csv"
	"fmt"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"github.com/openclaw/cloudworkers/gateway/api"
	"github.com/openclaw/cloudworkers/gateway/spend"
)

func newUsageCmd(g *globals) *cobra.Command {
	var by, since, format string
	cmd := &cobra.Command{
		Use: "usage [--by day|session|profile|agent|model|kind] [--since WHEN]",
		Example: `  openclaw usage
  openclaw usage --by session --since 7d
  openclaw usage --by model --since 2026-12-01 -o csv > december.csv
  openclaw usage --by profile -o json | jq '.[] | {key, usd}'`,
		Short: "What machines and model calls cost, from the spend ledger",
		Long: `Report the spend ledger: every model call (from its usage, at the catalog's prices) and every
stretch of a machine's leased time (at its profile's price), grouped by day (in the gateway's
spend.timeZone), session, profile, agent, model or kind. --since takes a date (midnight in that zone),
an RFC 3339 time or a duration back from now (24h, 7d). -o csv writes one row per group with a header,
for a spreadsheet; -o json and -o yaml the same rows as objects.`,
		Args: cobra.NoArgs,
		PreRunE: func(*cobra.Command, []string) error {
			switch format {
			case "table", "json", "yaml", "csv":
				return nil
			}
			return fmt.Errorf("--output must be table, json, yaml or csv, got %q", format)
		},
		RunE: g.withClient(func(ctx context.Context, c *api.Client, _ []string) error {
			rows, err := c.Usage(ctx, by, since)
			if err != nil {
				return err
			}
			switch format {
			case "json", "yaml":
				g.output = format
				return g.emit(stdout, rows)
			case "csv":
				return writeUsageCSV(rows, by)
			}
			w := table(stdout)
			fmt.Fprintln(w, headerFor(by)+"\tUSD\tMODELS\tMACHINES\tCALLS\tTOKENS IN\tTOKENS OUT\tCACHE READ\tMACHINE TIME")
			var total float64
			for _, r := range rows {
				total += r.USD
				fmt.Fprintf(w, "%s\t%.4f\t%.4f\t%.4f\t%d\t%d\t%d\t%d\t%s\n", dash(r.Key), r.USD, r.ModelUSD, r.MachineUSD, r.Calls,
					r.InputTokens, r.OutputTokens, r.CacheReadTokens, (time.Duration(r.MachineSeconds) * time.Second).Round(time.Second))
			}
			fmt.Fprintf(w, "TOTAL\t%.4f\t\t\t\t\t\t\t\n", total)
			return w.Flush()
		}),
	}
	cmd.Flags().StringVar(&by, "by", "day", "group by day, session, profile, agent, model or kind")
	cmd.Flags().StringVar(&since, "since", "", "from a date (2026-12-01), an RFC 3339 time or a duration back (24h, 7d)")
	cmd.Flags().StringVarP(&format, "output", "o", "table", "output format: table, json, yaml or csv")
	return cmd
}

func headerFor(by string) string {
	switch by {
	case "day":
		return "DAY"
	case "kind":
		return "KIND"
	}
	return "BY " + by
}

func writeUsageCSV(rows []spend.UsageRow, by string) error {
	w := csv.NewWriter(stdout)
	_ = w.Write([]string{by, "usd", "model_usd", "machine_usd", "calls", "input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens", "machine_seconds"})
	f := func(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }
	for _, r := range rows {
		_ = w.Write([]string{r.Key, f(r.USD), f(r.ModelUSD), f(r.MachineUSD), strconv.Itoa(r.Calls), strconv.FormatInt(r.InputTokens, 10),
			strconv.FormatInt(r.OutputTokens, 10), strconv.FormatInt(r.CacheReadTokens, 10), strconv.FormatInt(r.CacheWriteTokens, 10), f(r.MachineSeconds)})
	}
	w.Flush()
	return w.Error()
}

func newBudgetCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "budget", Short: "Spend budgets of machines and model calls",
		Example: `  openclaw budget list
  openclaw budget list -o json | jq '.[] | select(.exceeded)'`,
		Long: `Budgets are set in the gateway's config (budgets:) and per session at its creation (session new
--budget); see docs/operations.md, "Spend and budgets".`}
	list := listCmd(g, &cobra.Command{Use: "list", Example: `  openclaw budget list
  openclaw budget list -o json`, Short: "Each configured budget: its window, spend, limit and when it resets", Args: cobra.NoArgs},
		func(ctx context.Context, c *api.Client, _ []string) ([]spend.Status, error) { return c.Budgets(ctx) },
		[]string{"BUDGET", "SCOPE", "WINDOW", "SPENT", "LIMIT", "LEFT", "RESETS", "STATE"},
		func(s spend.Status) []string {
			scope := s.Scope
			switch {
			case s.Profile != "":
				scope += " " + s.Profile
			case s.Agent != "":
				scope += " " + s.Agent
			}
			state := "ok"
			switch {
			case s.Exceeded:
				state = "exceeded: new turns, model calls and leases are refused"
			case s.Warning:
				state = fmt.Sprintf("warning: past %.0f%%", s.WarnAt*100)
			}
			reset := "-"
			if !s.ResetAt.IsZero() {
				reset = s.ResetAt.Format(time.RFC3339)
			}
			return []string{s.ID, scope, s.Window, fmt.Sprintf("$%.4f", s.SpentUSD), fmt.Sprintf("$%.2f", s.LimitUSD), fmt.Sprintf("$%.4f", s.RemainingUSD), reset, state}
		})
	cmd.AddCommand(list)
	return cmd
}

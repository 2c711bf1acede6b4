package main

import (
	"context"
	"encoding/csv"
	"fmt"
	"strconv"
	"strings"
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
		Long: `Budgets are set in the gateway's config (budgets:), at run time (budget set, kept in the gateway's
database) and per session at its creation (session new --budget); see docs/operations.md, "Spend and
budgets".`}
	list := listCmd(g, &cobra.Command{Use: "list", Example: `  openclaw budget list
  openclaw budget list -o json`, Short: "Each configured budget: its window, spend, limit and when it resets", Args: cobra.NoArgs},
		func(ctx context.Context, c *api.Client, _ []string) ([]spend.Status, error) { return c.Budgets(ctx) },
		[]string{"BUDGET", "SCOPE", "WINDOW", "SPENT", "LIMIT", "LEFT", "RESETS", "STATE", "SET IN"},
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
			return []string{s.ID, scope, s.Window, fmt.Sprintf("$%.4f", s.SpentUSD), fmt.Sprintf("$%.2f", s.LimitUSD), fmt.Sprintf("$%.4f", s.RemainingUSD), reset, state, s.Source}
		})
	cmd.AddCommand(list, newBudgetSetCmd(g), newBudgetRmCmd(g))
	return cmd
}

func newBudgetSetCmd(g *globals) *cobra.Command {
	var b spend.Budget
	var scope string
	cmd := &cobra.Command{
		Use: "set ID --limit USD [--scope gateway|profile:P|agent:A] [--window day|month|total]",
		Example: `  openclaw budget set daily --limit 50
  openclaw budget set hetzner-month --scope profile:hetzner --window month --limit 300 --on-exceeded stop
  openclaw budget set reviewer --scope agent:reviewer --window total --limit 20 --warn-at 0.9`,
		Short: "Set a budget at run time (kept in the gateway's database; config budgets are changed in the config)",
		Args:  cobra.ExactArgs(1),
		RunE: g.withClient(func(ctx context.Context, c *api.Client, args []string) error {
			b.ID = args[0]
			switch kind, name, _ := strings.Cut(scope, ":"); kind {
			case spend.ScopeGateway:
				b.Scope = kind
			case spend.ScopeProfile:
				b.Scope, b.Profile = kind, name
			case spend.ScopeAgent:
				b.Scope, b.Agent = kind, name
			default:
				return fmt.Errorf("--scope %q: want gateway, profile:PROFILE or agent:AGENT", scope)
			}
			st, err := c.SetBudget(ctx, b)
			if err != nil {
				return err
			}
			if g.structured() {
				return g.emit(stdout, st)
			}
			fmt.Fprintf(stdout, "budget %s: $%.4f of $%.2f spent in its window\n", st.ID, st.SpentUSD, st.LimitUSD)
			return nil
		}),
	}
	cmd.Flags().StringVar(&scope, "scope", "gateway", "what it counts: gateway, profile:PROFILE or agent:AGENT")
	cmd.Flags().StringVar(&b.Window, "window", "day", "day, month (in the gateway's spend.timeZone) or total")
	cmd.Flags().Float64Var(&b.LimitUSD, "limit", 0, "the limit in US dollars")
	cmd.Flags().Float64Var(&b.WarnAt, "warn-at", 0, "the share of the limit from which it warns (default 0.8)")
	cmd.Flags().StringVar(&b.OnExceeded, "on-exceeded", "", "refuse (the default) or stop (also bring idle machines' work home and release them)")
	addOutput(cmd, g)
	return cmd
}

func newBudgetRmCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:     "rm ID",
		Example: `  openclaw budget rm daily`,
		Short:   "Remove a budget set at run time",
		Args:    cobra.ExactArgs(1),
		RunE: g.withClient(func(ctx context.Context, c *api.Client, args []string) error {
			if err := c.RemoveBudget(ctx, args[0]); err != nil {
				return err
			}
			fmt.Fprintf(stdout, "budget %s removed\n", args[0])
			return nil
		}),
	}
}

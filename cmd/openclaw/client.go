package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/openclaw/cloudworkers/cmd/openclaw/internal/console"
	"github.com/openclaw/cloudworkers/gateway"
	"github.com/openclaw/cloudworkers/gateway/api"
)

// client builds an API client from the global flags (and the context they did not override).
func (g *globals) client() (*api.Client, error) {
	url, err := normalizeGateway(g.gateway)
	if err != nil {
		return nil, err
	}
	if url == "" {
		url = "http://" + gateway.DefaultListen
	}
	tok := g.token
	switch {
	case tok != "":
	case g.tokenFile != "":
		b, err := os.ReadFile(g.tokenFile)
		if err != nil {
			return nil, fmt.Errorf("read API token of the context: %w", err)
		}
		if tok = strings.TrimSpace(string(b)); tok == "" {
			return nil, fmt.Errorf("token file %s is empty", g.tokenFile)
		}
	default:
		if tok, err = gateway.ReadToken(g.dataDirOrDefault()); err != nil {
			return nil, err
		}
	}
	return api.NewClient(url, tok), nil
}

// withClient is a command's RunE that builds the API client from the global flags and calls run
// with it and the command's context.
func (g *globals) withClient(run func(ctx context.Context, c *api.Client, args []string) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		c, err := g.client()
		if err != nil {
			return err
		}
		return run(cmd.Context(), c, args)
	}
}

// listCmd makes cmd (with -o/--output) print what fetch returns through printList.
func listCmd[T any](g *globals, cmd *cobra.Command, fetch func(ctx context.Context, c *api.Client, args []string) ([]T, error),
	header []string, row func(T) []string) *cobra.Command {
	cmd.RunE = g.withClient(func(ctx context.Context, c *api.Client, args []string) error {
		items, err := fetch(ctx, c, args)
		if err != nil {
			return err
		}
		return printList(g, items, header, row)
	})
	addOutput(cmd, g)
	return cmd
}

// addOutput adds -o/--output (table, json or yaml) to a command; a bad value is refused before
// the command runs, naming the flag.
func addOutput(cmd *cobra.Command, g *globals) {
	cmd.Flags().StringVarP(&g.output, "output", "o", "table", "output format: table, json or yaml")
	_ = cmd.RegisterFlagCompletionFunc("output", cobra.FixedCompletions([]string{"table", "json", "yaml"}, cobra.ShellCompDirectiveNoFileComp))
	prev := cmd.PreRunE
	cmd.PreRunE = func(cmd *cobra.Command, args []string) error {
		if err := g.checkOutput(); err != nil {
			return err
		}
		if prev != nil {
			return prev(cmd, args)
		}
		return nil
	}
}

func (g *globals) checkOutput() error {
	switch g.output {
	case "json", "yaml", "table", "":
		return nil
	}
	return fmt.Errorf("--output must be table, json or yaml, got %q", g.output)
}

// structured reports whether -o json or -o yaml was given (addOutput has checked the value).
func (g *globals) structured() bool { return g.output == "json" || g.output == "yaml" }

// asJSON reports whether -o json was given.
func (g *globals) asJSON() bool { return g.output == "json" }

// emit writes v in the structured format of -o: YAML with -o yaml, else indented JSON. YAML
// carries the JSON field names (v goes through its JSON form).
func (g *globals) emit(w io.Writer, v any) error {
	if g.output == "yaml" {
		return console.WriteYAML(w, v)
	}
	return printJSON(w, v)
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// printList prints items as JSON or YAML with -o json|yaml, else as a table: the header, then one row of
// columns per item.
func printList[T any](g *globals, items []T, header []string, row func(T) []string) error {
	if g.structured() {
		return g.emit(stdout, items)
	}
	w := table(stdout)
	fmt.Fprintln(w, strings.Join(header, "\t"))
	for _, it := range items {
		fmt.Fprintln(w, strings.Join(row(it), "\t"))
	}
	return w.Flush()
}

// printShow prints v as JSON or YAML with -o json|yaml, else as the key/value table that fields writes with
// row (a blank value shows as "-").
func printShow(g *globals, v any, fields func(row func(k, v string))) error {
	if g.structured() {
		return g.emit(stdout, v)
	}
	w := table(stdout)
	fields(func(k, v string) { fmt.Fprintf(w, "%s\t%s\n", k, dash(v)) })
	return w.Flush()
}

// printResult prints v as JSON or YAML with -o json|yaml, else the line.
func printResult(g *globals, v any, line string) error {
	if g.structured() {
		return g.emit(stdout, v)
	}
	_, err := fmt.Fprintln(stdout, line)
	return err
}

func table(w io.Writer) *tabwriter.Writer { return tabwriter.NewWriter(w, 0, 4, 2, ' ', 0) }

func humanMs(ms int64) string {
	d := time.Duration(ms) * time.Millisecond
	switch {
	case d < time.Minute:
		return d.Round(time.Second).String()
	case d < time.Hour:
		return d.Round(time.Second).String()
	case d < 48*time.Hour:
		return d.Round(time.Minute).String()
	}
	return fmt.Sprintf("%dd", int(d.Hours()/24))
}

var (
	dash     = console.Dash
	truncate = console.Truncate
)

var stdout io.Writer = os.Stdout
var stderr io.Writer = os.Stderr

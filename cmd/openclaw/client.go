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

	"github.com/openclaw/cloudworkers/gateway"
	"github.com/openclaw/cloudworkers/gateway/api"
	"github.com/openclaw/cloudworkers/internal/console"
)

// client builds an API client from the global flags.
func (g *globals) client() (*api.Client, error) {
	url := g.gateway
	if url == "" {
		url = "http://" + gateway.DefaultListen
	}
	tok := g.token
	if tok == "" {
		dir := g.dataDir
		if dir == "" {
			dir = gateway.DefaultDataDir()
		}
		var err error
		if tok, err = gateway.ReadToken(dir); err != nil {
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

// addOutput adds -o/--output to a command; a bad value is refused before the command runs.
func addOutput(cmd *cobra.Command, g *globals) {
	cmd.Flags().StringVarP(&g.output, "output", "o", "table", "output format: table or json")
	cmd.PreRunE = func(*cobra.Command, []string) error {
		_, err := g.json()
		return err
	}
}

func (g *globals) json() (bool, error) {
	switch g.output {
	case "json":
		return true, nil
	case "table", "":
		return false, nil
	}
	return false, fmt.Errorf("--output must be table or json, got %q", g.output)
}

// asJSON reports whether -o json was given (addOutput has checked the value).
func (g *globals) asJSON() bool { return g.output == "json" }

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// printList prints items as JSON with -o json, else as a table: the header, then one row of
// columns per item.
func printList[T any](g *globals, items []T, header []string, row func(T) []string) error {
	if g.asJSON() {
		return printJSON(stdout, items)
	}
	w := table(stdout)
	fmt.Fprintln(w, strings.Join(header, "\t"))
	for _, it := range items {
		fmt.Fprintln(w, strings.Join(row(it), "\t"))
	}
	return w.Flush()
}

// printShow prints v as JSON with -o json, else as the key/value table that fields writes with
// row (a blank value shows as "-").
func printShow(g *globals, v any, fields func(row func(k, v string))) error {
	if g.asJSON() {
		return printJSON(stdout, v)
	}
	w := table(stdout)
	fields(func(k, v string) { fmt.Fprintf(w, "%s\t%s\n", k, dash(v)) })
	return w.Flush()
}

// printResult prints v as JSON with -o json, else the line.
func printResult(g *globals, v any, line string) error {
	if g.asJSON() {
		return printJSON(stdout, v)
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

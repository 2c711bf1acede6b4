package main

import (
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

// addOutput adds -o/--output to a command.
func addOutput(cmd *cobra.Command, g *globals) {
	cmd.Flags().StringVarP(&g.output, "output", "o", "table", "output format: table or json")
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

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
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

func dash(s string) string {
	if strings.TrimSpace(s) == "" {
		return "-"
	}
	return s
}

var stdout io.Writer = os.Stdout
var stderr io.Writer = os.Stderr

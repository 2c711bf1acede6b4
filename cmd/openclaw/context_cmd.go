package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/spf13/cobra"
	"go.yaml.in/yaml/v3"

	"github.com/openclaw/cloudworkers/gateway"
	"github.com/openclaw/cloudworkers/internal/atomicfile"
)

// cliConfig is $XDG_CONFIG_HOME/openclaw/config.yaml: named gateway contexts and the current one.
type cliConfig struct {
	Current  string                 `yaml:"current,omitempty" json:"current,omitempty"`
	Contexts map[string]*cliContext `yaml:"contexts,omitempty" json:"contexts,omitempty"`
}

// cliContext is one gateway the CLI can talk to: its URL and where its token is (a data dir's
// gateway.token, or a token file).
type cliContext struct {
	Gateway   string `yaml:"gateway,omitempty" json:"gateway,omitempty"`
	DataDir   string `yaml:"dataDir,omitempty" json:"dataDir,omitempty"`
	TokenFile string `yaml:"tokenFile,omitempty" json:"tokenFile,omitempty"`
}

// configPath is $XDG_CONFIG_HOME/openclaw/config.yaml (default ~/.config/openclaw/config.yaml).
func configPath() (string, error) {
	dir := os.Getenv("XDG_CONFIG_HOME")
	if dir == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return "", fmt.Errorf("no $XDG_CONFIG_HOME and no home directory: %w", err)
		}
		dir = filepath.Join(home, ".config")
	}
	return filepath.Join(dir, "openclaw", "config.yaml"), nil
}

// loadConfig reads the CLI config; a missing file is an empty config. YAML errors name the file
// and the line.
func loadConfig() (*cliConfig, string, error) {
	path, err := configPath()
	if err != nil {
		return nil, "", err
	}
	c := &cliConfig{}
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return c, path, nil
	}
	if err != nil {
		return nil, path, err
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(c); err != nil && !errors.Is(err, io.EOF) {
		return nil, path, fmt.Errorf("%s: %w", path, err)
	}
	return c, path, nil
}

// save writes the config temp-then-rename, mode 0600 (it names where tokens are).
func (c *cliConfig) save(path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	b, err := yaml.Marshal(c)
	if err != nil {
		return err
	}
	return atomicfile.Write(path, b, 0o600)
}

// normalizeGateway accepts host:port or a URL, and drops a trailing /api/v1 (the API root) and
// slashes: the CLI adds the API path itself.
func normalizeGateway(raw string) (string, error) {
	s := strings.TrimSpace(raw)
	if s == "" {
		return "", nil
	}
	if !strings.Contains(s, "://") {
		s = "http://" + s
	}
	u, err := url.Parse(s)
	if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return "", fmt.Errorf("--gateway %q is not an http(s) URL or host:port", raw)
	}
	if u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return "", fmt.Errorf("--gateway %q: a gateway URL has no query, fragment or user info", raw)
	}
	p := strings.TrimRight(u.Path, "/")
	p = strings.TrimSuffix(p, "/api/v1")
	u.Path = strings.TrimRight(p, "/")
	return u.String(), nil
}

// applyContext fills the gateway, data dir and token file from the selected context (--context,
// else $OPENCLAW_CONTEXT, else the config's current one) where flags and environment gave none.
func (g *globals) applyContext() error {
	name := g.context
	if name == "" && g.gateway != "" {
		return nil // an explicit gateway needs no context
	}
	cfg, path, err := loadConfig()
	if err != nil {
		return err
	}
	if name == "" {
		name = cfg.Current
	}
	if name == "" {
		return nil
	}
	ctx, ok := cfg.Contexts[name]
	if !ok {
		return fmt.Errorf("context %q is not in %s (see openclaw context list)", name, path)
	}
	if g.gateway == "" {
		g.gateway = ctx.Gateway
	}
	if g.dataDir == "" && g.token == "" {
		g.dataDir = ctx.DataDir
		g.tokenFile = ctx.TokenFile
	}
	return nil
}

func newContextCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:     "context",
		Aliases: []string{"contexts"},
		Short:   "Name gateways (URL and token) and choose the one CLI commands talk to",
		Long: `A context names a gateway: its URL and where its API token is (the gateway's data dir, or a
token file). Contexts are stored in $XDG_CONFIG_HOME/openclaw/config.yaml (mode 0600). CLI commands
use the current context unless --gateway, --data-dir or --token (or their environment variables)
say otherwise; --context NAME (or OPENCLAW_CONTEXT) picks another for one command.`,
		Example: `  openclaw context add lab --gateway http://10.0.0.5:7420 --token-file ~/.lab-token
  openclaw context use lab
  openclaw context list`,
	}
	cmd.AddCommand(newContextAddCmd(), newContextUseCmd(), newContextListCmd(g), newContextRmCmd())
	return cmd
}

func newContextAddCmd() *cobra.Command {
	var c cliContext
	var use bool
	cmd := &cobra.Command{
		Use:   "add NAME --gateway URL (--data-dir DIR | --token-file F)",
		Short: "Add (or replace) a context",
		Example: `  openclaw context add local --gateway 127.0.0.1:7421 --data-dir /srv/openclaw
  openclaw context add lab --gateway https://gw.lab.example/api/v1 --token-file ~/.lab-token --use`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			name := args[0]
			if !contextName(name) {
				return fmt.Errorf("context name %q must be letters, digits, '.', '_' or '-'", name)
			}
			// the persistent flags of the root are this command's own options here
			f := cmd.Flags()
			c.Gateway, _ = f.GetString("gateway")
			c.DataDir, _ = f.GetString("data-dir")
			var err error
			if c.Gateway, err = normalizeGateway(c.Gateway); err != nil {
				return err
			}
			if c.Gateway == "" {
				return errors.New("--gateway URL is required")
			}
			switch {
			case c.DataDir != "" && c.TokenFile != "":
				return errors.New("--data-dir and --token-file are exclusive: the token is read from one of them")
			case c.DataDir == "" && c.TokenFile == "":
				return errors.New("say where the token is: --data-dir DIR (its gateway.token) or --token-file F")
			}
			for _, p := range []*string{&c.DataDir, &c.TokenFile} {
				if *p != "" {
					if *p, err = filepath.Abs(*p); err != nil {
						return err
					}
				}
			}
			current := false
			err = editConfig(func(cfg *cliConfig) error {
				if cfg.Contexts == nil {
					cfg.Contexts = map[string]*cliContext{}
				}
				cfg.Contexts[name] = &c
				if use || cfg.Current == "" {
					cfg.Current = name
				}
				current = cfg.Current == name
				return nil
			})
			if err != nil {
				return err
			}
			fmt.Fprintf(stdout, "context %s: %s", name, c.Gateway)
			if current {
				fmt.Fprint(stdout, " (current)")
			}
			fmt.Fprintln(stdout)
			return nil
		},
	}
	cmd.Flags().StringVar(&c.TokenFile, "token-file", "", "file holding the gateway's API token")
	cmd.Flags().BoolVar(&use, "use", false, "make it the current context")
	return cmd
}

func contextName(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-') {
			return false
		}
	}
	return true
}

func completeContexts(_ *cobra.Command, args []string, _ string) ([]string, cobra.ShellCompDirective) {
	cfg, _, err := loadConfig()
	if err != nil || len(args) > 0 {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	var out []string
	for n, c := range cfg.Contexts {
		out = append(out, n+"\t"+c.Gateway)
	}
	sort.Strings(out)
	return out, cobra.ShellCompDirectiveNoFileComp
}

func newContextUseCmd() *cobra.Command {
	return contextNameCmd("use", "Make a context the current one", func(cfg *cliConfig, name string) (string, error) {
		c, ok := cfg.Contexts[name]
		if !ok {
			return "", fmt.Errorf("no context %q (add it with openclaw context add %s --gateway URL --data-dir DIR)", name, name)
		}
		cfg.Current = name
		return fmt.Sprintf("current context %s: %s", name, c.Gateway), nil
	})
}

func newContextRmCmd() *cobra.Command {
	return contextNameCmd("rm", "Forget a context", func(cfg *cliConfig, name string) (string, error) {
		if _, ok := cfg.Contexts[name]; !ok {
			return "", fmt.Errorf("no context %q", name)
		}
		delete(cfg.Contexts, name)
		if cfg.Current == name {
			cfg.Current = ""
		}
		return fmt.Sprintf("context %s removed", name), nil
	})
}

// contextNameCmd is `context VERB NAME` of an existing context: edit changes the config (an
// error leaves its file as it was) and says what it did.
func contextNameCmd(verb, short string, edit func(cfg *cliConfig, name string) (done string, err error)) *cobra.Command {
	return &cobra.Command{
		Use:               verb + " NAME",
		Short:             short,
		Example:           "  openclaw context " + verb + " lab",
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: completeContexts,
		RunE: func(cmd *cobra.Command, args []string) error {
			var done string
			err := editConfig(func(cfg *cliConfig) (err error) {
				done, err = edit(cfg, args[0])
				return err
			})
			if err != nil {
				return err
			}
			fmt.Fprintln(stdout, done)
			return nil
		},
	}
}

// editConfig loads the CLI's config file, lets edit change it and saves it; an error of edit
// leaves the file as it was.
func editConfig(edit func(cfg *cliConfig) error) error {
	cfg, path, err := loadConfig()
	if err != nil {
		return err
	}
	if err := edit(cfg); err != nil {
		return err
	}
	return cfg.save(path)
}

// contextRow is one line of `context list`.
type contextRow struct {
	Name    string `json:"name"`
	Current bool   `json:"current"`
	cliContext
}

func newContextListCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:     "list",
		Short:   "List contexts; * marks the current one",
		Example: "  openclaw context list\n  openclaw context list -o yaml",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, _, err := loadConfig()
			if err != nil {
				return err
			}
			rows := []contextRow{}
			for n, c := range cfg.Contexts {
				rows = append(rows, contextRow{Name: n, Current: n == cfg.Current, cliContext: *c})
			}
			sort.Slice(rows, func(i, j int) bool { return rows[i].Name < rows[j].Name })
			return printList(g, rows, []string{"", "NAME", "GATEWAY", "TOKEN FROM"}, func(r contextRow) []string {
				mark, from := "", r.TokenFile
				if r.Current {
					mark = "*"
				}
				if r.DataDir != "" {
					from = filepath.Join(r.DataDir, gateway.TokenFile)
				}
				return []string{mark, r.Name, r.Gateway, from}
			})
		},
	}
	addOutput(cmd, g)
	return cmd
}

package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/openclaw/cloudworkers/gateway/api"
	"github.com/openclaw/cloudworkers/gateway/credentials"
	"github.com/openclaw/cloudworkers/gateway/inference"
	"github.com/openclaw/cloudworkers/gateway/publish"
)

// stdin is where `credential set` reads the value; tests replace it.
var stdin io.Reader = os.Stdin

func newCredentialCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use: "credential",
		Example: `  printf %s "$ANTHROPIC_API_KEY" | openclaw credential set anthropic
  openclaw credential list`,
		Aliases: []string{"credentials"},
		Short:   "Store provider credentials (API keys) on the gateway, encrypted at rest",
		Long: `Provider credentials are stored by the gateway, encrypted with a key in <data-dir>/credentials.key.
They are write-only: no command or API returns a value. A provider in the model catalog names its
credential with "credential: NAME".`,
	}
	cmd.AddCommand(newCredentialSetCmd(g), newCredentialListCmd(g), newCredentialRmCmd(g))
	return cmd
}

func newCredentialSetCmd(g *globals) *cobra.Command {
	var fromEnv, gitUser, knownHost, hostKey string
	var gitToken, gitSSHKey bool
	cmd := &cobra.Command{
		Use:   "set NAME [--from-env VAR]",
		Short: "Set a credential from stdin or an environment variable",
		Example: `  printf %s "$ANTHROPIC_API_KEY" | openclaw credential set anthropic
  openclaw credential set openai --from-env OPENAI_API_KEY
  openclaw credential set forge --git-token --from-env GITHUB_TOKEN
  openclaw credential set forge-ssh --git-ssh-key --known-host "$(ssh-keyscan -t ed25519 git.example.com)" < ~/.ssh/openclaw_forge
  openclaw credential set forge-ssh --git-ssh-key --host-key SHA256:+DiY3wvvV6TuJJhbpZisF/zLDA0zPMSvHdkr4UvCOqU < key`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			name := args[0]
			if !credentials.ValidName(name) {
				return fmt.Errorf("credential name %q must be letters, digits, '.', '_' or '-'", name)
			}
			var value string
			if fromEnv != "" {
				v, ok := os.LookupEnv(fromEnv)
				if !ok || v == "" {
					return fmt.Errorf("environment variable %s is not set", fromEnv)
				}
				value = v
			} else {
				if f, ok := stdin.(*os.File); ok && isTerminal(f) {
					fmt.Fprintf(stderr, "paste the value of %s, then press Enter and Ctrl-D:\n", name)
				}
				b, err := io.ReadAll(io.LimitReader(stdin, credentials.MaxValueBytes+2))
				if err != nil {
					return fmt.Errorf("read value from stdin: %w", err)
				}
				value = strings.TrimRight(string(b), "\r\n")
			}
			if value == "" {
				return fmt.Errorf("empty value: pipe it on stdin or use --from-env VAR")
			}
			if len(value) > credentials.MaxValueBytes {
				return fmt.Errorf("value is longer than %d bytes", credentials.MaxValueBytes)
			}
			if gitToken && gitSSHKey {
				return fmt.Errorf("--git-token and --git-ssh-key: a credential is one or the other")
			}
			if !gitSSHKey && (knownHost != "" || hostKey != "") {
				return fmt.Errorf("--known-host and --host-key pin the host key of a --git-ssh-key credential")
			}
			if gitSSHKey {
				// a forge credential for publishing over SSH: the key and the forge's pinned host key
				c, err := publish.NewSSHCredential(value, gitUser, knownHost, hostKey)
				if err != nil {
					return fmt.Errorf("credential %s %w", name, err)
				}
				value = c.Encode()
				if len(value) > credentials.MaxValueBytes {
					return fmt.Errorf("the SSH credential is longer than %d bytes stored (use an ed25519 key)", credentials.MaxValueBytes)
				}
			}
			if gitToken {
				// a forge credential for publishing: the token, as git sends it over HTTPS
				value = publish.GitCredential{Kind: publish.KindHTTPS, Username: gitUser, Token: value}.Encode()
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			if err := c.SetCredential(cmd.Context(), name, value); err != nil {
				return err
			}
			fmt.Fprintf(stdout, "credential %s set\n", name)
			return nil
		},
	}
	cmd.Flags().StringVar(&fromEnv, "from-env", "", "read the value from this environment variable instead of stdin")
	cmd.Flags().BoolVar(&gitToken, "git-token", false, "the value is a forge token for 'openclaw session publish' over HTTPS (a profile's publish.credential names it)")
	cmd.Flags().StringVar(&gitUser, "git-username", "", "with --git-token: the HTTPS username (default x-access-token, as GitHub tokens use); with --git-ssh-key: the SSH user when the remote URL names none (default git)")
	cmd.Flags().BoolVar(&gitSSHKey, "git-ssh-key", false, "the value is an unencrypted SSH private key for 'openclaw session publish' over SSH (pin the forge's host key with --known-host or --host-key)")
	cmd.Flags().StringVar(&knownHost, "known-host", "", "with --git-ssh-key: the forge's host key, a known_hosts line (HOST TYPE BASE64) or TYPE BASE64; the push accepts no other")
	cmd.Flags().StringVar(&hostKey, "host-key", "", "with --git-ssh-key: the SHA256 fingerprint of the forge's host key (SHA256:…, as ssh-keygen -lf prints); the push accepts no other")
	return cmd
}

func newCredentialListCmd(g *globals) *cobra.Command {
	return listCmd(g, &cobra.Command{Use: "list", Example: `  openclaw credential list
  openclaw credential list -o json`, Short: "List credential names (never values)", Args: cobra.NoArgs},
		func(ctx context.Context, c *api.Client, _ []string) ([]inference.CredentialInfo, error) {
			return c.Credentials(ctx)
		},
		[]string{"NAME", "USED BY"}, func(cr inference.CredentialInfo) []string {
			return []string{cr.Name, dash(strings.Join(cr.UsedBy, ", "))}
		})
}

func newCredentialRmCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:     "rm NAME",
		Example: `  openclaw credential rm anthropic`,
		Aliases: []string{"delete", "remove"},
		Short:   "Delete a credential",
		Args:    cobra.ExactArgs(1),
		RunE: g.withClient(func(ctx context.Context, c *api.Client, args []string) error {
			if err := c.DeleteCredential(ctx, args[0]); err != nil {
				return err
			}
			fmt.Fprintf(stdout, "credential %s deleted\n", args[0])
			return nil
		}),
	}
}

// isTerminal reports whether f is a terminal (not merely a character device such as /dev/null).
func isTerminal(f *os.File) bool {
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

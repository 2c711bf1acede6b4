// Command openclaw is the OpenClaw cloud-worker gateway: the daemon, the worker, the local box and the CLI.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:])
	stop()
	if err != nil {
		var ee *exitError
		if errors.As(err, &ee) {
			if ee.msg != "" {
				fmt.Fprintln(os.Stderr, "openclaw:", ee.msg)
			}
			os.Exit(ee.code)
		}
		fmt.Fprintln(os.Stderr, "openclaw:", err)
		os.Exit(1)
	}
}

// exitError carries a specific exit code.
type exitError struct {
	code int
	msg  string
}

func (e *exitError) Error() string { return e.msg }

// Environment knobs, declared in one place.
const (
	envGateway = "OPENCLAW_GATEWAY"  // gateway URL for CLI commands
	envToken   = "OPENCLAW_TOKEN"    // API token for CLI commands
	envDataDir = "OPENCLAW_DATA_DIR" // data dir (gateway and CLI)
	envContext = "OPENCLAW_CONTEXT"  // context of CLI commands (openclaw context)
)

// globals are the persistent flags shared by all commands.
type globals struct {
	dataDir string
	gateway string
	token   string
	output  string
	// context names the context of $XDG_CONFIG_HOME/openclaw/config.yaml to use (--context);
	// tokenFile is where its token is, when it names no data dir.
	context   string
	tokenFile string
}

func run(ctx context.Context, args []string) error {
	g := &globals{}
	root := &cobra.Command{
		Use:   "openclaw",
		Short: "OpenClaw cloud-worker gateway: run agent sessions here or on leased machines",
		Long: `openclaw runs agent sessions on this machine or on ephemeral cloud workers.

  openclaw gateway              run the daemon (HTTP API, environment state machine)
  openclaw profile apply -f F   define how to lease machines
  openclaw env create --profile P --wait
                                lease a machine and watch it come up
  openclaw env list             see environments, their state and age
  openclaw env destroy ID       tear one down (returns on proof of teardown)
  openclaw ui [--open]          sign in to the Control UI in a browser

CLI commands talk to the gateway's API at --gateway (default http://` + "127.0.0.1:7420" + `) with the
token from <data-dir>/gateway.token, or --token.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetContext(ctx)
	// --version prints the table of `openclaw version`; the executable is hashed only then.
	root.Version = "-"
	cobra.AddTemplateFunc("openclawVersion", versionText)
	root.SetVersionTemplate("{{openclawVersion}}")
	pf := root.PersistentFlags()
	// The environment variables are read after parsing (fromEnv), not as flag defaults: help
	// would print a value set in the shell as the default besides the one written here.
	pf.StringVar(&g.dataDir, "data-dir", "", "gateway data dir (default $XDG_STATE_HOME/openclaw-gateway; env "+envDataDir+")")
	pf.StringVar(&g.gateway, "gateway", "", "gateway URL for CLI commands (default http://127.0.0.1:7420; env "+envGateway+")")
	pf.StringVar(&g.token, "token", "", "API token (default: read from <data-dir>/gateway.token; env "+envToken+")")
	pf.StringVar(&g.context, "context", "", "context to use (see openclaw context list; env "+envContext+")")
	_ = root.RegisterFlagCompletionFunc("context", completeContexts)
	root.PersistentPreRunE = func(cmd *cobra.Command, _ []string) error {
		g.fromEnv()
		switch top := topLevel(cmd); top {
		case "gateway", "context", "localbox", "worker", "version", "completion":
			return nil // these never talk to a gateway through a context
		}
		return g.applyContext()
	}

	root.AddCommand(
		newGatewayCmd(g),
		newVersionCmd(g),
		newProfileCmd(g),
		newEnvCmd(g),
		newLocalboxCmd(),
		newWorkerCmd(),
		newSessionCmd(g),
		newModelsCmd(g),
		newCredentialCmd(g),
		newDoctorCmd(g),
		newSyncCmd(g),
		newDemoCmd(g),
		newUICmd(g),
		newDevicesCmd(g),
		newMCPCmd(g),
		newOCCCmd(g),
		newContextCmd(g),
		newGitCredentialCmd(),
		newUsageCmd(g),
		newBudgetCmd(g),
	)
	finishTree(root, g)
	if buildRoot != nil {
		buildRoot(root)
	}
	root.SetArgs(versionArgs(root, args))
	return root.ExecuteContext(ctx)
}

// versionArgs makes `openclaw [global flags] --version [flags]` run `openclaw version [flags]`, so
// that flags after --version (-o json) work as they do on the command.
func versionArgs(root *cobra.Command, args []string) []string {
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--version":
			return append(append([]string{"version"}, args[:i]...), args[i+1:]...)
		case a == "--":
			return args
		case strings.HasPrefix(a, "--") && !strings.Contains(a, "="):
			if f := root.PersistentFlags().Lookup(a[2:]); f != nil && f.NoOptDefVal == "" {
				i++ // the flag's value
			}
		case strings.HasPrefix(a, "-"):
		default:
			return args // a command: --version after it is its own
		}
	}
	return args
}

// fromEnv fills the global options the flags left unset from the environment.
func (g *globals) fromEnv() {
	for _, o := range []struct {
		v   *string
		env string
	}{{&g.dataDir, envDataDir}, {&g.gateway, envGateway}, {&g.token, envToken}, {&g.context, envContext}} {
		if *o.v == "" {
			*o.v = os.Getenv(o.env)
		}
	}
}

// buildRoot, when set (by tests), sees the command tree before it runs.
var buildRoot func(*cobra.Command)

// topLevel is the name of cmd's top-level command ("" for the root).
func topLevel(cmd *cobra.Command) string {
	for cmd.HasParent() && cmd.Parent().HasParent() {
		cmd = cmd.Parent()
	}
	if !cmd.HasParent() {
		return ""
	}
	return cmd.Name()
}

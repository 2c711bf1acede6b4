package stream

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"testing"

	"github.com/openclaw/cloudworkers/sync/internal/synctest"
	"github.com/openclaw/cloudworkers/sync/manifest"
)

// TestMain doubles as the worker executable on an in-process box:
// `<test binary> worker unpack|pack --dir D` and `<test binary> worker manifest [--git] D`.
func TestMain(m *testing.M) {
	if len(os.Args) > 2 && os.Args[1] == "worker" {
		os.Exit(BoxMainForTest(os.Args[2:]))
	}
	synctest.Main(m)
}

// BoxMainForTest is a flag-free stand-in for the worker's sync subcommands.
func BoxMainForTest(args []string) int {
	// As `openclaw worker`: SIGTERM cancels the command's context.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	var err error
	switch {
	case len(args) == 3 && args[0] == "unpack" && args[1] == "--dir":
		_, err = BoxUnpack(ctx, os.Stdin, args[2])
	case len(args) == 7 && args[0] == "unpack" && args[1] == "--dir" && args[3] == "--parts" && args[5] == "--socket":
		var n int
		if _, err := fmt.Sscan(args[4], &n); err != nil {
			return usage(args)
		}
		_, err = BoxUnpackParts(ctx, os.Stdin, args[2], n, args[6])
	case len(args) == 3 && args[0] == "feed" && args[1] == "--socket":
		err = BoxFeed(ctx, os.Stdin, args[2])
	case len(args) == 3 && args[0] == "pack" && args[1] == "--dir":
		_, err = BoxPack(ctx, os.Stdin, os.Stdout, args[2])
	case len(args) >= 2 && args[0] == "manifest":
		var opts manifest.Options
		var cacheFile string
		rest := args[1:]
		for len(rest) > 1 {
			switch rest[0] {
			case "--git":
				opts.Mode, rest = manifest.ModeGit, rest[1:]
			case "--cache":
				cacheFile, rest = rest[1], rest[2:]
			case "--rule-prefix":
				opts.RulePrefix, rest = rest[1], rest[2:]
			default:
				return usage(args)
			}
		}
		if cacheFile != "" {
			opts.Cache = manifest.LoadCache(cacheFile)
		}
		if err = BoxManifest(ctx, os.Stdout, rest[0], opts); err == nil && opts.Cache != nil {
			err = opts.Cache.Save(cacheFile)
		}
	default:
		return usage(args)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

func usage(args []string) int {
	fmt.Fprintf(os.Stderr, "usage: worker unpack|pack --dir D | manifest [--git] [--cache F] D (got %q)\n", args)
	return 2
}

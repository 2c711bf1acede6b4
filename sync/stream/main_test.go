package stream

import (
	"context"
	"fmt"
	"os"
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
	cleanup := synctest.IsolateGit()
	code := m.Run()
	cleanup()
	os.Exit(code)
}

// BoxMainForTest is a flag-free stand-in for the worker's sync subcommands.
func BoxMainForTest(args []string) int {
	ctx := context.Background()
	var err error
	switch {
	case len(args) == 3 && args[0] == "unpack" && args[1] == "--dir":
		_, err = BoxUnpack(ctx, os.Stdin, args[2])
	case len(args) == 3 && args[0] == "pack" && args[1] == "--dir":
		_, err = BoxPack(ctx, os.Stdin, os.Stdout, args[2])
	case len(args) == 2 && args[0] == "manifest":
		err = BoxManifest(ctx, os.Stdout, args[1], manifest.Options{})
	case len(args) == 3 && args[0] == "manifest" && args[1] == "--git":
		err = BoxManifest(ctx, os.Stdout, args[2], manifest.Options{Mode: manifest.ModeGit})
	default:
		err = fmt.Errorf("usage: worker unpack|pack --dir D | manifest [--git] D (got %q)", args)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

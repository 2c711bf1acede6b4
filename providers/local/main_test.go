package local

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"testing"
)

// TestMain doubles as the box executable: the provider tests start the test binary itself as
// `<test binary> localbox --dir … --lease-id … --label k=v`, as the gateway starts `openclaw localbox`.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "localbox" {
		os.Exit(boxChildMain(os.Args[2:]))
	}
	// Boxes started by the tests are race-enabled test binaries: skip the race runtime's 1 s
	// sleep at exit so that stopping a box is as quick as it is in production.
	_ = os.Setenv("GORACE", strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	os.Exit(m.Run())
}

type labelFlags []string

func (l *labelFlags) String() string     { return strings.Join(*l, ",") }
func (l *labelFlags) Set(v string) error { *l = append(*l, v); return nil }

func boxChildMain(args []string) int {
	fs := flag.NewFlagSet("localbox", flag.ContinueOnError)
	var labels labelFlags
	dir := fs.String("dir", "", "")
	leaseID := fs.String("lease-id", "", "")
	listen := fs.String("listen", DefaultListen, "")
	fs.Var(&labels, "label", "")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	lbls, err := ParseLabels(labels)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	err = Serve(ctx, BoxConfig{
		Dir: *dir, LeaseID: *leaseID, Labels: lbls, Listen: *listen,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, nil)),
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "localbox:", err)
		return 1
	}
	return 0
}

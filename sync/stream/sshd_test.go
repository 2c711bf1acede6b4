package stream

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/openclaw/cloudworkers/internal/untrusted"
	"github.com/openclaw/cloudworkers/sync/internal/synctest"
)

// TestPartsOverOpenSSH runs a sync in parts against the real OpenSSH sshd in a network namespace,
// through the real worker binary: the feeds hand their stdin (sshd's pipe) over to the unpack, and
// the tree lands exactly; when a feed or the unpack fails at once, the other commands are stopped
// (the unpack by an SSH "signal" request, which sshd delivers) and the sync fails promptly with
// that command's error, leaving nothing next to the workspace; so does an unpack that fails
// writing one part while the others stream.
func TestPartsOverOpenSSH(t *testing.T) {
	box := synctest.NetnsBox(t, "ocl_syncparts1")
	bin := synctest.BuildBinary(t, "github.com/openclaw/cloudworkers/cmd/openclaw")
	ctx := synctest.Context(t)
	exe := untrusted.Quote(bin) + " worker"
	// Every box command logs its subcommand, so that the test sees the sync went in parts.
	logFile := filepath.Join(box.Home, "commands.log")
	remote := Remote{Client: synctest.Dial(t, box), Channels: 3,
		Command: `f() { echo "$1" >> ` + untrusted.Quote(logFile) + `; exec ` + exe + ` "$@"; }; f`}
	src := partsTree(t)

	t.Run("lands", func(t *testing.T) {
		dst := filepath.Join(box.Home, "ws")
		res, err := PushTree(ctx, remote, src, dst, TreeOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if res.Kind != "cold" {
			t.Fatalf("kind %q, want cold", res.Kind)
		}
		b, err := os.ReadFile(logFile)
		if err != nil {
			t.Fatal(err)
		}
		cmds := strings.Fields(string(b))
		slices.Sort(cmds)
		if want := []string{"feed", "feed", "manifest", "unpack"}; !slices.Equal(cmds, want) {
			t.Fatalf("box commands %v, want %v (a sync in 3 parts)", cmds, want)
		}
		sameTree(t, build(t, src), build(t, dst))
		if l := leftovers(box.Home); len(l) > 0 {
			t.Fatalf("left next to the workspace: %v", l)
		}
	})

	for _, tc := range []struct{ sub, msg string }{
		{"feed", "feed: cannot start"},
		{"unpack", "unpack: cannot start"},
	} {
		t.Run(tc.sub+" fails", func(t *testing.T) {
			r := remote
			r.Command = failingCommand(exe, tc.sub, tc.msg)
			dst := filepath.Join(box.Home, tc.sub+"-fails")
			start := time.Now()
			_, err := PushTree(ctx, r, src, dst, TreeOptions{})
			checkFailedPromptly(t, box.Home, dst, time.Since(start), err, tc.msg)
		})
	}

	t.Run("unpack fails midway", func(t *testing.T) {
		dst, took, err := failMidway(t, Remote{Client: remote.Client, Command: exe}, box.Home)
		checkFailedPromptly(t, box.Home, dst, took, err, "file too large")
	})
}

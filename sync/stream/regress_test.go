package stream

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/openclaw/cloudworkers/sync/internal/synctest"
	"github.com/openclaw/cloudworkers/sync/manifest"
)

// TestApplyStopsAtAFailedFile: a file whose content does not match its sha256, followed by more
// than the in-flight budget (64 MiB) of small files in the same directory, is refused promptly:
// the failed writer stops the reader (it used to drain its queue while the reader waited for
// in-flight room that the drained jobs never gave back).
func TestApplyStopsAtAFailedFile(t *testing.T) {
	var plan Plan
	var raws []raw
	e, r := fileEntry("a-bad", "x")
	e.SHA256 = sum("not x")
	plan.Entries = append(plan.Entries, e)
	raws = append(raws, r)
	body := strings.Repeat("z", 1<<20)
	for i := 0; i < 70; i++ {
		e, r := fileEntry(fmt.Sprintf("f%03d", i), body)
		plan.Entries = append(plan.Entries, e)
		raws = append(raws, r)
	}
	ar := archive(t, plan, raws...)
	done := make(chan error, 1)
	go func() {
		_, err := Apply(context.Background(), bytes.NewReader(ar), t.TempDir(), ApplyOptions{})
		done <- err
	}()
	select {
	case err := <-done:
		var re *RefusedError
		if !errors.As(err, &re) || re.Path != "a-bad" {
			t.Fatalf("Apply returned %v, want the bad file refused", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("Apply hung after a failed file")
	}
}

// TestProgressDuringAStreamedPush: progress reports run while the streamed writer fills the
// entries' hashes in (a data race under -race before the totals were taken up front).
func TestProgressDuringAStreamedPush(t *testing.T) {
	ctx := synctest.Context(t)
	boxDir, remote := startBox(t)
	src := t.TempDir()
	files := map[string]string{}
	for i := 0; i < 3000; i++ {
		files[fmt.Sprintf("d%02d/f%04d", i%20, i)] = fmt.Sprint(i)
	}
	synctest.Write(t, src, files)
	tick := make(chan time.Time)
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		for {
			select {
			case tick <- time.Now():
			case <-stop:
				return
			}
		}
	}()
	remote.progressTick = tick
	remote.Progress = func(Progress) {}
	if _, err := PushTree(ctx, remote, src, filepath.Join(boxDir, "ws"), TreeOptions{}); err != nil {
		t.Fatal(err)
	}
}

// failingCommand is a box command line that runs the worker command exe, except that its
// subcommand sub fails at once, printing msg.
func failingCommand(exe, sub, msg string) string {
	return `f() { if [ "$1" = ` + sub + ` ]; then echo "` + msg + `" >&2; exit 1; fi; exec ` + exe + ` "$@"; }; f`
}

// unpackWithAFailingCommand sends a tree in two parts to a box where the worker subcommand sub
// (unpack or feed) fails at once with message msg, and returns the box's directory, the target,
// the sync's error and how long it took to fail.
func unpackWithAFailingCommand(t *testing.T, sub, msg string) (boxDir, dst string, took time.Duration, err error) {
	boxDir, remote := startBox(t)
	remote.Channels = 2
	src := partsTree(t)
	listing, err := manifest.List(synctest.Context(t), src, manifest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	exe := remote.Command // "<test binary> worker"
	remote.Command = failingCommand(exe, sub, msg)
	dst = filepath.Join(boxDir, "ws")
	start := time.Now()
	_, err = remote.Unpack(synctest.Context(t), dst, src, Plan{Version: PlanVersion, Entries: listing.Unhashed().Entries, SumsLast: true})
	return boxDir, dst, time.Since(start), err
}

// failMidway sends a tree in three parts to a box whose worker may write no file over 1 or
// 2 MiB (`ulimit -f 2048`: blocks of 512 or 1024 bytes, as the shell counts them): the unpack
// fails writing part 0's 3 MiB file while parts 1 and 2 (many small
// files) are still streaming to it, and returns the target, the sync's error and how long it took.
func failMidway(t *testing.T, remote Remote, boxDir string) (dst string, took time.Duration, err error) {
	t.Helper()
	lowerParallelMin(t)
	src := t.TempDir()
	files := map[string]string{"a-big": strings.Repeat("a", 3<<20)}
	for i := range 150 {
		files[fmt.Sprintf("z%d/f%03d.txt", i%6, i)] = strings.Repeat(fmt.Sprintf("%d ", i), 8<<10)
	}
	synctest.Write(t, src, files)
	remote.Channels = 3
	remote.Command = "ulimit -f 2048; " + remote.Command
	dst = filepath.Join(boxDir, "midway")
	start := time.Now()
	_, err = PushTree(synctest.Context(t), remote, src, dst, TreeOptions{})
	return dst, time.Since(start), err
}

// checkFailedPromptly: the sync failed with an error saying want, promptly (no box command was
// left waiting for another to the end of a timeout), and left nothing on the box.
func checkFailedPromptly(t *testing.T, boxDir, dst string, took time.Duration, err error, want string) {
	t.Helper()
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("err = %v, want %q", err, want)
	}
	if took > FeedTimeout/2 {
		t.Fatalf("took %v to fail: a box command waited for another", took)
	}
	if _, err := os.Stat(dst); !os.IsNotExist(err) {
		t.Fatalf("box holds %s after a failed sync (%v)", dst, err)
	}
	waitNoLeftovers(t, boxDir)
}

// TestUnpackFailingMidwayEndsTheSync: a box-side failure in one part while the others stream
// (their readers in blocking reads of the handed-over pipes) ends the whole sync.
func TestUnpackFailingMidwayEndsTheSync(t *testing.T) {
	boxDir, remote := startBox(t)
	dst, took, err := failMidway(t, remote, boxDir)
	checkFailedPromptly(t, boxDir, dst, took, err, "file too large")
}

// TestUnpackFailureStopsTheFeeds: when the box's unpack fails at once (here it refuses to start),
// the feeds, which would dial its socket for FeedTimeout, are stopped: the sync fails promptly
// with the unpack's own error.
func TestUnpackFailureStopsTheFeeds(t *testing.T) {
	_, _, took, err := unpackWithAFailingCommand(t, "unpack", "unpack: feed socket directory: file exists")
	if err == nil || !strings.Contains(err.Error(), "file exists") {
		t.Fatalf("err = %v, want the unpack's failure", err)
	}
	if took > FeedTimeout/2 {
		t.Fatalf("took %v to fail: the feeds went on dialing", took)
	}
}

// TestFeedFailureStopsTheUnpack: a feed that fails before it connects (here it refuses to start)
// does not leave the unpack waiting FeedTimeout for it: the gateway tells the unpack to stop, and
// the sync fails promptly with the feed's error, nothing left on the box.
func TestFeedFailureStopsTheUnpack(t *testing.T) {
	boxDir, dst, took, err := unpackWithAFailingCommand(t, "feed", "feed: cannot start")
	checkFailedPromptly(t, boxDir, dst, took, err, "feed: cannot start")
}

// TestFeedRefusesAForeignSocketDir: a feed sends nothing to a socket whose directory is not a
// 0700 directory of its own user's (another user could have made it first, with a listener).
func TestFeedRefusesAForeignSocketDir(t *testing.T) {
	for name, setup := range map[string]func(dir string){
		"mode 0777":      func(dir string) { must(t, os.Chmod(dir, 0o777)) },
		"another user's": func(dir string) { must(t, os.Chown(dir, 65534, 65534)) },
	} {
		t.Run(name, func(t *testing.T) {
			if name == "another user's" && os.Geteuid() != 0 {
				t.Skip("needs root to give a directory to another user")
			}
			dir := filepath.Join(t.TempDir(), feedDirPrefix+"0123456789abcdef")
			must(t, os.Mkdir(dir, 0o700))
			sock := filepath.Join(dir, "s")
			ln, err := net.Listen("unix", sock)
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			setup(dir)
			got := make(chan []byte, 1)
			go func() {
				c, err := ln.Accept()
				if err != nil {
					got <- nil
					return
				}
				b, _ := io.ReadAll(c)
				c.Close()
				got <- b
			}()
			pr, pw, err := os.Pipe()
			must(t, err)
			defer pr.Close()
			_, err = pw.WriteString("workspace content")
			must(t, err)
			pw.Close()
			err = BoxFeed(context.Background(), pr, sock)
			if err == nil || !strings.Contains(err.Error(), "not a 0700 directory") {
				t.Fatalf("feed: %v, want a refusal of the directory", err)
			}
			ln.Close()
			if b := <-got; len(b) > 0 {
				t.Fatalf("feed sent %q", b)
			}
		})
	}
}

// TestApplyPartsRefusedPlanEndsTheOtherReads: the parts' plans are read at once; a part whose
// plan is refused ends the read of a part whose stream has not delivered its plan yet (a feed
// still waiting for its data), so the refusal comes back at once instead of after that stream.
func TestApplyPartsRefusedPlanEndsTheOtherReads(t *testing.T) {
	_, aR := fileEntry("a", "a")
	hostile := archive(t, Plan{Part: 1, Parts: 2, Entries: []manifest.Entry{{Path: "../x", Type: manifest.TypeFile, Mode: 0o644, Size: 1, SHA256: sum("x")}}}, aR)
	pr, pw := io.Pipe() // part 0: open, nothing sent yet
	defer pw.Close()
	parent := t.TempDir()
	done := make(chan error, 1)
	go func() {
		_, err := ApplyParts(context.Background(), []io.Reader{pr, bytes.NewReader(hostile)}, filepath.Join(parent, "root"), ApplyOptions{})
		done <- err
	}()
	select {
	case err := <-done:
		var re *RefusedError
		if !errors.As(err, &re) || !strings.Contains(err.Error(), "../x") {
			t.Fatalf("ApplyParts returned %v, want part 1's plan refused naming ../x", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("ApplyParts waited for part 0 after part 1's plan was refused")
	}
	if des, _ := os.ReadDir(parent); len(des) != 0 {
		t.Fatalf("refused sync left %d entries in the parent", len(des))
	}
}

// TestUnpackPartsTakesOnlyHandedOverStreams: a part comes as a feed's stdin handed over on the
// socket; a connection that sends bytes instead gets the unpack refused at once (not a wait for
// FeedTimeout), naming the feed, with nothing written.
func TestUnpackPartsTakesOnlyHandedOverStreams(t *testing.T) {
	parent := t.TempDir()
	sock := filepath.Join(parent, feedDirPrefix+"0123456789abcdef", "s")
	stdinR, stdinW := io.Pipe()
	defer stdinW.Close()
	done := make(chan error, 1)
	go func() {
		_, err := BoxUnpackParts(context.Background(), stdinR, filepath.Join(parent, "root"), 2, sock)
		done <- err
	}()
	var c net.Conn
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		var err error
		if c, err = net.Dial("unix", sock); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("unpack never listened: %v", err)
		}
	}
	defer c.Close()
	if _, err := c.Write([]byte("a tar stream sent as bytes")); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "1 of 2 parts arrived: feed: unexpected message (1 bytes, 0 descriptors)") {
			t.Fatalf("unpack: %v, want the feed's message refused", err)
		}
	case <-time.After(FeedTimeout / 2):
		t.Fatal("unpack still waiting after a feed sent bytes instead of its stdin")
	}
	if des, _ := os.ReadDir(parent); len(des) != 0 {
		t.Fatalf("refused unpack left %d entries in %s", len(des), parent)
	}
}

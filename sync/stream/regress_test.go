package stream

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/openclaw/cloudworkers/sync/internal/synctest"
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

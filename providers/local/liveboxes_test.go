package local_test

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/openclaw/cloudworkers/providers/local"
	"github.com/openclaw/cloudworkers/providers/local/localtest"
)

// TestLiveBoxesListsOnlyBoxesHoldingTheirLock: a running box is listed with its pid; a box
// directory whose lock file names a pid but is not held (the box died) and a directory that was
// never a box are not.
func TestLiveBoxesListsOnlyBoxesHoldingTheirLock(t *testing.T) {
	root, err := os.MkdirTemp("", "lbs")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	boxes := local.BoxesDir(root)
	live := localtest.StartConfig(t, local.BoxConfig{Dir: local.BoxDir(boxes, "live")})

	dead := local.BoxDir(boxes, "dead")
	if err := os.MkdirAll(filepath.Join(dead, ".localbox"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dead, ".localbox", "lock"), []byte(strconv.Itoa(os.Getpid())+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(local.BoxDir(boxes, "plain"), 0o700); err != nil {
		t.Fatal(err)
	}

	got := local.LiveBoxes(boxes)
	if len(got) != 1 || got[live.Dir] != os.Getpid() {
		t.Fatalf("LiveBoxes(%s) = %v, want only %s with pid %d", boxes, got, live.Dir, os.Getpid())
	}
	if got := local.LiveBoxes(filepath.Join(root, "missing")); len(got) != 0 {
		t.Fatalf("LiveBoxes of a missing directory = %v", got)
	}
}

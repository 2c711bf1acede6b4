package boxproc

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/openclaw/cloudworkers/internal/testrig/testenv"
)

// Stop ends the box of the directory it is given, and leaves alone a process that has the pid of
// a box that ended (another process, or a box of another directory).
func TestStopEndsOnlyTheBoxOfItsDirectory(t *testing.T) {
	if _, err := os.Stat("/proc/self"); err != nil {
		t.Skip("no /proc: Stop trusts the pid")
	}
	dir := t.TempDir()
	// A stand-in box: sh running the script "localbox", so that its command line is
	// `openclaw localbox --dir <box>`.
	if err := os.WriteFile(filepath.Join(dir, "localbox"), []byte("trap 'kill $!; exit 0' TERM; : > trapped; sleep 300 & wait\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Skip("no sh")
	}
	box := filepath.Join(dir, "box")
	cmd := &exec.Cmd{Path: sh, Args: []string{"/opt/openclaw", "localbox", "--dir", box, "--lease-id", "l1"}, Dir: dir}
	boxExited := testenv.StartGroup(t, cmd)
	otherCmd := exec.Command("sleep", "300")
	other := testenv.StartGroup(t, otherCmd)
	testenv.Eventually(t, "the stand-in's trap set", func() bool {
		_, err := os.Stat(filepath.Join(dir, "trapped"))
		return err == nil
	})

	Stop(cmd.Process.Pid, filepath.Join(dir, "another-box"))
	Stop(otherCmd.Process.Pid, box)
	select {
	case <-boxExited:
		t.Fatal("Stop ended the box of another directory")
	case <-other:
		t.Fatal("Stop ended a process that is no box")
	case <-time.After(500 * time.Millisecond): // a signalled process would have ended by now
	}
	Stop(cmd.Process.Pid, box)
	select {
	case <-boxExited:
	case <-time.After(10 * time.Second):
		t.Fatal("Stop did not end the box of its directory")
	}
	Stop(cmd.Process.Pid, box) // the box has ended: nothing happens
}

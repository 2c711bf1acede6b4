package demo

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/openclaw/cloudworkers/internal/testrig/testenv"
)

// The demo's teardown kills worker pids that boxes wrote: a pidfile that is a symlink (to
// /dev/zero, say) is not read, and a pid whose process is not an openclaw worker is not killed.
func TestTeardownReadsOnlyAWorkersPidfile(t *testing.T) {
	dir := t.TempDir()
	link := filepath.Join(dir, "worker.pid")
	if err := os.Symlink("/dev/zero", link); err != nil {
		t.Fatal(err)
	}
	if _, err := readPIDFile(link); err == nil {
		t.Fatal("a pidfile that is a symlink to /dev/zero was read")
	}
	// a process that only mentions a worker
	other := exec.Command("sh", "-c", "sleep 300; true # openclaw worker", "worker")
	testenv.StartGroup(t, other)
	if _, err := os.Stat("/proc/self"); err == nil && isOpenclawProcess(other.Process.Pid) {
		t.Fatalf("%q taken for an openclaw worker", other.Args)
	}
}

package demo

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/openclaw/cloudworkers/gateway/bootstrap"
	"github.com/openclaw/cloudworkers/internal/boxproc"
	"github.com/openclaw/cloudworkers/internal/clock"
	"github.com/openclaw/cloudworkers/providers/local"
)

// liveWorkers lists the worker processes of the demo still alive: those the pidfiles of its boxes
// name, and the one seen when the session became active (its pidfile may be gone with its box).
func (d *run) liveWorkers() []int {
	pids := map[int]bool{}
	if pid := d.pids["worker"]; pid > 0 {
		pids[pid] = true
	}
	// Each box's HOME is its directory: any environment's pidfile under any box.
	files, _ := filepath.Glob(bootstrap.WorkerPIDPath(local.BoxDir(d.boxes(), "*"), "*"))
	for _, f := range files {
		if pid, err := readPIDFile(f); err == nil {
			pids[pid] = true
		}
	}
	var out []int
	for pid := range pids {
		if isOpenclawProcess(pid) {
			out = append(out, pid)
		}
	}
	return out
}

// waitGone waits until every pid has exited (a zombie counts as exited).
func waitGone(ctx context.Context, pids map[string]int, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		var alive []string
		for role, pid := range pids {
			if pid > 0 && !processExited(pid) {
				alive = append(alive, fmt.Sprintf("%s pid %d", role, pid))
			}
		}
		if len(alive) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("still running after %s: %s", within, strings.Join(alive, ", "))
		}
		if err := clock.Sleep(ctx, clock.Real, 50*time.Millisecond); err != nil {
			return err
		}
	}
}

func processExited(pid int) bool {
	if errors.Is(syscall.Kill(pid, 0), syscall.ESRCH) {
		return true
	}
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// "pid (comm) S …": the state follows the parenthesised command name.
	if i := bytes.LastIndexByte(stat, ')'); i >= 0 && i+2 < len(stat) {
		return stat[i+2] == 'Z' || stat[i+2] == 'X'
	}
	return false
}

// isOpenclawProcess reports whether pid is alive and (where /proc tells) runs an openclaw worker
// (`<bundle> worker --descriptor …`), so that a recycled pid is never killed.
func isOpenclawProcess(pid int) bool {
	if pid <= 1 || processExited(pid) {
		return false
	}
	args, err := boxproc.Args(pid)
	if err != nil {
		return !errors.Is(err, fs.ErrNotExist) // no /proc on this system: trust the pidfile
	}
	return len(args) >= 3 && args[1] == "worker" && args[2] == "--descriptor"
}

// readPIDFile reads a pidfile a box wrote: a regular file of a few bytes (a symlink to /dev/zero
// or a FIFO there is not read).
func readPIDFile(path string) (int, error) {
	fi, err := os.Lstat(path)
	if err != nil {
		return 0, err
	}
	if !fi.Mode().IsRegular() || fi.Size() > 32 {
		return 0, fmt.Errorf("pidfile %s is not a small regular file", path)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(string(b)))
}

// Package boxproc starts and stops the detached `openclaw localbox` processes that back the leases
// of the example lease CLIs (and that the tests stop).
package boxproc

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// State is what a started box publishes in <dir>/.localbox/state.json.
type State struct {
	PID           int    `json:"pid"`
	Port          int    `json:"port"`
	User          string `json:"user"`
	HostKey       string `json:"hostKey"`
	ClientKeyPath string `json:"clientKeyPath"`
}

// Start runs `bin localbox --dir dir --lease-id id` with the extra args in a session of its own, so
// it outlives the caller, and waits up to 15s for the state it publishes (killing it on timeout).
func Start(bin, dir, id string, extra ...string) (State, error) {
	cmd := exec.Command(bin, append([]string{"localbox", "--dir", dir, "--lease-id", id}, extra...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return State{}, fmt.Errorf("start localbox: %w", err)
	}
	go func() { _ = cmd.Wait() }()
	deadline := time.Now().Add(15 * time.Second)
	for {
		var st State
		b, err := os.ReadFile(filepath.Join(dir, ".localbox", "state.json"))
		if err == nil && json.Unmarshal(b, &st) == nil && st.Port > 0 {
			return st, nil
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			return State{}, errors.New("localbox did not start within 15s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Stop stops the box process pid that serves dir (SIGTERM, then SIGKILL after about 5s); pid <= 0
// means none. A box that ended leaves its pid in the lease's state, and on a busy machine that pid
// soon belongs to another process: a pid whose command line is not `… localbox --dir dir …` is left
// alone (where there is no /proc to read, the pid is trusted).
func Stop(pid int, dir string) {
	if pid <= 0 || !serves(pid, dir) || syscall.Kill(pid, syscall.SIGTERM) != nil {
		return
	}
	for i := 0; i < 250 && serves(pid, dir); i++ {
		time.Sleep(20 * time.Millisecond)
	}
	if serves(pid, dir) {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
}

// serves reports whether process pid is `localbox --dir dir`, as Start runs it.
func serves(pid int, dir string) bool {
	args, err := Args(pid)
	if err != nil {
		_, noProc := os.Stat("/proc/self")
		return noProc != nil && syscall.Kill(pid, 0) == nil
	}
	return len(args) >= 4 && args[1] == "localbox" && args[2] == "--dir" && args[3] == dir
}

// Args returns the arguments of process pid (its argv, argv[0] first) as /proc shows them; an
// error where there is no such process or no /proc. A pid a file names is checked against them
// before it is signalled: the process that had it may be gone and the pid another's.
func Args(pid int) ([]string, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil {
		return nil, err
	}
	return strings.Split(string(b), "\x00"), nil
}

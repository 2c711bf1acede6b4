// Package boxproc starts and stops the detached `openclaw localbox` processes that back the leases
// of the example lease CLIs.
package boxproc

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
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

// Stop stops the box process pid (SIGTERM, then SIGKILL after about 5s); pid <= 0 means none.
func Stop(pid int) {
	if pid <= 0 || syscall.Kill(pid, syscall.SIGTERM) != nil {
		return
	}
	for i := 0; i < 250 && syscall.Kill(pid, 0) == nil; i++ {
		time.Sleep(20 * time.Millisecond)
	}
	_ = syscall.Kill(pid, syscall.SIGKILL)
}

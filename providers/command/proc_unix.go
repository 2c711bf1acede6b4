//go:build unix

package command

import (
	"os/exec"
	"syscall"
)

// setProcessGroup starts the command in its own process group and makes cancellation kill the
// whole group, so a lease CLI that forked helpers cannot outlive its timeout.
func setProcessGroup(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error {
		return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
}

// killProcessGroup kills what is left of the command's process group after it was waited for:
// helpers a lease CLI started and did not stop must not outlive it.
func killProcessGroup(cmd *exec.Cmd) {
	if cmd.Process != nil && cmd.Process.Pid > 0 {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
}

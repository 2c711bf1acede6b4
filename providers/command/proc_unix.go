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

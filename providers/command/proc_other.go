//go:build !unix

package command

import "os/exec"

// setProcessGroup is a no-op where process groups do not exist; cancellation kills the process.
func setProcessGroup(cmd *exec.Cmd) {}

// killProcessGroup is a no-op where process groups do not exist.
func killProcessGroup(cmd *exec.Cmd) {}

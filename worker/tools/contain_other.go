//go:build !linux

package tools

import (
	"context"
	"syscall"
)

// containment, away from Linux, relies on the process group alone: a detached process escapes.
type containment struct{ scope string }

func newContainment(scope string) *containment              { return &containment{scope: scope} }
func (c *containment) how() string                          { return "process group" }
func (c *containment) prepare(*syscall.SysProcAttr, string) {}
func (c *containment) stop(context.Context) (int, error)    { return 0, nil }

// StopLeftovers finds nothing away from Linux.
func StopLeftovers(context.Context, string) (Stopped, error) { return Stopped{}, nil }

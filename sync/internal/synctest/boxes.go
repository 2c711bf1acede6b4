package synctest

import (
	"testing"

	"golang.org/x/crypto/ssh"

	"github.com/openclaw/cloudworkers/internal/testrig/netnsbox"
)

// Box is a machine reachable over SSH for sync tests: an in-process local box or a network
// namespace running OpenSSH sshd (internal/netnsbox).
type Box = netnsbox.Box

// BuildBinary builds the Go package pkg into a directory other users can execute from, once per
// test binary (netnsbox.BuildBinary); CleanupBinaries removes it.
func BuildBinary(t testing.TB, pkg string) string { t.Helper(); return netnsbox.BuildBinary(t, pkg) }

// CleanupBinaries removes what BuildBinary built.
func CleanupBinaries() { netnsbox.CleanupBinaries() }

// LocalBox serves an in-process local box (providers/local) until the end of the test.
func LocalBox(t testing.TB) Box { t.Helper(); return netnsbox.LocalBox(t) }

// NetnsBox leases a box from examples/lease-netns and stops it at the end of the test, even on
// failure (netnsbox.NetnsBox).
func NetnsBox(t testing.TB, leaseID string) Box { t.Helper(); return netnsbox.NetnsBox(t, leaseID) }

// Dial opens an SSH connection to the box with its pinned host key, closed at the end of the test.
func Dial(t testing.TB, b Box) *ssh.Client { t.Helper(); return netnsbox.Dial(t, b) }

// Exec runs a shell command on the box and returns its combined output, failing the test on error.
func Exec(t testing.TB, c *ssh.Client, cmd string) string {
	t.Helper()
	return netnsbox.Exec(t, c, cmd)
}

// KnownHosts writes an OpenSSH known_hosts file pinning the box's host key and returns its path.
func KnownHosts(t testing.TB, b Box) string { t.Helper(); return netnsbox.KnownHosts(t, b) }

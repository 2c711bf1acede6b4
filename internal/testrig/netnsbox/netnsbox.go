// Package netnsbox gives tests and benchmarks a machine reachable over SSH: an in-process local box
// (providers/local) or a network namespace in 198.18.0.0/15 running OpenSSH sshd as its own user
// (examples/lease-netns), with helpers to log in and run commands. Namespaces, veths and users are
// removed at the end of the test, even on failure.
package netnsbox

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/openclaw/cloudworkers/gateway/tunnel"
	"github.com/openclaw/cloudworkers/internal/testrig/testenv"
	"github.com/openclaw/cloudworkers/providers/local/localtest"
)

// Box is a machine reachable over SSH: an in-process local box or a network namespace running
// OpenSSH sshd.
type Box struct {
	Host    string
	Port    int
	User    string
	KeyPath string
	// HostKey is the pinned host key, authorized_keys format.
	HostKey string
	// Home is the box user's HOME (on this machine's filesystem for both kinds).
	Home string
	// HostAddr is this machine's address on a netns box's veth (the box reaches it, and nothing
	// else, without a route); empty for a local box.
	HostAddr string
}

var (
	buildMu sync.Mutex
	built   = map[string]string{}
)

// BuildBinary builds the Go package pkg (an import path) into a directory other users can
// execute from, once per test binary, and returns the executable's path. The directory is
// removed by CleanupBinaries (call it from TestMain).
func BuildBinary(t testing.TB, pkg string) string {
	t.Helper()
	buildMu.Lock()
	defer buildMu.Unlock()
	if p, ok := built[pkg]; ok {
		return p
	}
	dir, err := os.MkdirTemp("", "netnsbox-bin")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, filepath.Base(pkg))
	cmd := exec.Command("go", "build", "-o", out, pkg)
	if b, err := cmd.CombinedOutput(); err != nil {
		os.RemoveAll(dir)
		t.Fatalf("go build %s: %v\n%s", pkg, err, b)
	}
	built[pkg] = out
	return out
}

// CleanupBinaries removes what BuildBinary built.
func CleanupBinaries() {
	buildMu.Lock()
	defer buildMu.Unlock()
	for _, p := range built {
		os.RemoveAll(filepath.Dir(p))
	}
	built = map[string]string{}
}

// LocalBox serves an in-process local box (providers/local) until the end of the test.
func LocalBox(t testing.TB) Box {
	t.Helper()
	b := localtest.Start(t)
	return Box{Host: b.Host, Port: b.Port, User: b.User, KeyPath: b.ClientKeyPath, HostKey: b.HostKey, Home: b.Dir}
}

// Netns leases boxes from examples/lease-netns in a state directory of its own.
type Netns struct {
	bin, state string
}

// NewNetns returns a lease-netns with a fresh state directory. Without root or the commands it
// needs, the test is stopped through internal/testenv.
func NewNetns(t testing.TB) *Netns {
	t.Helper()
	testenv.RequireRoot(t)
	testenv.RequireCommands(t, "ip", "sshd", "useradd", "userdel")
	return &Netns{bin: BuildBinary(t, "github.com/openclaw/cloudworkers/examples/lease-netns"), state: testenv.PublicDir(t, "ocw-netns-")}
}

func (n *Netns) run(args ...string) ([]byte, error) {
	out, err := exec.Command(n.bin, append([]string{"--state-dir", n.state}, args...)...).Output()
	if err != nil {
		msg := ""
		if ee, ok := err.(*exec.ExitError); ok {
			msg = string(ee.Stderr)
		}
		return nil, fmt.Errorf("lease-netns %v: %v %s", args, err, msg)
	}
	return out, nil
}

// Warmup leases the box leaseID (a new one, or the live one of that id: lease-netns adopts it)
// and registers its stop at the end of the test, even on failure.
func (n *Netns) Warmup(t testing.TB, leaseID string) Box {
	t.Helper()
	// Registered before warmup: a warmup that fails half way is rolled back by stop too.
	t.Cleanup(func() {
		if err := n.Stop(leaseID); err != nil {
			t.Error(err)
		}
	})
	b, err := n.WarmupNoCleanup(leaseID)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// WarmupNoCleanup is Warmup for a caller that stops the lease itself (with Stop), for example
// to time create and destroy; the caller must also stop it on failure.
func (n *Netns) WarmupNoCleanup(leaseID string) (Box, error) {
	out, err := n.run("warmup", "--lease-id", leaseID, "--ttl", "30m", "--json")
	if err != nil {
		return Box{}, err
	}
	var v struct {
		SSHHost, SSHUser, SSHKey, SSHHostKey, Home string
		SSHPort                                    int
		HostIf                                     string `json:"hostInterface"`
	}
	if err := json.Unmarshal(out, &v); err != nil {
		return Box{}, fmt.Errorf("lease-netns warmup %s: %w", leaseID, err)
	}
	b := Box{Host: v.SSHHost, Port: v.SSHPort, User: v.SSHUser, KeyPath: v.SSHKey, HostKey: v.SSHHostKey, Home: v.Home}
	if b.HostAddr, err = hostAddr(v.HostIf); err != nil {
		return b, fmt.Errorf("lease-netns warmup %s: %w", leaseID, err)
	}
	return b, nil
}

// Stop stops the lease leaseID; a lease that does not exist (any more) is not an error.
func (n *Netns) Stop(leaseID string) error {
	if out, err := exec.Command(n.bin, "--state-dir", n.state, "stop", leaseID).CombinedOutput(); err != nil && !strings.Contains(string(out), "no such lease") {
		return fmt.Errorf("lease-netns stop %s: %v %s", leaseID, err, out)
	}
	return nil
}

// hostAddr is the IPv4 address of this machine's end of a box's veth.
func hostAddr(dev string) (string, error) {
	out, err := exec.Command("ip", "-o", "-4", "addr", "show", "dev", dev).Output()
	if err != nil {
		return "", fmt.Errorf("ip addr show dev %s: %w", dev, err)
	}
	for _, f := range strings.Fields(string(out)) {
		if p, err := netip.ParsePrefix(f); err == nil {
			return p.Addr().String(), nil
		}
	}
	return "", fmt.Errorf("no IPv4 address on %s: %q", dev, out)
}

// NetnsBox leases a box from examples/lease-netns (a network namespace in 198.18.0.0/15 with
// OpenSSH sshd and its own user) and stops it at the end of the test, even on failure. Without
// root or the commands it needs, the test is stopped through internal/testenv.
func NetnsBox(t testing.TB, leaseID string) Box {
	t.Helper()
	return NewNetns(t).Warmup(t, leaseID)
}

// Target is how the gateway's tunnel package reaches b for environment env, forwarding socket.
func Target(b Box, env, socket string) tunnel.Target {
	return tunnel.Target{EnvironmentID: env, Host: b.Host, Port: b.Port, User: b.User,
		KeyPath: b.KeyPath, HostKeys: []string{b.HostKey}, SocketPath: socket}
}

// Dial opens an SSH connection to the box with its pinned host key, closed at the end of the test.
func Dial(t testing.TB, b Box) *ssh.Client {
	t.Helper()
	c, err := tunnel.Dial(testenv.Context(t, 60*time.Second), Target(b, "env-sync", "x.sock"), 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// Exec runs a shell command on the box and returns its combined output, failing the test on error.
func Exec(t testing.TB, c *ssh.Client, cmd string) string {
	t.Helper()
	s, err := c.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	out, err := s.CombinedOutput(cmd)
	if err != nil {
		t.Fatalf("box: %s: %v\n%s", cmd, err, out)
	}
	return strings.TrimSpace(string(out))
}

// KnownHosts writes an OpenSSH known_hosts file pinning the box's host key and returns its path.
func KnownHosts(t testing.TB, b Box) string {
	t.Helper()
	host := b.Host
	if b.Port != 22 {
		host = fmt.Sprintf("[%s]:%d", b.Host, b.Port)
	}
	f := filepath.Join(t.TempDir(), "known_hosts")
	if err := os.WriteFile(f, []byte(host+" "+strings.TrimSpace(b.HostKey)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

package local

import (
	"bytes"
	"errors"
	"net"
	"os"
	"strconv"
	"syscall"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
)

const canaryEnv = "OPENCLAW_LOCALBOX_TEST_CANARY"

// processGone reports whether pid has exited. A zombie counts as exited: an orphan is reaped by
// whatever runs as pid 1, which in a container may take its time.
func processGone(pid int) bool {
	if errors.Is(syscall.Kill(pid, 0), syscall.ESRCH) {
		return true
	}
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return errors.Is(err, os.ErrNotExist)
	}
	// The state follows the parenthesised command name: "pid (comm) S ...".
	if i := bytes.LastIndexByte(stat, ')'); i >= 0 && i+2 < len(stat) {
		return stat[i+2] == 'Z' || stat[i+2] == 'X'
	}
	return false
}

// dialBox logs into a box with its client key, pinning hostKey.
func dialBox(t *testing.T, host string, port int, user, keyPath, hostKey string) (*ssh.Client, error) {
	t.Helper()
	keyPEM, err := os.ReadFile(keyPath)
	if err != nil {
		t.Fatal(err)
	}
	signer, err := ssh.ParsePrivateKey(keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return dialWith(t, host, port, user, signer, hostKey)
}

func dialWith(t *testing.T, host string, port int, user string, signer ssh.Signer, hostKey string) (*ssh.Client, error) {
	t.Helper()
	pinned, _, _, _, err := ssh.ParseAuthorizedKey([]byte(hostKey))
	if err != nil {
		t.Fatal(err)
	}
	c, err := ssh.Dial("tcp", net.JoinHostPort(host, strconv.Itoa(port)), &ssh.ClientConfig{
		User:            user,
		Auth:            []ssh.AuthMethod{ssh.PublicKeys(signer)},
		HostKeyCallback: ssh.FixedHostKey(pinned),
		Timeout:         5 * time.Second,
	})
	if err == nil {
		t.Cleanup(func() { c.Close() })
	}
	return c, err
}

// run executes cmd on the box and returns its stdout, stderr and exit error.
func run(t *testing.T, c *ssh.Client, cmd string) (string, string, error) {
	t.Helper()
	s, err := c.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var out, errOut bytes.Buffer
	s.Stdout, s.Stderr = &out, &errOut
	err = s.Run(cmd)
	return out.String(), errOut.String(), err
}

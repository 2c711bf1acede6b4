package local

import (
	"bytes"
	"net"
	"os"
	"strconv"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
)

const canaryEnv = "OPENCLAW_LOCALBOX_TEST_CANARY"

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

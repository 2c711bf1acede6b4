package localtest

import (
	"net"
	"os"
	"strconv"
	"testing"

	"golang.org/x/crypto/ssh"
)

func TestStartServesALoginWithThePinnedHostKey(t *testing.T) {
	b := Start(t)
	key, err := readKey(b.ClientKeyPath)
	if err != nil {
		t.Fatal(err)
	}
	hostKey, _, _, _, err := ssh.ParseAuthorizedKey([]byte(b.HostKey))
	if err != nil {
		t.Fatal(err)
	}
	c, err := ssh.Dial("tcp", b.addr(), &ssh.ClientConfig{User: b.User, Auth: []ssh.AuthMethod{ssh.PublicKeys(key)},
		HostKeyCallback: ssh.FixedHostKey(hostKey)})
	if err != nil {
		t.Fatalf("login to the box: %v", err)
	}
	defer c.Close()
	s, err := c.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	out, err := s.Output("echo $HOME")
	if err != nil {
		t.Fatal(err)
	}
	if got := string(out); got != b.Dir+"\n" {
		t.Fatalf("box HOME = %q, want %q", got, b.Dir)
	}
}

func (b Box) addr() string { return net.JoinHostPort(b.Host, strconv.Itoa(b.Port)) }

func readKey(path string) (ssh.Signer, error) {
	pem, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return ssh.ParsePrivateKey(pem)
}

package tunneltest

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/crypto/ssh"
)

// Key writes a new ed25519 private key file in a temp dir and returns its path and signer.
func Key(t testing.TB) (string, ssh.Signer) {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	blk, err := ssh.MarshalPrivateKey(priv, "")
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "id_ed25519")
	if err := os.WriteFile(p, pem.EncodeToMemory(blk), 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	return p, s
}

// HostKey returns a new ed25519 public key in authorized_keys form, as a profile pins a box's
// host key.
func HostKey(t testing.TB) string {
	t.Helper()
	_, s := Key(t)
	return strings.TrimSpace(string(ssh.MarshalAuthorizedKey(s.PublicKey())))
}

// Endpoint is how to dial a SilentBox: address, a client key file and the pinned host key.
type Endpoint struct {
	Host    string
	Port    int
	KeyPath string
	HostKey string // authorized_keys format
}

// StartLoopback starts a SilentBox on a free loopback port with a new host key, and returns it
// with what a client needs to dial it.
func StartLoopback(t testing.TB, mode Mode) (*SilentBox, Endpoint) {
	t.Helper()
	_, hostKey := Key(t)
	keyPath, _ := Key(t)
	s := Start(t, "127.0.0.1:0", hostKey, mode)
	host, port, _ := net.SplitHostPort(s.Addr)
	p, _ := strconv.Atoi(port)
	return s, Endpoint{Host: host, Port: p, KeyPath: keyPath, HostKey: string(ssh.MarshalAuthorizedKey(hostKey.PublicKey()))}
}

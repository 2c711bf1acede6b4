package tunnel

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/crypto/ssh"
)

// Ciphers is the cipher preference of every tunnel connection: AES-GCM first (about twice as fast as
// chacha20-poly1305 in Go on amd64), then chacha20-poly1305, then the CTR modes for old servers.
var Ciphers = []string{
	ssh.CipherAES128GCM,
	ssh.CipherChaCha20Poly1305,
	ssh.CipherAES256GCM,
	ssh.CipherAES128CTR,
	ssh.CipherAES192CTR,
	ssh.CipherAES256CTR,
}

// Target says how to reach one environment's box.
type Target struct {
	EnvironmentID string
	Host          string
	Port          int
	User          string
	// KeyPath is the lease's private key file (OpenSSH or PEM format, unencrypted).
	KeyPath string
	// HostKeys are the pinned host keys in authorized_keys format. The presented key must equal
	// one of them exactly; there is no way to accept an unknown key.
	HostKeys []string
	// SocketPath is the remote unix socket to forward: absolute, or relative to the box user's HOME
	// (optionally written "~/…"). Its directory is created with mode 0700.
	SocketPath string
	// EpochBase is the last tunnel epoch used for this environment before (for example one
	// persisted across a gateway restart); epochs handed out by the hub are always above it.
	EpochBase uint64
}

// Validate reports a Target that can never be dialled.
func (t Target) Validate() error {
	switch {
	case t.EnvironmentID == "":
		return errors.New("tunnel target: environment id is required")
	case t.Host == "":
		return fmt.Errorf("tunnel target %s: host is required", t.EnvironmentID)
	case t.Port <= 0 || t.Port > 65535:
		return fmt.Errorf("tunnel target %s: invalid port %d", t.EnvironmentID, t.Port)
	case t.User == "":
		return fmt.Errorf("tunnel target %s: user is required", t.EnvironmentID)
	case t.KeyPath == "":
		return fmt.Errorf("tunnel target %s: key path is required", t.EnvironmentID)
	case t.SocketPath == "" || strings.ContainsAny(t.SocketPath, "\x00\n"):
		return fmt.Errorf("tunnel target %s: invalid socket path %q", t.EnvironmentID, t.SocketPath)
	}
	if _, err := parseHostKeys(t.HostKeys); err != nil {
		return fmt.Errorf("tunnel target %s: %w", t.EnvironmentID, err)
	}
	return nil
}

func (t Target) addr() string { return net.JoinHostPort(t.Host, strconv.Itoa(t.Port)) }

// HostKeyMismatchError is returned when a box presents a host key that is not pinned.
type HostKeyMismatchError struct {
	EnvironmentID string
	Host          string // host:port that was dialled
	Expected      []string
	Presented     string // SHA256 fingerprints, as ssh-keygen -l prints them
}

func (e *HostKeyMismatchError) Error() string {
	return fmt.Sprintf("host key mismatch for environment %s at %s: presented %s, expected %s",
		e.EnvironmentID, e.Host, e.Presented, strings.Join(e.Expected, " or "))
}

// parseHostKeys parses pinned keys in authorized_keys format; at least one is required.
func parseHostKeys(lines []string) ([]ssh.PublicKey, error) {
	var keys []ssh.PublicKey
	for _, l := range lines {
		l = strings.TrimSpace(l)
		if l == "" {
			continue
		}
		k, _, _, _, err := ssh.ParseAuthorizedKey([]byte(l))
		if err != nil {
			return nil, fmt.Errorf("parse pinned host key: %w", err)
		}
		keys = append(keys, k)
	}
	if len(keys) == 0 {
		return nil, errors.New("no pinned host key")
	}
	return keys, nil
}

// hostKeyAlgorithms asks the server for the key types that are pinned, so that a server with
// several host keys presents one we can check.
func hostKeyAlgorithms(keys []ssh.PublicKey) []string {
	var algos []string
	add := func(a ...string) {
		for _, x := range a {
			if !slices.Contains(algos, x) {
				algos = append(algos, x)
			}
		}
	}
	for _, k := range keys {
		if k.Type() == ssh.KeyAlgoRSA {
			add(ssh.KeyAlgoRSASHA512, ssh.KeyAlgoRSASHA256, ssh.KeyAlgoRSA)
			continue
		}
		add(k.Type())
	}
	return algos
}

func loadSigner(path string) (ssh.Signer, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read key: %w", err)
	}
	s, err := ssh.ParsePrivateKey(b)
	if err != nil {
		return nil, fmt.Errorf("parse key %s: %w", path, err)
	}
	return s, nil
}

// Dial opens one SSH connection to t with the lease key, verifying the host key exactly against
// t.HostKeys. timeout bounds the TCP connect and the SSH handshake; 0 means only ctx bounds them.
// A presented key that is not pinned fails with *HostKeyMismatchError.
func Dial(ctx context.Context, t Target, timeout time.Duration) (*ssh.Client, error) {
	return dial(ctx, t, timeout, nil)
}

// dial is Dial with the TCP connection wrapped by wrap (when not nil) under the SSH layer.
func dial(ctx context.Context, t Target, timeout time.Duration, wrap func(net.Conn) net.Conn) (*ssh.Client, error) {
	pins, err := parseHostKeys(t.HostKeys)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", t.EnvironmentID, err)
	}
	signer, err := loadSigner(t.KeyPath)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", t.EnvironmentID, err)
	}
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	addr := t.addr()
	var d net.Dialer
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", t.EnvironmentID, err)
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = nc.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { nc.Close() })

	var mismatch *HostKeyMismatchError
	cfg := &ssh.ClientConfig{
		Config: ssh.Config{Ciphers: Ciphers},
		User:   t.User,
		Auth:   []ssh.AuthMethod{ssh.PublicKeys(signer)},
		HostKeyCallback: func(_ string, _ net.Addr, key ssh.PublicKey) error {
			presented := key.Marshal()
			for _, p := range pins {
				if string(p.Marshal()) == string(presented) {
					return nil
				}
			}
			mismatch = &HostKeyMismatchError{
				EnvironmentID: t.EnvironmentID,
				Host:          addr,
				Presented:     ssh.FingerprintSHA256(key),
			}
			for _, p := range pins {
				mismatch.Expected = append(mismatch.Expected, ssh.FingerprintSHA256(p))
			}
			return mismatch
		},
		HostKeyAlgorithms: hostKeyAlgorithms(pins),
	}
	sc := nc
	if wrap != nil {
		sc = wrap(nc)
	}
	conn, chans, reqs, err := ssh.NewClientConn(sc, addr, cfg)
	if !stop() {
		// ctx ended during the handshake and closed the connection.
		if err == nil {
			conn.Close()
		}
		nc.Close()
		return nil, fmt.Errorf("dial %s: %w", t.EnvironmentID, context.Cause(ctx))
	}
	if err != nil {
		nc.Close()
		if mismatch != nil {
			return nil, mismatch
		}
		return nil, fmt.Errorf("dial %s: %w", t.EnvironmentID, err)
	}
	_ = nc.SetDeadline(time.Time{})
	return ssh.NewClient(conn, chans, reqs), nil
}

package gitforge

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
)

// SSH is a real OpenSSH sshd on 127.0.0.1 serving bare repositories over SSH to root, for one
// authorized public key (it needs root, sshd and ssh-keygen).
type SSH struct {
	Port string
	// HostKey is the host key's public half, "TYPE BASE64".
	HostKey string

	cmd  *exec.Cmd
	mu   sync.Mutex
	log  strings.Builder
	done chan struct{}
}

// Keygen makes an unencrypted ed25519 key pair at path (and path.pub) and returns the public key,
// "TYPE BASE64".
func Keygen(ctx context.Context, path string) (string, error) {
	if out, err := exec.CommandContext(ctx, "ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "", "-f", path).CombinedOutput(); err != nil {
		return "", fmt.Errorf("ssh-keygen: %w: %s", err, out)
	}
	b, err := os.ReadFile(path + ".pub")
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(b)), nil
}

// StartSSH runs sshd -D in dir (its host key, configuration and authorized_keys there) until
// Close, and returns once it listens.
func StartSSH(ctx context.Context, dir, authorized string) (*SSH, error) {
	if err := os.MkdirAll("/run/sshd", 0o755); err != nil { // sshd's privilege separation directory
		return nil, err
	}
	hostKey := filepath.Join(dir, "host_ed25519")
	pub, err := Keygen(ctx, hostKey)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "authorized_keys"), []byte(authorized+"\n"), 0o600); err != nil {
		return nil, err
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	_, port, _ := net.SplitHostPort(l.Addr().String())
	l.Close()
	cfg := filepath.Join(dir, "sshd_config")
	conf := strings.Join([]string{"ListenAddress 127.0.0.1:" + port, "HostKey " + hostKey, "AuthorizedKeysFile " + filepath.Join(dir, "authorized_keys"),
		"PidFile none", "StrictModes no", "UsePAM no", "PasswordAuthentication no", "KbdInteractiveAuthentication no",
		"PermitRootLogin prohibit-password", "AllowUsers root", "AllowAgentForwarding no", "LogLevel VERBOSE", ""}, "\n")
	if err := os.WriteFile(cfg, []byte(conf), 0o600); err != nil {
		return nil, err
	}
	s := &SSH{Port: port, HostKey: pub, cmd: exec.Command("/usr/sbin/sshd", "-D", "-e", "-f", cfg), done: make(chan struct{})}
	stderr, err := s.cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := s.cmd.Start(); err != nil {
		return nil, err
	}
	ready := make(chan struct{})
	go func() {
		defer close(s.done)
		sc := bufio.NewScanner(stderr)
		listening := false
		for sc.Scan() {
			s.mu.Lock()
			s.log.WriteString(sc.Text() + "\n")
			s.mu.Unlock()
			if !listening && strings.Contains(sc.Text(), "Server listening on") {
				listening = true
				close(ready)
			}
		}
	}()
	select {
	case <-ready:
		return s, nil
	case <-s.done:
		err = errors.New("sshd exited")
	case <-ctx.Done():
		err = ctx.Err()
	}
	s.Close()
	return nil, fmt.Errorf("sshd did not start listening: %w\n%s", err, s.Log())
}

// Log is what sshd reported so far.
func (s *SSH) Log() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.log.String()
}

// URL is the ssh:// URL of the bare repository at dir.
func (s *SSH) URL(dir string) string { return "ssh://root@127.0.0.1:" + s.Port + dir }

// KnownHost is the known_hosts line of the server's host key.
func (s *SSH) KnownHost() string { return "[127.0.0.1]:" + s.Port + " " + s.HostKey }

// Close stops sshd.
func (s *SSH) Close() {
	_ = s.cmd.Process.Kill()
	_ = s.cmd.Wait()
}

package publish

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/openclaw/cloudworkers/internal/untrusted"
	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"
)

// KindSSH is a forge credential for SSH: an unencrypted private key and the one host key the
// forge must present (a known_hosts line, or the key's SHA256 fingerprint).
const KindSSH = "git-ssh"

// NewSSHCredential checks an SSH private key and its host key pin (exactly one of knownHost, a
// known_hosts line or "TYPE BASE64", and fingerprint, "SHA256:…") and returns the credential.
// No error quotes the key.
func NewSSHCredential(privateKey, username, knownHost, fingerprint string) (GitCredential, error) {
	c := GitCredential{Kind: KindSSH, Username: username, PrivateKey: privateKey, KnownHost: strings.TrimSpace(knownHost), HostKeyFingerprint: strings.TrimSpace(fingerprint)}
	return c, c.checkSSH()
}

var fingerprintRE = regexp.MustCompile(`^SHA256:[A-Za-z0-9+/]{43}$`)

var userRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)

func (c GitCredential) checkSSH() error {
	if c.PrivateKey == "" {
		return errors.New("has no SSH private key")
	}
	if _, err := ssh.ParseRawPrivateKey([]byte(c.PrivateKey)); err != nil {
		var pm *ssh.PassphraseMissingError
		if errors.As(err, &pm) {
			return errors.New("is an SSH private key with a passphrase: publishing needs an unencrypted key (one made for this forge only)")
		}
		return errors.New("is not an SSH private key (PEM or OpenSSH format)")
	}
	if c.Username != "" && !userRE.MatchString(c.Username) {
		return fmt.Errorf("has SSH username %q: letters, digits, '.', '_' or '-'", c.Username)
	}
	switch {
	case c.KnownHost == "" && c.HostKeyFingerprint == "":
		return errors.New("pins no host key (give a known_hosts line or a SHA256 fingerprint of the forge's host key)")
	case c.KnownHost != "" && c.HostKeyFingerprint != "":
		return errors.New("pins a host key twice: give a known_hosts line or a fingerprint, not both")
	case c.HostKeyFingerprint != "":
		if !fingerprintRE.MatchString(c.HostKeyFingerprint) {
			return fmt.Errorf("has host key fingerprint %q: want SHA256:<43 base64 characters>, as ssh-keygen -lf prints", c.HostKeyFingerprint)
		}
	default:
		if _, _, err := c.pinnedKey(); err != nil {
			return err
		}
	}
	return nil
}

// pinnedKey parses KnownHost: a known_hosts line (its host patterns kept) or a bare public key.
func (c GitCredential) pinnedKey() (ssh.PublicKey, []string, error) {
	if strings.ContainsAny(c.KnownHost, "\n\r") {
		return nil, nil, errors.New("pins more than one known_hosts line (give exactly the forge's one)")
	}
	marker, hosts, k, _, _, err := ssh.ParseKnownHosts([]byte(c.KnownHost))
	if err == nil && marker != "" {
		return nil, nil, fmt.Errorf("has a @%s known_hosts line: pin the forge's host key itself", marker)
	}
	if err == nil {
		return k, hosts, nil
	}
	if k, _, opts, _, err := ssh.ParseAuthorizedKey([]byte(c.KnownHost)); err == nil && len(opts) == 0 {
		return k, nil, nil
	}
	return nil, nil, errors.New("has a host key pin that is not a known_hosts line (HOST TYPE BASE64) or a public key (TYPE BASE64)")
}

// sshRemote is the endpoint of an ssh:// or scp-like (user@host:path) remote URL.
type sshRemote struct {
	user, host, port string
}

func (r sshRemote) addr() string { return net.JoinHostPort(r.host, r.port) }

var scpRE = regexp.MustCompile(`^(?:([A-Za-z0-9][A-Za-z0-9._-]*)@)?([A-Za-z0-9][A-Za-z0-9.-]*|\[[0-9A-Fa-f:.]+\]):([^/:].*|/.+)$`)

// parseSSHRemote reads an SSH remote URL; ok is false for a URL that is not one.
func parseSSHRemote(s string) (sshRemote, bool) {
	if strings.HasPrefix(s, "ssh://") || strings.HasPrefix(s, "git+ssh://") || strings.HasPrefix(s, "ssh+git://") {
		rest := s[strings.Index(s, "://")+3:]
		authority, _, _ := strings.Cut(rest, "/")
		if authority == "" || !strings.Contains(rest, "/") {
			return sshRemote{}, false
		}
		r := sshRemote{port: "22"}
		if u, h, ok := strings.Cut(authority, "@"); ok {
			r.user, authority = u, h
		}
		if h, p, err := net.SplitHostPort(authority); err == nil {
			r.host, r.port = h, p
		} else {
			r.host = strings.Trim(authority, "[]")
		}
		if n, err := strconv.Atoi(r.port); err != nil || n < 1 || n > 65535 {
			return sshRemote{}, false
		}
		if r.host == "" || strings.HasPrefix(r.host, "-") || (r.user != "" && !userRE.MatchString(r.user)) {
			return sshRemote{}, false
		}
		return r, true
	}
	if strings.Contains(s, "://") {
		return sshRemote{}, false
	}
	m := scpRE.FindStringSubmatch(s)
	if m == nil {
		return sshRemote{}, false
	}
	return sshRemote{user: m[1], host: strings.Trim(m[2], "[]"), port: "22"}, true
}

// sshSession is the files of one SSH push: the key and the pinned host key, each 0600 in a
// private directory that is removed when the push is done.
type sshSession struct {
	dir, key, knownHosts, fingerprint string
}

// prepareSSH writes the key and the known_hosts file holding only the pin (resolving a
// fingerprint pin to the key the forge presents, when its fingerprint is the pinned one) for
// the remote r. The caller removes dir.
func prepareSSH(ctx context.Context, tmp string, c GitCredential, r sshRemote) (*sshSession, error) {
	pin, hosts, fp := ssh.PublicKey(nil), []string(nil), c.HostKeyFingerprint
	if c.KnownHost != "" {
		var err error
		if pin, hosts, err = c.pinnedKey(); err != nil {
			return nil, err
		}
		fp = ssh.FingerprintSHA256(pin)
	}
	line := ""
	if pin != nil && len(hosts) > 0 {
		line = c.KnownHost
	}
	dir, err := os.MkdirTemp(tmp, "openclaw-publish-ssh-")
	if err != nil {
		return nil, err
	}
	s := &sshSession{dir: dir, key: filepath.Join(dir, "key"), knownHosts: filepath.Join(dir, "known_hosts"), fingerprint: fp}
	fail := func(err error) (*sshSession, error) {
		os.RemoveAll(dir)
		return nil, err
	}
	if line != "" {
		// the pin names its hosts: it must name the remote's
		if err := os.WriteFile(s.knownHosts, []byte(line+"\n"), 0o600); err != nil {
			return fail(err)
		}
		cb, err := knownhosts.New(s.knownHosts)
		if err != nil {
			return fail(err)
		}
		var ke *knownhosts.KeyError
		if err := cb(r.addr(), &net.TCPAddr{IP: net.IPv4zero}, pin); errors.As(err, &ke) && len(ke.Want) == 0 {
			return fail(fmt.Errorf("the credential's pinned host key is for %s, not for the remote's host %s", strings.Join(hosts, ","), knownhosts.Normalize(r.addr())))
		}
	} else {
		if pin == nil {
			if pin, err = hostKeyWithFingerprint(ctx, r.addr(), fp); err != nil {
				return fail(err)
			}
		}
		if err := os.WriteFile(s.knownHosts, []byte(knownhosts.Line([]string{knownhosts.Normalize(r.addr())}, pin)+"\n"), 0o600); err != nil {
			return fail(err)
		}
	}
	key := c.PrivateKey
	if !strings.HasSuffix(key, "\n") {
		key += "\n" // OpenSSH reads no key without its final newline
	}
	if err := os.WriteFile(s.key, []byte(key), 0o600); err != nil {
		return fail(err)
	}
	return s, nil
}

// command is GIT_SSH_COMMAND: that key only, that host key only, no agent, no configuration
// file (the user's or the system's), no prompt, no multiplexing, no forwarding.
func (s *sshSession) command(r sshRemote, user string) string {
	q := untrusted.Quote
	args := []string{"ssh", "-F", "/dev/null", "-i", q(s.key)}
	if r.user == "" {
		args = append(args, "-o", "User="+user) // the URL names none: the credential's (default git)
	}
	return strings.Join(append(args,
		"-o", "IdentitiesOnly=yes", "-o", "IdentityAgent=none",
		"-o", "StrictHostKeyChecking=yes", "-o", "UserKnownHostsFile="+q(s.knownHosts), "-o", "GlobalKnownHostsFile=/dev/null",
		"-o", "CheckHostIP=no", "-o", "UpdateHostKeys=no", "-o", "BatchMode=yes", "-o", "PasswordAuthentication=no",
		"-o", "KbdInteractiveAuthentication=no", "-o", "ControlMaster=no", "-o", "ControlPath=none",
		"-o", "ForwardAgent=no", "-o", "ForwardX11=no", "-o", "ClearAllForwardings=yes", "-o", "PermitLocalCommand=no",
		"-o", "ProxyCommand=none", "-o", "ProxyJump=none", "-o", "ConnectTimeout=30"), " ")
}

// HostKeyError refuses a push to a forge whose host key is not the pinned one.
type HostKeyError struct {
	Host, Fingerprint string
}

func (e *HostKeyError) Error() string {
	return fmt.Sprintf("the host key of %s is not the credential's pinned host key (%s): refused, nothing was pushed", e.Host, e.Fingerprint)
}

// hostKeyAlgorithms are tried, one per handshake, to find the host key with a pinned fingerprint.
var hostKeyAlgorithms = []string{ssh.KeyAlgoED25519, ssh.KeyAlgoECDSA256, ssh.KeyAlgoECDSA384, ssh.KeyAlgoECDSA521, ssh.KeyAlgoRSASHA512}

// hostKeyWithFingerprint asks the forge for its host keys (a handshake per algorithm, closed at
// the host key: no authentication happens) and returns the one whose SHA256 fingerprint is fp.
// ssh then makes the forge prove it holds that key.
func hostKeyWithFingerprint(ctx context.Context, addr, fp string) (ssh.PublicKey, error) {
	var found ssh.PublicKey
	errStop := errors.New("host key seen")
	reached := false
	for _, alg := range hostKeyAlgorithms {
		d := net.Dialer{Timeout: 30 * time.Second}
		conn, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return nil, fmt.Errorf("reach %s for its host key: %w", addr, err)
		}
		reached = true
		if dl, ok := ctx.Deadline(); ok {
			_ = conn.SetDeadline(dl)
		} else {
			_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
		}
		cfg := &ssh.ClientConfig{User: "openclaw", HostKeyAlgorithms: []string{alg}, Timeout: 30 * time.Second,
			HostKeyCallback: func(_ string, _ net.Addr, k ssh.PublicKey) error {
				if ssh.FingerprintSHA256(k) == fp {
					found = k
				}
				return errStop
			}}
		_, _, _, _ = ssh.NewClientConn(conn, addr, cfg)
		conn.Close()
		if found != nil {
			return found, nil
		}
	}
	if !reached {
		return nil, fmt.Errorf("reach %s for its host key", addr)
	}
	return nil, &HostKeyError{Host: knownhosts.Normalize(addr), Fingerprint: fp}
}

// hostKeyRefused reports whether ssh's output says the host key check failed.
func hostKeyRefused(stderr string) bool {
	return strings.Contains(stderr, "Host key verification failed") || strings.Contains(stderr, "REMOTE HOST IDENTIFICATION HAS CHANGED") ||
		strings.Contains(stderr, "No ") && strings.Contains(stderr, "host key is known for")
}

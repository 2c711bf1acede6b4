package local

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/user"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/openclaw/cloudworkers/internal/atomicfile"
)

// Names inside a box directory.
const (
	metaDirName       = ".localbox"
	stateFileName     = "state.json"
	lockFileName      = "lock"
	hostKeyFileName   = "ssh_host_ed25519_key"
	clientKeyFileName = "client_ed25519"
	logFileName       = "box.log"
)

// maxStateSize bounds state.json: the box directory is writable by whatever runs on the box.
const maxStateSize = 64 << 10

var leaseIDPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,79}$`)

// ValidLeaseID reports whether id can name a box directory.
func ValidLeaseID(id string) bool { return leaseIDPattern.MatchString(id) }

// State is what a running box publishes in <box>/.localbox/state.json.
type State struct {
	LeaseID string `json:"leaseId"`
	PID     int    `json:"pid"`
	Host    string `json:"host"`
	Port    int    `json:"port"`
	User    string `json:"user"`
	// HostKey is the box's host public key in authorized_keys format.
	HostKey       string            `json:"hostKey"`
	ClientKeyPath string            `json:"clientKeyPath"`
	Labels        map[string]string `json:"labels,omitempty"`
	StartedAt     time.Time         `json:"startedAt"`
}

func metaDir(boxDir string) string     { return filepath.Join(boxDir, metaDirName) }
func statePath(boxDir string) string   { return filepath.Join(boxDir, metaDirName, stateFileName) }
func lockPath(boxDir string) string    { return filepath.Join(boxDir, metaDirName, lockFileName) }
func hostKeyPath(boxDir string) string { return filepath.Join(boxDir, metaDirName, hostKeyFileName) }
func clientKeyPath(boxDir string) string {
	return filepath.Join(boxDir, metaDirName, clientKeyFileName)
}
func logPath(boxDir string) string          { return filepath.Join(boxDir, metaDirName, logFileName) }
func clientPubKeyPath(boxDir string) string { return clientKeyPath(boxDir) + ".pub" }

// ReadState reads and checks the state file of the box in boxDir.
func ReadState(boxDir string) (State, error) {
	var st State
	f, err := os.Open(statePath(boxDir))
	if err != nil {
		return st, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxStateSize+1))
	if err != nil {
		return st, fmt.Errorf("read box state: %w", err)
	}
	n := len(b)
	if n > maxStateSize {
		return st, fmt.Errorf("box state %s is larger than %d bytes", statePath(boxDir), maxStateSize)
	}
	if err := json.Unmarshal(b[:n], &st); err != nil {
		return st, fmt.Errorf("decode box state %s: %w", statePath(boxDir), err)
	}
	switch {
	case st.PID <= 0:
		return st, fmt.Errorf("box state %s: invalid pid %d", statePath(boxDir), st.PID)
	case st.Port <= 0 || st.Port > 65535:
		return st, fmt.Errorf("box state %s: invalid port %d", statePath(boxDir), st.Port)
	case st.Host == "":
		return st, fmt.Errorf("box state %s: no host", statePath(boxDir))
	}
	if _, _, _, _, err := ssh.ParseAuthorizedKey([]byte(st.HostKey)); err != nil {
		return st, fmt.Errorf("box state %s: host key: %w", statePath(boxDir), err)
	}
	return st, nil
}

// loadOrCreateKey returns the ed25519 key stored at path, generating and storing one (0600) if
// there is none.
func loadOrCreateKey(path string) (ssh.Signer, error) {
	b, err := os.ReadFile(path)
	if err == nil {
		s, err := ssh.ParsePrivateKey(b)
		if err != nil {
			return nil, fmt.Errorf("parse key %s: %w", path, err)
		}
		return s, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, err
	}
	block, err := ssh.MarshalPrivateKey(priv, "")
	if err != nil {
		return nil, err
	}
	if err := atomicfile.Write(path, pem.EncodeToMemory(block), 0o600); err != nil {
		return nil, fmt.Errorf("write key %s: %w", path, err)
	}
	return ssh.NewSignerFromKey(priv)
}

// ensureClientKey makes sure the box has a client key pair and returns its public half.
func ensureClientKey(boxDir string) (ssh.PublicKey, error) {
	s, err := loadOrCreateKey(clientKeyPath(boxDir))
	if err != nil {
		return nil, err
	}
	pub := ssh.MarshalAuthorizedKey(s.PublicKey())
	if cur, err := os.ReadFile(clientPubKeyPath(boxDir)); err != nil || string(cur) != string(pub) {
		if err := atomicfile.Write(clientPubKeyPath(boxDir), pub, 0o644); err != nil {
			return nil, err
		}
	}
	return s.PublicKey(), nil
}

// prepareBoxDir creates the box directory and its metadata directory.
func prepareBoxDir(boxDir string) error {
	if err := os.MkdirAll(boxDir, 0o700); err != nil {
		return err
	}
	return os.MkdirAll(metaDir(boxDir), 0o700)
}

// authorizedKeyString renders k in authorized_keys format without the trailing newline.
func authorizedKeyString(k ssh.PublicKey) string {
	return strings.TrimSpace(string(ssh.MarshalAuthorizedKey(k)))
}

// boxLock is the advisory lock a live box holds for its whole life.
type boxLock struct{ f *os.File }

// acquireBoxLock takes the box lock, retrying briefly (a prober may hold it for an instant),
// and writes the pid into it.
func acquireBoxLock(boxDir string, wait time.Duration) (*boxLock, error) {
	f, err := os.OpenFile(lockPath(boxDir), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(wait)
	for {
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			break
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) || time.Now().After(deadline) {
			f.Close()
			if errors.Is(err, syscall.EWOULDBLOCK) {
				return nil, fmt.Errorf("box %s is already running", boxDir)
			}
			return nil, fmt.Errorf("lock box %s: %w", boxDir, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := f.Truncate(0); err != nil {
		f.Close()
		return nil, err
	}
	if _, err := f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0); err != nil {
		f.Close()
		return nil, err
	}
	_ = f.Sync()
	return &boxLock{f: f}, nil
}

func (l *boxLock) release() {
	_ = syscall.Flock(int(l.f.Fd()), syscall.LOCK_UN)
	_ = l.f.Close()
}

// LiveBoxes maps each box directory under boxesDir whose box process is alive (holds the box
// lock) to that process's pid (0 when not yet written).
func LiveBoxes(boxesDir string) map[string]int {
	out := map[string]int{}
	dirs, _ := filepath.Glob(filepath.Join(boxesDir, "*"))
	for _, dir := range dirs {
		if pid, alive, err := probeBox(dir); err == nil && alive {
			out[dir] = pid
		}
	}
	return out
}

// probeBox reports whether a box process holds the lock of boxDir, and the pid it wrote there
// (0 when not yet written).
func probeBox(boxDir string) (pid int, alive bool, err error) {
	f, err := os.Open(lockPath(boxDir))
	if errors.Is(err, fs.ErrNotExist) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, err
	}
	defer f.Close()
	err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
	if err == nil {
		_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		return 0, false, nil
	}
	if !errors.Is(err, syscall.EWOULDBLOCK) {
		return 0, false, fmt.Errorf("probe box %s: %w", boxDir, err)
	}
	b := make([]byte, 32)
	n, _ := f.ReadAt(b, 0)
	pid, _ = strconv.Atoi(strings.TrimSpace(string(b[:n])))
	return pid, true, nil
}

// currentUserName is the name the box accepts logins for and reports as USER.
func currentUserName() string {
	if u, err := user.Current(); err == nil && u.Username != "" {
		return u.Username
	}
	if u := os.Getenv("USER"); u != "" {
		return u
	}
	return "openclaw"
}

// ParseLabels turns "key=value" arguments into a label map.
func ParseLabels(args []string) (map[string]string, error) {
	out := make(map[string]string, len(args))
	for _, a := range args {
		k, v, ok := strings.Cut(a, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("label %q: want key=value", a)
		}
		out[k] = v
	}
	return out, nil
}

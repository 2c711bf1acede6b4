package gateway

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/openclaw/cloudworkers/internal/tokenfile"
)

// Lock is an exclusive lock on a data dir, held for the life of the gateway.
type Lock struct{ f *os.File }

// ErrLocked is returned when another gateway holds the data dir.
var ErrLocked = errors.New("data dir is in use by another gateway")

// LockDataDir takes the data dir's lock file or fails with ErrLocked naming the holder.
func LockDataDir(dir string) (*Lock, error) {
	path := filepath.Join(dir, "gateway.lock")
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		b, _ := os.ReadFile(path)
		f.Close()
		holder := strings.TrimSpace(string(b))
		if holder == "" {
			holder = "unknown"
		}
		return nil, fmt.Errorf("%w: %s is locked by pid %s (stop that gateway or use another --data-dir)", ErrLocked, dir, holder)
	}
	_ = f.Truncate(0)
	_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	return &Lock{f: f}, nil
}

// TightenDataDir makes the data dir 0700 and its database files (gateway.db, -wal, -shm) 0600
// when they allow more, and returns what it had to change: it holds the gateway's state,
// credentials' hashes and the key of the encrypted secrets.
func TightenDataDir(dir string) ([]string, error) {
	var changed []string
	tighten := func(p string, mode os.FileMode) error {
		fi, err := os.Lstat(p)
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		if fi.Mode()&os.ModeSymlink != 0 || fi.Mode().Perm() == mode || fi.Mode().Perm()&^mode == 0 {
			return nil
		}
		if err := os.Chmod(p, mode); err != nil {
			return fmt.Errorf("data dir: chmod %s to %#o: %w", p, mode, err)
		}
		changed = append(changed, fmt.Sprintf("%s (%#o → %#o)", filepath.Base(p), fi.Mode().Perm(), mode))
		return nil
	}
	if err := tighten(dir, 0o700); err != nil {
		return changed, err
	}
	for _, name := range []string{"gateway.db", "gateway.db-wal", "gateway.db-shm", TokenFile, "occ.token"} {
		if err := tighten(filepath.Join(dir, name), 0o600); err != nil {
			return changed, err
		}
	}
	return changed, nil
}

// Release drops the lock.
func (l *Lock) Release() error {
	if l == nil || l.f == nil {
		return nil
	}
	_ = l.f.Truncate(0)
	err := l.f.Close()
	l.f = nil
	return err
}

// TokenFile is the name of the API token file inside the data dir.
const TokenFile = "gateway.token"

// EnsureToken returns the API bearer token, generating it (mode 0600) on first start.
func EnsureToken(dir string) (string, error) {
	return tokenfile.Ensure(filepath.Join(dir, TokenFile), "", "delete it to generate a new one")
}

// ReadToken reads the token of a data dir (for CLI clients).
func ReadToken(dir string) (string, error) {
	b, err := os.ReadFile(filepath.Join(dir, TokenFile))
	if err != nil {
		return "", fmt.Errorf("read API token: %w (is a gateway using --data-dir %s? pass --token otherwise)", err, dir)
	}
	return strings.TrimSpace(string(b)), nil
}

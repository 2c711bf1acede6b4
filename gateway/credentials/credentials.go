// Package credentials stores provider credentials (API keys) encrypted at rest in the gateway database.
package credentials

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"

	"github.com/openclaw/cloudworkers/gateway/store"
	"github.com/openclaw/cloudworkers/internal/atomicfile"
	"github.com/openclaw/cloudworkers/internal/clock"
	"github.com/openclaw/cloudworkers/providers"
)

// KeyFile is the name of the sealing key inside the data dir (the default layout).
const KeyFile = "credentials.key"

// Settings are the gateway config's credentials section.
type Settings struct {
	// KeyFile is the absolute path of the sealing key; empty: <dataDir>/credentials.key. A key
	// outside the data dir (another volume, a secrets mount) leaves a copy of the data dir with
	// ciphertext only.
	KeyFile string `yaml:"keyFile"`
}

// Validate names a bad setting: keyFile must be absolute (a relative path would depend on the
// directory the gateway was started from).
func (st Settings) Validate() error {
	if st.KeyFile != "" && !filepath.IsAbs(st.KeyFile) {
		return providers.Fieldf("credentials.keyFile", "must be an absolute path, got %q", st.KeyFile)
	}
	return nil
}

// KeyPath is the sealing key's path for a gateway on dataDir.
func (st Settings) KeyPath(dataDir string) string {
	if st.KeyFile != "" {
		return filepath.Clean(st.KeyFile)
	}
	return filepath.Join(dataDir, KeyFile)
}

// MaxValueBytes bounds a credential value.
const MaxValueBytes = 16 << 10

// ErrNotFound is returned for a credential name that is not set. It wraps store.ErrNotFound.
var ErrNotFound = fmt.Errorf("credential %w", store.ErrNotFound)

var namePattern = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9._-]{0,62}$`)

// ValidName reports whether name is a valid credential name.
func ValidName(name string) bool { return namePattern.MatchString(name) }

// Store keeps named secrets sealed with AES-256-GCM. Values leave it only through Get, which is
// for gateway-internal use (provider adapters); no API returns them and they are never logged.
type Store struct {
	db   *store.DB
	aead cipher.AEAD
	// Clock dates the rows; the real clock when nil.
	Clock clock.Clock
}

// Open returns the store of a gateway, loading the sealing key from <dataDir>/credentials.key
// and generating it (mode 0600, written temp-then-fsync-then-rename) on first use.
func Open(db *store.DB, dataDir string) (*Store, error) {
	return OpenKey(db, filepath.Join(dataDir, KeyFile))
}

// OpenKey is Open with the sealing key at keyPath (absolute; its directory is created 0700 when
// missing, the key 0600 on first use). An error names the path.
func OpenKey(db *store.DB, keyPath string) (*Store, error) {
	if !filepath.IsAbs(keyPath) {
		return nil, fmt.Errorf("credentials key %q: must be an absolute path", keyPath)
	}
	key, err := loadKey(keyPath)
	if err != nil {
		return nil, err
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, fmt.Errorf("credentials key: %w", err)
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, fmt.Errorf("credentials key: %w", err)
	}
	return &Store{db: db, aead: aead}, nil
}

func loadKey(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	switch {
	case err == nil:
		if len(b) != 32 {
			return nil, fmt.Errorf("credentials key %s has %d bytes, want 32 (restore it from backup; without it stored credentials cannot be read)", path, len(b))
		}
		if fi, err := os.Stat(path); err == nil && fi.Mode().Perm()&0o077 != 0 {
			if err := os.Chmod(path, 0o600); err != nil {
				return nil, fmt.Errorf("credentials key: %w", err)
			}
		}
		return b, nil
	case !errors.Is(err, os.ErrNotExist):
		return nil, fmt.Errorf("read credentials key: %w", err)
	}
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("write credentials key: %w", err)
	}
	if err := atomicfile.Write(path, key, 0o600); err != nil {
		return nil, fmt.Errorf("write credentials key: %w", err)
	}
	return key, nil
}

func (s *Store) seal(name, value string) ([]byte, error) {
	nonce := make([]byte, s.aead.NonceSize(), s.aead.NonceSize()+len(value)+s.aead.Overhead())
	if _, err := rand.Read(nonce); err != nil {
		return nil, err
	}
	return s.aead.Seal(nonce, nonce, []byte(value), []byte(name)), nil
}

func (s *Store) open(name string, sealed []byte) (string, error) {
	n := s.aead.NonceSize()
	if len(sealed) < n+s.aead.Overhead() {
		return "", fmt.Errorf("credential %q: sealed value is truncated", name)
	}
	plain, err := s.aead.Open(nil, sealed[:n], sealed[n:], []byte(name))
	if err != nil {
		return "", fmt.Errorf("credential %q: cannot decrypt (was %s replaced?)", name, KeyFile)
	}
	return string(plain), nil
}

// Set stores (or replaces) the value of name.
func (s *Store) Set(ctx context.Context, name, value string) error {
	switch {
	case !ValidName(name):
		return providers.Fieldf("name", "%q must be letters, digits, '.', '_' or '-' (at most 63)", name)
	case value == "":
		return providers.Fieldf("value", "must not be empty")
	case len(value) > MaxValueBytes:
		return providers.Fieldf("value", "must be at most %d bytes", MaxValueBytes)
	}
	sealed, err := s.seal(name, value)
	if err != nil {
		return err
	}
	return s.db.InTx(ctx, func(tx *sql.Tx) error {
		now := store.FormatTime(clock.Or(s.Clock).Now())
		if _, err := tx.ExecContext(ctx, `INSERT INTO credentials(name, sealed, created_at, updated_at) VALUES(?,?,?,?)
			ON CONFLICT(name) DO UPDATE SET sealed = excluded.sealed, updated_at = excluded.updated_at`,
			name, sealed, now, now); err != nil {
			return fmt.Errorf("set credential %s: %w", name, err)
		}
		return store.Audit(ctx, tx, clock.Or(s.Clock).Now(), "credential.set", "", name)
	})
}

// Get returns the value of name, or an error wrapping ErrNotFound. It is for the gateway's own
// use (provider adapters): never return the value from an API, log it or put it in an error.
func (s *Store) Get(ctx context.Context, name string) (string, error) {
	var sealed []byte
	err := s.db.R.QueryRowContext(ctx, `SELECT sealed FROM credentials WHERE name = ?`, name).Scan(&sealed)
	if errors.Is(err, sql.ErrNoRows) {
		return "", fmt.Errorf("%w: %q (set it with `openclaw credential set %s`)", ErrNotFound, name, name)
	}
	if err != nil {
		return "", fmt.Errorf("get credential %s: %w", name, err)
	}
	return s.open(name, sealed)
}

// List returns the names of the stored credentials, sorted.
func (s *Store) List(ctx context.Context) ([]string, error) {
	rows, err := s.db.R.QueryContext(ctx, `SELECT name FROM credentials ORDER BY name`)
	if err != nil {
		return nil, fmt.Errorf("list credentials: %w", err)
	}
	defer rows.Close()
	names := []string{}
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			return nil, err
		}
		names = append(names, n)
	}
	return names, rows.Err()
}

// Delete removes name; deleting a name that is not set returns an error wrapping ErrNotFound.
func (s *Store) Delete(ctx context.Context, name string) error {
	return s.db.InTx(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `DELETE FROM credentials WHERE name = ?`, name)
		if err != nil {
			return fmt.Errorf("delete credential %s: %w", name, err)
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return fmt.Errorf("%w: %q", ErrNotFound, name)
		}
		return store.Audit(ctx, tx, clock.Or(s.Clock).Now(), "credential.delete", "", name)
	})
}

// Values returns every stored credential's value by name, for the gateway's own secret scan of
// what workers bring back (which looks for them, and reports names only). Never return, log or
// store what it gives.
func (s *Store) Values(ctx context.Context) (map[string]string, error) {
	rows, err := s.db.R.QueryContext(ctx, `SELECT name, sealed FROM credentials`)
	if err != nil {
		return nil, fmt.Errorf("read credentials: %w", err)
	}
	defer rows.Close()
	out := map[string]string{}
	for rows.Next() {
		var name string
		var sealed []byte
		if err := rows.Scan(&name, &sealed); err != nil {
			return nil, err
		}
		v, err := s.open(name, sealed)
		if err != nil {
			return nil, err
		}
		out[name] = v
	}
	return out, rows.Err()
}

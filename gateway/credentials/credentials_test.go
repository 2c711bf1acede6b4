package credentials_test

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/openclaw/cloudworkers/gateway/credentials"
	"github.com/openclaw/cloudworkers/gateway/credentials/credentialstest"
	"github.com/openclaw/cloudworkers/gateway/store"
	"github.com/openclaw/cloudworkers/internal/testrig/testenv"
)

func TestSetGetListDelete(t *testing.T) {
	ctx := testenv.Context(t, 30*time.Second)
	dir := t.TempDir()
	s, _ := credentialstest.Open(t, dir)

	if err := s.Set(ctx, "anthropic", "sk-ant-first"); err != nil {
		t.Fatal(err)
	}
	if err := s.Set(ctx, "openai", "sk-openai"); err != nil {
		t.Fatal(err)
	}
	if err := s.Set(ctx, "anthropic", "sk-ant-second"); err != nil { // replace
		t.Fatal(err)
	}
	got, err := s.Get(ctx, "anthropic")
	if err != nil || got != "sk-ant-second" {
		t.Fatalf("Get = %q, %v", got, err)
	}
	names, err := s.List(ctx)
	if err != nil || !slices.Equal(names, []string{"anthropic", "openai"}) {
		t.Fatalf("List = %v, %v", names, err)
	}
	if err := s.Delete(ctx, "openai"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, "openai"); !errors.Is(err, credentials.ErrNotFound) || !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("Get after delete: %v", err)
	}
	if err := s.Delete(ctx, "openai"); !errors.Is(err, credentials.ErrNotFound) {
		t.Fatalf("second Delete: %v", err)
	}

	fi, err := os.Stat(filepath.Join(dir, credentials.KeyFile))
	if err != nil || fi.Mode().Perm() != 0o600 || fi.Size() != 32 {
		t.Fatalf("key file: %v %v", fi, err)
	}
	// A restarted gateway reads the same values with the same key.
	s2, err := credentials.Open(mustDB(t, dir), dir)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := s2.Get(ctx, "anthropic"); err != nil || got != "sk-ant-second" {
		t.Fatalf("after reopen Get = %q, %v", got, err)
	}
}

func mustDB(t *testing.T, dir string) *store.DB {
	t.Helper()
	db, err := store.Open(testenv.Context(t, 30*time.Second), filepath.Join(dir, "gateway.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func TestValidation(t *testing.T) {
	ctx := testenv.Context(t, 30*time.Second)
	s, _ := credentialstest.Open(t, t.TempDir())
	for _, tc := range []struct{ name, value string }{
		{"", "v"}, {"has space", "v"}, {"../x", "v"}, {"ok", ""}, {"big", string(make([]byte, credentials.MaxValueBytes+1))},
	} {
		if err := s.Set(ctx, tc.name, tc.value); err == nil {
			t.Errorf("Set(%q, %d bytes) succeeded", tc.name, len(tc.value))
		}
	}
}

func TestValueNeverOnDiskInClear(t *testing.T) {
	ctx := testenv.Context(t, 30*time.Second)
	dir := t.TempDir()
	s, db := credentialstest.Open(t, dir)
	const secret = "sk-live-5ecret-VALUE-that-must-not-leak"
	if err := s.Set(ctx, "anthropic", secret); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, "anthropic"); err != nil {
		t.Fatal(err)
	}
	files, _ := filepath.Glob(filepath.Join(dir, "gateway.db*"))
	if !slices.Contains(files, db.Path()+"-wal") {
		t.Fatalf("expected a WAL file to check, have %v", files)
	}
	check := func() {
		t.Helper()
		files, _ := filepath.Glob(filepath.Join(dir, "*"))
		for _, f := range files {
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			if bytes.Contains(b, []byte(secret)) {
				t.Errorf("%s contains the credential value in clear", filepath.Base(f))
			}
		}
	}
	check()
	// After a checkpoint the main file holds the row too.
	if _, err := db.W.ExecContext(ctx, `PRAGMA wal_checkpoint(TRUNCATE)`); err != nil {
		t.Fatal(err)
	}
	check()
	rows, err := db.ListAudit(ctx, "", 100)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rows {
		if bytes.Contains([]byte(r.Detail), []byte(secret)) {
			t.Errorf("audit row %d contains the value", r.ID)
		}
	}
}

func TestWrongKeyOrMovedValueFails(t *testing.T) {
	ctx := testenv.Context(t, 30*time.Second)
	dir := t.TempDir()
	s, db := credentialstest.Open(t, dir)
	if err := s.Set(ctx, "a", "secret-a"); err != nil {
		t.Fatal(err)
	}
	// A sealed value copied under another name does not open (the name is authenticated).
	if _, err := db.W.ExecContext(ctx, `INSERT INTO credentials(name, sealed, created_at, updated_at)
		SELECT 'b', sealed, created_at, updated_at FROM credentials WHERE name = 'a'`); err != nil {
		t.Fatal(err)
	}
	if v, err := s.Get(ctx, "b"); err == nil {
		t.Fatalf("moved value opened: %q", v)
	}
	// Another key cannot read the values, and the error does not contain them.
	if err := os.WriteFile(filepath.Join(dir, credentials.KeyFile), bytes.Repeat([]byte{7}, 32), 0o600); err != nil {
		t.Fatal(err)
	}
	s2, err := credentials.Open(db, dir)
	if err != nil {
		t.Fatal(err)
	}
	_, err = s2.Get(ctx, "a")
	if err == nil || bytes.Contains([]byte(err.Error()), []byte("secret-a")) {
		t.Fatalf("Get with wrong key: %v", err)
	}
	// A short key file is refused.
	if err := os.WriteFile(filepath.Join(dir, credentials.KeyFile), []byte("short"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := credentials.Open(db, dir); err == nil {
		t.Fatal("short key accepted")
	}
}

// TestKeyFileOutsideDataDir: with credentials.keyFile set, the key is created (0600, its
// directory 0700) at that path, the data dir holds no key, a reopened store reads the values
// back; a relative keyFile is refused naming the key, an unreadable one names its path.
func TestKeyFileOutsideDataDir(t *testing.T) {
	ctx := testenv.Context(t, 30*time.Second)
	dataDir, secrets := t.TempDir(), t.TempDir()
	keyPath := filepath.Join(secrets, "openclaw", "credentials.key")
	st := credentials.Settings{KeyFile: keyPath}
	if err := st.Validate(); err != nil {
		t.Fatal(err)
	}
	db := mustDB(t, dataDir)
	s, err := credentials.OpenKey(db, st.KeyPath(dataDir))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Set(ctx, "anthropic", "sk-outside"); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(keyPath); err != nil || fi.Mode().Perm() != 0o600 || fi.Size() != 32 {
		t.Fatalf("key file: %v %v", fi, err)
	}
	if fi, err := os.Stat(filepath.Dir(keyPath)); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("key dir: %v %v", fi, err)
	}
	if _, err := os.Stat(filepath.Join(dataDir, credentials.KeyFile)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("data dir holds a key: %v", err)
	}
	s2, err := credentials.OpenKey(db, keyPath)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := s2.Get(ctx, "anthropic"); err != nil || got != "sk-outside" {
		t.Fatalf("after reopen Get = %q, %v", got, err)
	}
	// The default layout's store (key in the data dir) is another key: it cannot read them.
	s3, err := credentials.Open(db, dataDir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s3.Get(ctx, "anthropic"); err == nil {
		t.Fatal("value opened with the data dir's key")
	}

	cases := []struct {
		name string
		st   credentials.Settings
		want string
	}{
		{"unset is the data dir's key", credentials.Settings{}, ""},
		{"relative", credentials.Settings{KeyFile: "keys/credentials.key"}, "credentials.keyFile: must be an absolute path"},
		{"dot relative", credentials.Settings{KeyFile: "./credentials.key"}, "credentials.keyFile"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := c.st.Validate()
			if c.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				if got := c.st.KeyPath(dataDir); got != filepath.Join(dataDir, credentials.KeyFile) {
					t.Fatalf("KeyPath = %s", got)
				}
				return
			}
			if err == nil || !bytes.Contains([]byte(err.Error()), []byte(c.want)) {
				t.Fatalf("Validate = %v, want %q", err, c.want)
			}
		})
	}
	// A key path that cannot be read (here: a directory) is refused, naming it.
	if _, err := credentials.OpenKey(db, secrets); err == nil || !bytes.Contains([]byte(err.Error()), []byte(secrets)) {
		t.Fatalf("OpenKey(directory) = %v", err)
	}
	if _, err := credentials.OpenKey(db, "credentials.key"); err == nil {
		t.Fatal("relative key path accepted")
	}
}

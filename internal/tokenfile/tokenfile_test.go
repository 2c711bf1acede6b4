package tokenfile

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestEnsureWritesOnceAndKeeps(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.token")
	tok, err := Ensure(path, "p_", "rotate it")
	if err != nil || !strings.HasPrefix(tok, "p_") || len(tok) != len("p_")+64 {
		t.Fatalf("Ensure = %q, %v; want p_ and 64 hex digits", tok, err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("token file: %v %v, want mode 0600", fi, err)
	}
	if again, err := Ensure(path, "p_", "rotate it"); err != nil || again != tok {
		t.Fatalf("second Ensure = %q, %v; want the same token %q", again, err, tok)
	}
}

func TestEnsureTightensTheMode(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.token")
	if err := os.WriteFile(path, []byte(strings.Repeat("a", MinLen)+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if tok, err := Ensure(path, "", "rotate it"); err != nil || tok != strings.Repeat("a", MinLen) {
		t.Fatalf("Ensure = %q, %v", tok, err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("token file: %v %v, want mode 0600", fi, err)
	}
}

func TestReadRefusesAShortTokenAndSaysTheFix(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.token")
	if _, err := Read(path, "rotate it"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Read of a missing file: %v, want os.ErrNotExist", err)
	}
	if err := os.WriteFile(path, []byte("short\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Read(path, "rotate it"); err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "rotate it") {
		t.Fatalf("Read of a short token: %v, want an error naming the file and the fix", err)
	}
	if _, err := Ensure(path, "", "rotate it"); err == nil {
		t.Fatal("Ensure accepted a short token")
	}
}

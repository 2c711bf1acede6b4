package dirwatch

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/openclaw/cloudworkers/internal/testrig/testenv"
)

func TestGoneOnceTheDirectoryIsRemoved(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "box")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	ctx := testenv.Context(t, 30*time.Second)
	done := make(chan bool, 1)
	go func() { done <- Gone(ctx, dir, time.Millisecond) }()
	if err := os.Remove(dir); err != nil {
		t.Fatal(err)
	}
	if !<-done {
		t.Fatal("Gone returned false for a removed directory before its context ended")
	}
}

func TestNotGoneWhileTheDirectoryExists(t *testing.T) {
	dir := t.TempDir()
	// checked every millisecond until the context ends 50ms later
	ctx, cancel := context.WithTimeout(testenv.Context(t, 30*time.Second), 50*time.Millisecond)
	defer cancel()
	if Gone(ctx, dir, time.Millisecond) {
		t.Fatal("Gone returned true for a directory that exists")
	}
}

package tools

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// newTestSet returns a Set over a fresh workspace, closed at the end of the test.
func newTestSet(t *testing.T, mod func(*Config)) (*Set, string) {
	t.Helper()
	ws := t.TempDir()
	cfg := Config{Workspace: ws}
	if mod != nil {
		mod(&cfg)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	s := NewSet(cfg)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := s.Close(ctx); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return s, ws
}

func runTool(t *testing.T, s *Set, name string, args any) Result {
	t.Helper()
	var raw json.RawMessage
	switch a := args.(type) {
	case string:
		raw = json.RawMessage(a)
	default:
		b, err := json.Marshal(a)
		if err != nil {
			t.Fatal(err)
		}
		raw = b
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	return s.Run(ctx, name, raw)
}

func readFile(t *testing.T, root, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(name)))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func mustOK(t *testing.T, r Result) string {
	t.Helper()
	if r.IsError {
		t.Fatalf("unexpected error result: %s", r.Text())
	}
	return r.Text()
}

func mustErr(t *testing.T, r Result, wants ...string) string {
	t.Helper()
	if !r.IsError {
		t.Fatalf("expected an error result, got: %s", r.Text())
	}
	for _, w := range wants {
		if !strings.Contains(r.Text(), w) {
			t.Fatalf("error %q does not mention %q", r.Text(), w)
		}
	}
	return r.Text()
}

func details(t *testing.T, r Result) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(r.Details, &m); err != nil {
		t.Fatalf("details %s: %v", r.Details, err)
	}
	return m
}

func numberedLines(from, to int) string {
	var b strings.Builder
	for i := from; i <= to; i++ {
		b.WriteString("line ")
		b.WriteString(itoa(i))
		b.WriteByte('\n')
	}
	return b.String()
}

func itoa(i int) string { return strconv.Itoa(i) }

func jsonUnmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }

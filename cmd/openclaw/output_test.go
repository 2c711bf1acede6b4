package main

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestBadOutputRefusedBeforeAnyRequest: every command with -o refuses a format other than table
// json or yaml, naming the flag, before it asks the gateway anything (nothing is created, leased or
// destroyed on a typo).
func TestBadOutputRefusedBeforeAnyRequest(t *testing.T) {
	var requests atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		http.Error(w, "no request expected", http.StatusTeapot)
	}))
	t.Cleanup(srv.Close)
	var out bytes.Buffer
	oldOut, oldErr := stdout, stderr
	stdout, stderr = &out, &out
	t.Cleanup(func() { stdout, stderr = oldOut, oldErr })

	for _, args := range [][]string{
		{"env", "create", "--profile", "p"},
		{"env", "list"},
		{"env", "show", "e1"},
		{"env", "events", "e1"},
		{"env", "destroy", "e1"},
		{"env", "sweep"},
		{"session", "create"},
		{"session", "list"},
		{"session", "show", "s1"},
		{"session", "send", "s1", "hello"},
		{"profile", "list"},
		{"credential", "list"},
		{"models", "list"},
		{"doctor"},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := run(ctx, append(args, "-o", "xml", "--gateway", srv.URL, "--token", "t"))
		cancel()
		if err == nil || !strings.Contains(err.Error(), "--output must be table, json or yaml") {
			t.Errorf("%v -o xml: %v, want the --output refusal", args, err)
		}
	}
	if n := requests.Load(); n != 0 {
		t.Fatalf("%d requests reached the gateway", n)
	}
}

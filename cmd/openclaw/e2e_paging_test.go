package main_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/openclaw/cloudworkers/gateway/api"
	"github.com/openclaw/cloudworkers/gateway/sessions"
)

// TestListsPageThroughTheCLI: with more sessions than a default page (100), the API's first page
// holds 100 and names the next one, and `openclaw session list` follows the pages to list every
// session once; a bad limit is a 400 naming it.
func TestListsPageThroughTheCLI(t *testing.T) {
	g := startGateway(t, filepath.Join(t.TempDir(), "data"), "")
	want := map[string]bool{}
	for i := range 130 {
		ses, err := g.client.CreateSession(g.ctx(), sessions.CreateRequest{CreateParams: sessions.CreateParams{Title: fmt.Sprintf("paged %d", i)}})
		if err != nil {
			t.Fatal(err)
		}
		want[ses.ID] = true
	}
	first, next, err := g.client.SessionsPage(g.ctx(), api.SessionFilter{}, api.PageOptions{})
	if err != nil || len(first) != 100 || next == "" {
		t.Fatalf("first page: %d sessions, next %q, %v", len(first), next, err)
	}
	out, errOut, err := g.cli("session", "list", "-o", "json")
	if err != nil {
		t.Fatalf("session list: %v\n%s", err, errOut)
	}
	var listed []sessions.Session
	if err := json.Unmarshal([]byte(out), &listed); err != nil {
		t.Fatalf("session list output: %v\n%.300s", err, out)
	}
	got := map[string]int{}
	for _, s := range listed {
		got[s.ID]++
	}
	for id := range want {
		if got[id] != 1 {
			t.Errorf("session %s listed %d times by the CLI", id, got[id])
		}
	}
	var ae *api.Error
	if _, err := g.do(http.MethodGet, "/api/v1/sessions?limit=5000", nil, nil); !errors.As(err, &ae) || ae.Status != http.StatusBadRequest || ae.Field != "limit" {
		t.Fatalf("limit 5000: %v", err)
	}
	if _, _, err := g.client.SessionsPage(g.ctx(), api.SessionFilter{}, api.PageOptions{Cursor: "garbage!"}); err == nil || !strings.Contains(err.Error(), "cursor") {
		t.Fatalf("bad cursor: %v", err)
	}
}

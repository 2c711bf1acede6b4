package main_test

import (
	"encoding/json"
	"net/http"
	"net/http/cookiejar"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// `openclaw ui` prints a one-time link that signs a browser in once; `openclaw ui sessions` lists
// the browser's session and `--revoke` ends it: its cookie gets 401 from the API and the pages send
// it to sign in.
func TestUISignInLinkAndSessionsCommand(t *testing.T) {
	g := startGateway(t, filepath.Join(t.TempDir(), "data"), "")
	base := "http://" + g.addr
	out, err := exec.Command(openclawBin, "ui", "--gateway", g.addr, "--data-dir", g.dataDir).Output()
	if err != nil {
		t.Fatalf("openclaw ui: %v", err)
	}
	link := strings.TrimSpace(string(out))
	if !strings.HasPrefix(link, base+"/login?code=") || strings.Contains(link, g.client.Token) {
		t.Fatalf("openclaw ui printed %q, want %s/login?code=… without the token", link, base)
	}
	jar, _ := cookiejar.New(nil)
	browser := &http.Client{Jar: jar}
	res, err := browser.Get(link)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusOK || res.Request.URL.String() != base+"/" {
		t.Fatalf("the link: %d at %s, want the Sessions page", res.StatusCode, res.Request.URL)
	}
	// the link again, from another browser: refused
	res, err = http.Get(link)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusUnauthorized {
		t.Fatalf("the link used twice: %d, want 401", res.StatusCode)
	}

	sessions := func() []map[string]any {
		t.Helper()
		out, err := exec.Command(openclawBin, "ui", "sessions", "-o", "json", "--gateway", g.addr, "--data-dir", g.dataDir).Output()
		var list []map[string]any
		if err != nil || json.Unmarshal(out, &list) != nil {
			t.Fatalf("openclaw ui sessions -o json: %v %s", err, out)
		}
		return list
	}
	list := sessions()
	if len(list) != 1 || list[0]["state"] != "active" || list[0]["remote"] != "127.0.0.1" {
		t.Fatalf("sessions after sign-in: %v", list)
	}
	id, _ := list[0]["id"].(string)
	if out, err := exec.Command(openclawBin, "ui", "sessions", "--gateway", g.addr, "--data-dir", g.dataDir).Output(); err != nil ||
		!strings.Contains(string(out), "STATE") || !strings.Contains(string(out), id) {
		t.Fatalf("openclaw ui sessions (table): %v %s", err, out)
	}
	if out, err := exec.Command(openclawBin, "ui", "sessions", "--revoke", id, "--gateway", g.addr, "--data-dir", g.dataDir).CombinedOutput(); err != nil ||
		!strings.Contains(string(out), id+" revoked") {
		t.Fatalf("openclaw ui sessions --revoke: %v %s", err, out)
	}
	if list := sessions(); len(list) != 1 || list[0]["state"] != "revoked" {
		t.Fatalf("sessions after revoke: %v", list)
	}
	res, err = browser.Get(base + "/api/v1/sessions")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusUnauthorized {
		t.Fatalf("the API with the revoked session's cookie: %d, want 401", res.StatusCode)
	}
	res, err = browser.Get(base + "/")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.Request.URL.Path != "/login" {
		t.Fatalf("the UI with the revoked session's cookie ends at %s, want /login", res.Request.URL)
	}
	if out, err := exec.Command(openclawBin, "ui", "sessions", "--revoke", "bs_nope", "--gateway", g.addr, "--data-dir", g.dataDir).CombinedOutput(); err == nil ||
		!strings.Contains(string(out), "not-found") {
		t.Fatalf("revoke of an unknown session: %v %s", err, out)
	}
}

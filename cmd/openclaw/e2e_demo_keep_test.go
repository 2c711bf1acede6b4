package main_test

import (
	"encoding/json"
	"net/http"
	"net/http/cookiejar"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/openclaw/cloudworkers/internal/testrig/testenv"
)

// `openclaw demo --keep` passes, leaves its gateway running and prints the Control UI's sign-in
// link, which signs a browser in; the printed pid stops it.
func TestDemoKeepLeavesTheGatewayWithASignInLink(t *testing.T) {
	testenv.RequireCommands(t, "git")
	cmd := exec.Command(openclawBin, "demo", "--keep", "--tmp", t.TempDir())
	out, err := cmd.CombinedOutput()
	pidM := regexp.MustCompile(`stop it with: kill (\d+)`).FindSubmatch(out)
	if pidM != nil {
		pid, _ := strconv.Atoi(string(pidM[1]))
		t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
	}
	if err != nil || pidM == nil {
		t.Fatalf("demo --keep: %v\n%s", err, out)
	}
	link := regexp.MustCompile(`sign in to the Control UI: (http://127\.0\.0\.1:\d+)/login\?code=(\S+)`).FindSubmatch(out)
	if link == nil {
		t.Fatalf("no sign-in link in:\n%s", out)
	}
	base := string(link[1])
	jar, _ := cookiejar.New(nil)
	c := &http.Client{Jar: jar}
	if strings.Contains(string(out), "token=") {
		t.Fatalf("the demo printed a link with the token:\n%s", out)
	}
	res, err := c.Get(base + "/login?code=" + string(link[2]))
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != 200 || res.Request.URL.String() != base+"/" {
		t.Fatalf("sign-in link: %d at %s, want the Sessions page at %s/", res.StatusCode, res.Request.URL, base)
	}
	// the link signs in once
	if res, err := http.Get(base + "/login?code=" + string(link[2])); err != nil || res.StatusCode != http.StatusUnauthorized {
		t.Fatalf("the sign-in link used again: %v %v, want 401", res, err)
	} else {
		res.Body.Close()
	}
	// the page's own API calls work with the cookie: the demo's session is listed
	res, err = c.Get(base + "/api/v1/sessions")
	if err != nil {
		t.Fatal(err)
	}
	var list []map[string]any
	err = json.NewDecoder(res.Body).Decode(&list)
	res.Body.Close()
	demoSession := func(m map[string]any) bool { t, _ := m["title"].(string); return strings.HasPrefix(t, "openclaw demo") }
	if err != nil || res.StatusCode != 200 || !slices.ContainsFunc(list, demoSession) {
		t.Fatalf("sessions with the UI's cookie: %d %v %v", res.StatusCode, list, err)
	}
	pid, _ := strconv.Atoi(string(pidM[1]))
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		t.Fatalf("the printed pid %d: %v", pid, err)
	}
	// The gateway is not this test's child: wait until it is gone (or a zombie) before the temp
	// dir it writes into is removed.
	for deadline := time.Now().Add(20 * time.Second); testenv.Alive(pid); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the kept gateway (pid %d) did not stop on SIGTERM", pid)
		}
	}
}

// Package testenv gates integration tests on what the machine provides (root, real commands).
package testenv

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// RequireEnv is the environment variable that turns a missing prerequisite into a failure.
// CI sets it to 1; locally, integration tests that cannot run are skipped loudly instead.
const RequireEnv = "OPENCLAW_REQUIRE_INTEGRATION"

// packages names the Debian package that provides a command, for skip and failure messages.
var packages = map[string]string{
	"sshd":     "openssh-server",
	"ssh":      "openssh-client",
	"ip":       "iproute2",
	"rsync":    "rsync",
	"git":      "git",
	"useradd":  "passwd",
	"userdel":  "passwd",
	"nc":       "netcat-openbsd",
	"socat":    "socat",
	"git-lfs":  "git-lfs",
	"chattr":   "e2fsprogs",
	"chromium": "chromium",
}

// sbinDirs are searched after $PATH: sshd and ip live there and non-login shells often lack them.
var sbinDirs = []string{"/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"}

// Required reports whether missing prerequisites must fail the test instead of skipping it.
func Required() bool { return os.Getenv(RequireEnv) == "1" }

// Integration stops an integration test that cannot run here: it fails when RequireEnv=1
// and skips with a loud reason otherwise.
func Integration(t testing.TB, reason string) {
	t.Helper()
	if Required() {
		t.Fatalf("integration test cannot run: %s (%s=1 makes this a failure)", reason, RequireEnv)
	}
	t.Skipf("SKIPPING INTEGRATION TEST: %s (set %s=1 to make this a failure)", reason, RequireEnv)
}

// RequireRoot stops the test through Integration unless it runs as root.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		Integration(t, "needs root (network namespaces, users, sshd)")
	}
}

// RequireCommands stops the test through Integration unless every named command is found.
func RequireCommands(t testing.TB, names ...string) {
	t.Helper()
	var missing []string
	for _, n := range names {
		if _, err := LookPath(n); err != nil {
			if pkg, ok := packages[n]; ok {
				n += " (package " + pkg + ")"
			}
			missing = append(missing, n)
		}
	}
	if len(missing) > 0 {
		Integration(t, "missing commands: "+strings.Join(missing, ", "))
	}
}

// LookPath finds a command in $PATH and then in the usual sbin directories.
func LookPath(name string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	for _, d := range sbinDirs {
		p := filepath.Join(d, name)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", &exec.Error{Name: name, Err: exec.ErrNotFound}
}

// PublicDir returns a new temporary directory that other users can traverse (0711), removed at
// the end of the test: for what a box or process running as another user must reach.
func PublicDir(t testing.TB, pattern string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", pattern)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o711); err != nil {
		t.Fatal(err)
	}
	return dir
}

// WriteFiles writes files (slash-separated path → content, mode 0644) below root, creating
// directories.
func WriteFiles(t testing.TB, root string, files map[string]string) {
	t.Helper()
	for p, c := range files {
		full := filepath.Join(root, filepath.FromSlash(p))
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

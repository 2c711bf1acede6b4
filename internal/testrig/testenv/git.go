package testenv

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// Git runs git in dir with no system or global configuration, a fixed author and main as the
// default branch, and returns its trimmed output; a failure fails t.
func Git(t testing.TB, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", append([]string{"-C", dir, "-c", "user.name=u", "-c", "user.email=u@example.com", "-c", "init.defaultBranch=main"}, args...)...)
	cmd.Env = append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("git %v in %s: %v\n%s", args, dir, err, out)
	}
	return strings.TrimSpace(string(out))
}

// InitRepo writes files (as WriteFiles does) below dir and commits them with message, through Git,
// as the first commit of a new repository there; it returns the commit.
func InitRepo(t testing.TB, dir, message string, files map[string]string) string {
	t.Helper()
	WriteFiles(t, dir, files)
	Git(t, dir, "init", "-q")
	Git(t, dir, "add", "-A")
	Git(t, dir, "commit", "-qm", message)
	return Git(t, dir, "rev-parse", "HEAD")
}

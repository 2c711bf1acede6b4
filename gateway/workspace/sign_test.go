package workspace

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/openclaw/cloudworkers/internal/testrig/testenv"
)

// TestLoadSigningKey: the gateway starts only with a signing key it can use unattended and that
// no one else may read; each refusal says what to do.
func TestLoadSigningKey(t *testing.T) {
	testenv.RequireCommands(t, "ssh-keygen")
	dir := t.TempDir()
	keygen := func(name, pass string) string {
		t.Helper()
		p := filepath.Join(dir, name)
		if out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", pass, "-C", "", "-f", p).CombinedOutput(); err != nil {
			t.Fatalf("ssh-keygen: %v %s", err, out)
		}
		return p
	}
	good := keygen("good", "")
	k, err := LoadSigningKey(good)
	if err != nil || !strings.HasPrefix(k.Fingerprint, "SHA256:") || !strings.HasPrefix(k.Public, "ssh-ed25519 ") {
		t.Fatalf("a good key: %+v %v", k, err)
	}
	locked := keygen("locked", "secret phrase")
	notKey := filepath.Join(dir, "notes")
	if err := os.WriteFile(notKey, []byte("hello\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	loose := keygen("loose", "")
	if err := os.Chmod(loose, 0o640); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ file, want string }{
		{locked, "has a passphrase"},
		{notKey, "not an OpenSSH private key"},
		{loose, "chmod 600"},
		{filepath.Join(dir, "missing"), "no such file"},
	} {
		if _, err := LoadSigningKey(tc.file); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error saying %q", filepath.Base(tc.file), err, tc.want)
		}
	}
}

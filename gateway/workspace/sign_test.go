package workspace

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/openclaw/cloudworkers/internal/testrig/testenv"
	"github.com/openclaw/cloudworkers/sync/gitexec"
)

// TestLoadSigningKey: the gateway starts only with a signing key it can use unattended and that
// no one else may read; each refusal says what to do.
func TestLoadSigningKey(t *testing.T) {
	testenv.RequireCommands(t, "ssh-keygen")
	dir := t.TempDir()
	keygen := func(name, pass string) string {
		t.Helper()
		p := filepath.Join(dir, name)
		typ := "ed25519"
		if name == "ecdsa" {
			typ = "ecdsa"
		}
		if out, err := exec.Command("ssh-keygen", "-q", "-t", typ, "-N", pass, "-C", "", "-f", p).CombinedOutput(); err != nil {
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
		{keygen("ecdsa", ""), "use an Ed25519 or RSA key"},
		{filepath.Join(dir, "missing"), "no such file"},
	} {
		if _, err := LoadSigningKey(tc.file); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error saying %q", filepath.Base(tc.file), err, tc.want)
		}
	}
}

// TestSigningRefusesWhatItCannotCopyFaithfully: a worker's commit whose headers git reads
// differently from a loose parser (a second tree after the committer, an option for a tree id), or
// whose identity git would rewrite, is refused; a plain one is signed with the same tree,
// identities, dates and message.
func TestSigningRefusesWhatItCannotCopyFaithfully(t *testing.T) {
	testenv.RequireCommands(t, "git", "ssh-keygen")
	ctx := testenv.Context(t, time.Minute)
	dir := t.TempDir()
	keyFile := filepath.Join(dir, "key")
	if out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "", "-f", keyFile).CombinedOutput(); err != nil {
		t.Fatalf("ssh-keygen: %v %s", err, out)
	}
	key, err := LoadSigningKey(keyFile)
	if err != nil {
		t.Fatal(err)
	}
	repo := filepath.Join(dir, "repo")
	testenv.InitRepo(t, repo, "base", map[string]string{"a.txt": "a\n"})
	base := testenv.Git(t, repo, "rev-parse", "HEAD")
	tree := testenv.Git(t, repo, "rev-parse", "HEAD^{tree}")
	other := testenv.Git(t, repo, "mktree") // the empty tree
	craft := func(name, body string) {
		t.Helper()
		cmd := exec.Command("git", "-C", repo, "hash-object", "-t", "commit", "-w", "--literally", "--stdin")
		cmd.Stdin = strings.NewReader(body)
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("hash-object: %v", err)
		}
		testenv.Git(t, repo, "update-ref", "refs/heads/openclaw/"+name, strings.TrimSpace(string(out)))
	}
	who := "W <w@example.com> 1700000000 +0100"
	craft("second-tree", "tree "+tree+"\nparent "+base+"\nauthor "+who+"\ncommitter "+who+"\ntree "+other+"\n\nsneaky\n")
	craft("option-tree", "tree "+tree+"\nparent "+base+"\nauthor "+who+"\ncommitter "+who+"\ntree -F\n\nsneaky\n")
	craft("renamed", "tree "+tree+"\nparent "+base+"\nauthor Bob. <b@example.com> 1700000000 +0100\ncommitter "+who+"\n\nnormalized\n")
	craft("old-date", "tree "+tree+"\nparent "+base+"\nauthor W <w@example.com> 12345 +0000\ncommitter "+who+"\n\nan old date\n")
	craft("plain", "tree "+tree+"\nparent "+base+"\nauthor "+who+"\ncommitter "+who+"\n\nplain work\n\nwith a body\n")
	g, err := gitexec.NewUntrusted(ctx, repo)
	if err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"second-tree", "option-tree", "renamed"} {
		if _, _, err := key.signBranch(ctx, g, "openclaw/"+bad); err == nil {
			t.Errorf("%s: signed; want it refused", bad)
		}
	}
	for _, good := range []string{"plain", "old-date"} {
		ref, n, err := key.signBranch(ctx, g, "openclaw/"+good)
		if err != nil || n != 1 {
			t.Fatalf("%s: %d signed, %v", good, n, err)
		}
		format := "--format=%T %P %an <%ae> %ad %cn <%ce> %cd %B"
		if got, want := testenv.Git(t, repo, "log", "-1", format, ref), testenv.Git(t, repo, "log", "-1", format, "openclaw/"+good); got != want {
			t.Fatalf("%s: the signed copy\n%s\nwant\n%s", good, got, want)
		}
	}
}

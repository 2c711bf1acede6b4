package publish

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/openclaw/cloudworkers/internal/gitforge"
	"github.com/openclaw/cloudworkers/internal/testrig/testenv"
	"github.com/openclaw/cloudworkers/providers"
)

// sshForge is a real OpenSSH sshd on loopback (internal/gitforge) serving one bare repository
// over SSH to one authorized key.
type sshForge struct {
	*gitforge.SSH
	bare string
}

func (f *sshForge) logged() string { return f.Log() }

func (f *sshForge) url() string { return f.URL(f.bare) }

func keygen(t *testing.T, path string) (pub string) {
	t.Helper()
	pub, err := gitforge.Keygen(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	return pub
}

func readKey(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// newSSHForge starts sshd on 127.0.0.1 (stopped at the end of the test) accepting the public key
// authorized only.
func newSSHForge(t *testing.T, authorized string) *sshForge {
	t.Helper()
	testenv.RequireRoot(t)
	testenv.RequireCommands(t, "git", "ssh", "ssh-keygen", "/usr/sbin/sshd")
	dir := t.TempDir()
	s, err := gitforge.StartSSH(testenv.Context(t, 20*time.Second), dir, authorized)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	f := &sshForge{SSH: s, bare: filepath.Join(dir, "org", "repo.git")}
	testenv.Git(t, dir, "init", "-q", "--bare", f.bare)
	return f
}

func (f *sshForge) refs(t *testing.T) string {
	t.Helper()
	return testenv.Git(t, f.bare, "for-each-ref", "--format=%(refname) %(objectname)")
}

// TestSSHKeyWithPinnedHostKey: against a real OpenSSH sshd on loopback, a publish with an SSH
// credential pushes with exactly its key (an agent holding the one authorized key is not used,
// nor is any user ssh configuration) to a forge presenting exactly the pinned host key; a
// forge presenting another host key (pinned by line or by fingerprint), or a pin for another
// host, is refused with a clear error and no ref changes; the key is on disk only during the
// push and in no error.
func TestSSHKeyWithPinnedHostKey(t *testing.T) {
	keys := t.TempDir()
	authorized := keygen(t, filepath.Join(keys, "client"))
	keygen(t, filepath.Join(keys, "other")) // not authorized
	f := newSSHForge(t, authorized)
	dir := checkout(t, f.url(), "push", "-q", f.bare, "main") // main put on the forge by path
	gitDir := filepath.Join(dir, ".git")
	ctx := testenv.Context(t, 90*time.Second)
	before := f.refs(t)
	clientKey, otherKey := readKey(t, filepath.Join(keys, "client")), readKey(t, filepath.Join(keys, "other"))
	wrongHost := keygen(t, filepath.Join(keys, "impostor"))
	hostLine := "[127.0.0.1]:" + f.Port + " " + f.HostKey
	fp := func(pub string) string {
		out, err := exec.Command("sh", "-c", "printf '%s\\n' \"$0\" | ssh-keygen -lf -", pub).Output()
		if err != nil {
			t.Fatal(err)
		}
		return strings.Fields(string(out))[1]
	}

	// An agent that holds the authorized key, and a user ssh configuration that would use it:
	// neither may make a push with the wrong key succeed.
	agentSock := filepath.Join(keys, "agent.sock")
	agent := exec.Command("ssh-agent", "-D", "-a", agentSock)
	if err := agent.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = agent.Process.Kill(); _ = agent.Wait() })
	testenv.Eventually(t, "ssh-agent socket", func() bool { _, err := os.Stat(agentSock); return err == nil })
	if out, err := exec.Command("env", "SSH_AUTH_SOCK="+agentSock, "ssh-add", "-q", filepath.Join(keys, "client")).CombinedOutput(); err != nil {
		t.Fatalf("ssh-add: %v\n%s", err, out)
	}
	t.Setenv("SSH_AUTH_SOCK", agentSock)

	tmp := t.TempDir()
	newCred := func(key, line, fingerprint string) memCreds {
		c, err := NewSSHCredential(key, "", line, fingerprint)
		if err != nil {
			t.Fatal(err)
		}
		return memCreds{"forge": c.Encode()}
	}
	pub := func(creds memCreds) *Publisher {
		p, err := New(Config{Credentials: creds, TempDir: tmp})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	policy := providers.PublishPolicy{Credential: "forge"}
	req := Request{GitDir: gitDir, Source: "refs/heads/openclaw/s1", Policy: policy}
	noLeftovers := func(t *testing.T) {
		t.Helper()
		if ents, _ := os.ReadDir(tmp); len(ents) != 0 {
			t.Fatalf("the push left %d file(s) in its temporary directory (the key must live for the one command)", len(ents))
		}
	}
	noKey := func(t *testing.T, err error) {
		t.Helper()
		for _, k := range []string{clientKey, otherKey} {
			body := strings.Split(strings.TrimSpace(k), "\n")[1]
			if strings.Contains(err.Error(), body) {
				t.Fatalf("the error quotes the private key: %v", err)
			}
		}
	}

	for _, tc := range []struct {
		name  string
		creds memCreds
		want  string
	}{
		{"host key mismatch (line)", newCred(clientKey, "[127.0.0.1]:"+f.Port+" "+wrongHost, ""), "is not the credential's pinned host key"},
		{"host key mismatch (bare key)", newCred(clientKey, wrongHost, ""), "is not the credential's pinned host key"},
		{"host key mismatch (fingerprint)", newCred(clientKey, "", fp(wrongHost)), "is not the credential's pinned host key"},
		{"pin for another host", newCred(clientKey, "forge.example "+f.HostKey, ""), "is for forge.example, not for the remote's host"},
		{"unauthorized key, authorized one in the agent", newCred(otherKey, hostLine, ""), "Permission denied"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := pub(tc.creds).Publish(ctx, req)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("publish: %v, want an error saying %q", err, tc.want)
			}
			var he *HostKeyError
			if strings.Contains(tc.want, "pinned host key") && !errors.As(err, &he) {
				t.Fatalf("publish: %v, want a *HostKeyError", err)
			}
			noKey(t, err)
			if got := f.refs(t); got != before {
				t.Fatalf("server refs changed:\n%s\nwant\n%s", got, before)
			}
			noLeftovers(t)
		})
	}
	if strings.Contains(f.logged(), "Accepted publickey") {
		t.Fatalf("sshd accepted a key during a refused push:\n%s", f.logged())
	}

	for i, creds := range []memCreds{newCred(clientKey, hostLine, ""), newCred(clientKey, "", fp(f.HostKey))} {
		want := "new"
		if i > 0 {
			want = "up to date"
		}
		res, err := pub(creds).Publish(ctx, req)
		if err != nil {
			t.Fatalf("publish %d: %v\nsshd:\n%s", i, err, f.logged())
		}
		commit := testenv.Git(t, dir, "rev-parse", "openclaw/s1")
		if res.Status != want || res.Commit != commit || res.RemoteURL != f.url() {
			t.Fatalf("publish %d: %+v, want %s at %s", i, res, want, commit)
		}
		if got := testenv.Git(t, f.bare, "rev-parse", "refs/heads/openclaw/s1"); got != commit {
			t.Fatalf("server has openclaw/s1 at %s, want %s", got, commit)
		}
		noLeftovers(t)
	}
	if !strings.Contains(f.logged(), "Accepted publickey for root") {
		t.Fatalf("sshd did not log the key's acceptance:\n%s", f.logged())
	}

	// policy still comes first: main is refused before ssh runs
	if _, err := pub(newCred(clientKey, hostLine, "")).Publish(ctx, Request{GitDir: gitDir, Source: "refs/heads/openclaw/s1", Dest: "refs/heads/main", Policy: policy}); err == nil || !strings.Contains(err.Error(), "publish.pushRefAllowlist") {
		t.Fatalf("push to main: %v", err)
	}
	// an HTTPS token against an ssh remote, and --pr with an SSH key, are refused before git runs
	if _, err := pub(memCreds{"forge": gitCred}).Publish(ctx, req); err == nil || !strings.Contains(err.Error(), "is an HTTPS token") {
		t.Fatalf("an HTTPS token for an ssh remote: %v", err)
	}
	if _, err := pub(newCred(clientKey, hostLine, "")).Publish(ctx, Request{GitDir: gitDir, Source: "refs/heads/openclaw/s1", Policy: policy, PR: true}); err == nil || !strings.Contains(err.Error(), "--pr needs") {
		t.Fatalf("--pr with an SSH key: %v", err)
	}
}

// TestSSHCredentialChecked: a credential that is no usable key, or pins no single host key, is
// refused with what is wrong and never quotes the key.
func TestSSHCredentialChecked(t *testing.T) {
	testenv.RequireCommands(t, "ssh-keygen")
	dir := t.TempDir()
	hostPub := keygen(t, filepath.Join(dir, "host"))
	key := readKey(t, filepath.Join(dir, "host"))
	if out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "secret-pass", "-C", "", "-f", filepath.Join(dir, "locked")).CombinedOutput(); err != nil {
		t.Fatalf("ssh-keygen: %v\n%s", err, out)
	}
	locked := readKey(t, filepath.Join(dir, "locked"))
	for _, tc := range []struct{ name, key, line, fp, want string }{
		{"no key", "", hostPub, "", "has no SSH private key"},
		{"not a key", "ghs_notakey", hostPub, "", "is not an SSH private key"},
		{"passphrase", locked, hostPub, "", "with a passphrase"},
		{"no pin", key, "", "", "pins no host key"},
		{"two pins", key, hostPub, "SHA256:" + strings.Repeat("A", 43), "not both"},
		{"bad fingerprint", key, "", "MD5:aa:bb", "want SHA256:"},
		{"bad line", key, "forge.example not-a-key", "", "not a known_hosts line"},
		{"two lines", key, hostPub + "\n" + hostPub, "", "more than one known_hosts line"},
		{"revoked marker", key, "@revoked * " + hostPub, "", "@revoked"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewSSHCredential(tc.key, "", tc.line, tc.fp)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want %q", err, tc.want)
			}
			if tc.key != "" && len(tc.key) > 40 && strings.Contains(err.Error(), strings.Split(tc.key, "\n")[1]) {
				t.Fatal("the error quotes the key")
			}
		})
	}
	c, err := NewSSHCredential(key, "", hostPub, "")
	if err != nil {
		t.Fatal(err)
	}
	back, err := ParseGitCredential(c.Encode())
	if err != nil || back.Kind != KindSSH || back.Username != "git" || back.PrivateKey != key {
		t.Fatalf("round trip: %+v %v", back.Kind, err)
	}
	vals := map[string]string{"forge": c.Encode()}
	SecretValues(vals)
	if vals["@forge.key"] != strings.TrimSpace(key) {
		t.Fatal("the secret scan does not look for the SSH key")
	}
}

// TestSSHRemoteURLs: the remote forms git reads as SSH, and what they connect to.
func TestSSHRemoteURLs(t *testing.T) {
	for in, want := range map[string]string{
		"ssh://git@forge.example/org/repo.git":      "git@forge.example:22",
		"ssh://forge.example:2222/org/repo.git":     "@forge.example:2222",
		"git@forge.example:org/repo.git":            "git@forge.example:22",
		"ssh://git@[::1]:2200/org/repo.git":         "git@::1:2200",
		"forge.example:/srv/repo.git":               "@forge.example:22",
		"https://forge.example/org/repo.git":        "",
		"ssh://-oProxyCommand=x/org/repo.git":       "",
		"ssh://git@forge.example:99999/org/repo":    "",
		"ext::sh -c touch% /tmp/pwned":              "",
		"-oProxyCommand=x:org/repo.git":             "",
		"/srv/repo.git":                             "",
		"file:///srv/repo.git":                      "",
		"ssh://forge.example":                       "",
		"user;rm@forge.example:repo.git":            "",
		"ssh://git@forge.example/org/repo.git#frag": "git@forge.example:22",
	} {
		r, ok := parseSSHRemote(in)
		got := ""
		if ok {
			got = fmt.Sprintf("%s@%s:%s", r.user, r.host, r.port)
		}
		if got != want {
			t.Errorf("parseSSHRemote(%q) = %q, want %q", in, got, want)
		}
	}
}

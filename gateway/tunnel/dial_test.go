package tunnel

import (
	"bytes"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/openclaw/cloudworkers/internal/untrusted"
	"golang.org/x/crypto/ssh"
)

func TestDialPinnedHostKey(t *testing.T) {
	b := startBox(t)
	ctx := testContext(t)
	c, err := Dial(ctx, b.target("env-a", ""), waitLong)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	defer c.Close()
	s, err := c.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	out, err := s.Output("echo ok")
	if err != nil || string(bytes.TrimSpace(out)) != "ok" {
		t.Fatalf("exec: %q, %v", out, err)
	}
}

func TestDialRefusesUnpinnedHostKey(t *testing.T) {
	b := startBox(t)
	ctx := testContext(t)
	_, other := writeKey(t)
	_, other2 := writeKey(t)
	boxKey, _, _, _, err := ssh.ParseAuthorizedKey([]byte(b.HostKey))
	if err != nil {
		t.Fatal(err)
	}

	tg := b.target("env-a", "")
	tg.HostKeys = []string{
		string(ssh.MarshalAuthorizedKey(other.PublicKey())),
		string(ssh.MarshalAuthorizedKey(other2.PublicKey())),
	}
	c, err := Dial(ctx, tg, waitLong)
	if err == nil {
		c.Close()
		t.Fatal("dial with an unpinned host key succeeded")
	}
	mm, ok := err.(*HostKeyMismatchError)
	if !ok {
		t.Fatalf("err = %T %v, want *HostKeyMismatchError", err, err)
	}
	want := []string{ssh.FingerprintSHA256(other.PublicKey()), ssh.FingerprintSHA256(other2.PublicKey())}
	if !slices.Equal(mm.Expected, want) || mm.Presented != ssh.FingerprintSHA256(boxKey) || mm.EnvironmentID != "env-a" {
		t.Fatalf("mismatch = %+v; want expected %v, presented %s", mm, want, ssh.FingerprintSHA256(boxKey))
	}
	for _, fp := range append(want, mm.Presented) {
		if !strings.Contains(err.Error(), fp) {
			t.Errorf("error %q does not name %s", err, fp)
		}
	}
}

func TestDialWithoutPinIsRefused(t *testing.T) {
	b := startBox(t)
	p := startProxy(t, b.target("x", "").addr())
	for _, pins := range [][]string{nil, {""}, {"not a key"}} {
		tg := b.target("env-a", p.addr())
		tg.HostKeys = pins
		if c, err := Dial(testContext(t), tg, waitLong); err == nil {
			c.Close()
			t.Fatalf("dial with pins %q succeeded", pins)
		}
		if err := tg.Validate(); err == nil {
			t.Errorf("target with pins %q is valid", pins)
		}
	}
	if n := p.acceptedCount(); n != 0 {
		t.Errorf("%d connections made without a pinned key", n)
	}
}

func TestDialRefusesWrongClientKey(t *testing.T) {
	b := startBox(t)
	keyPath, _ := writeKey(t)
	tg := b.target("env-a", "")
	tg.KeyPath = keyPath
	c, err := Dial(testContext(t), tg, waitLong)
	if err == nil {
		c.Close()
		t.Fatal("login with an unauthorized key succeeded")
	}
	if isMismatch(err) {
		t.Fatalf("wrong client key reported as host key mismatch: %v", err)
	}
}

func TestDialHonoursContext(t *testing.T) {
	b := startBox(t)
	p := startProxy(t, b.target("x", "").addr())
	p.pause() // the TCP connect succeeds, the handshake never completes
	ctx := testContext(t)
	start := time.Now()
	_, err := Dial(ctx, b.target("env-a", p.addr()), 100*time.Millisecond)
	if err == nil {
		t.Fatal("dial through a dead link succeeded")
	}
	if time.Since(start) > waitLong {
		t.Fatalf("dial took %v", time.Since(start))
	}
}

func TestHostKeyAlgorithms(t *testing.T) {
	_, ed := writeKey(t)
	got := hostKeyAlgorithms([]ssh.PublicKey{ed.PublicKey(), ed.PublicKey()})
	if !slices.Equal(got, []string{ssh.KeyAlgoED25519}) {
		t.Fatalf("algorithms = %v", got)
	}
}

func TestShellQuote(t *testing.T) {
	for in, want := range map[string]string{
		"a/b.sock":  `'a/b.sock'`,
		"it's":      `'it'\''s'`,
		"$(rm -rf)": `'$(rm -rf)'`,
	} {
		if got := untrusted.Quote(in); got != want {
			t.Errorf("untrusted.Quote(%q) = %s, want %s", in, got, want)
		}
	}
}

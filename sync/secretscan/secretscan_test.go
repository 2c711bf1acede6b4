package secretscan

import (
	"encoding/base64"
	"errors"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/openclaw/cloudworkers/sync/manifest"
)

const held = "k3y-Of+The/Gateway=42&more"

func scan(t *testing.T, s *Scanner, text string) []Finding {
	t.Helper()
	f, err := s.ScanReader("f.txt", strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func ruleNames(fs []Finding) []string {
	var out []string
	for _, f := range fs {
		out = append(out, f.Rule)
	}
	return out
}

// TestHeldValues finds a credential the gateway holds as it is, base64-encoded (both alphabets,
// at every alignment inside a longer encoded text) and URL-encoded, at its line.
func TestHeldValues(t *testing.T) {
	s := New(map[string]string{"anthropic": held, "short": "abc"}, nil)
	for name, text := range map[string]string{
		"exact":          "line one\nKEY=" + held + "\n",
		"base64":         "line one\n" + base64.StdEncoding.EncodeToString([]byte(held)) + "\n",
		"base64 url":     "line one\n" + base64.URLEncoding.EncodeToString([]byte(held)) + "\n",
		"base64 offset1": "line one\n" + base64.StdEncoding.EncodeToString([]byte("x"+held+"tail")) + "\n",
		"base64 offset2": "line one\n" + base64.StdEncoding.EncodeToString([]byte("Authorization: "+held)) + "\n",
		"query escaped":  "line one\nhttps://x.invalid/?k=" + url.QueryEscape(held) + "\n",
		"path escaped":   "line one\nhttps://x.invalid/" + url.PathEscape(held) + "\n",
	} {
		t.Run(name, func(t *testing.T) {
			f := scan(t, s, text)
			want := Finding{Path: "f.txt", Line: 2, Rule: KnownRulePrefix + "anthropic"}
			if !slices.Contains(f, want) {
				t.Fatalf("findings %v, want %v", f, want)
			}
		})
	}
	if f := scan(t, s, "abc abc abc\n"); len(f) != 0 {
		t.Fatalf("a held value under %d bytes matched: %v", minKnownLen, f)
	}
}

// TestPatterns: the credential shapes are found; look-alikes that are not are not.
func TestPatterns(t *testing.T) {
	s := New(nil, nil)
	for _, tc := range []struct{ text, rule string }{
		{"id AKIAIOSFODNN7EXAMPLE here", "aws-access-key-id"},
		{"token ghp_" + strings.Repeat("aB3", 12), "github-token"},
		{"-----BEGIN OPENSSH PRIVATE KEY-----", "private-key"},
		{"-----BEGIN RSA PRIVATE KEY-----", "private-key"},
		{"xoxb-123456789012-abcdefABCDEF", "slack-token"},
		{"sk-ant-api03-" + strings.Repeat("Ab9_", 23), "anthropic-api-key"},
		{"sk-proj-" + strings.Repeat("xY7-", 12), "openai-api-key"},
		{`client_secret = "q8Zr2LmN0vKp4XtB7wYc1HdF"`, "generic-secret"},
		{`"apiKey": "Zm9vYmFyYmF6cXV4MTIzNDU2Nzg5"`, "generic-secret"},
	} {
		if got := ruleNames(scan(t, s, tc.text+"\n")); !slices.Contains(got, tc.rule) {
			t.Errorf("%q: rules %v, want %s", tc.text, got, tc.rule)
		}
	}
	for _, text := range []string{
		"AKIA is a prefix",
		"-----BEGIN PUBLIC KEY-----",
		`password = "correcthorsebatterystaple"`, // a word: no digit
		`token_count = 12345678901234567890123`,  // digits only
		"the secret of a good API is its docs",
	} {
		if got := scan(t, s, text+"\n"); len(got) != 0 {
			t.Errorf("%q: findings %v, want none", text, got)
		}
	}
}

// TestAllowAndReport: an allowed RULE:PATH passes at that path only; the error names path, line
// and rule and never the secret.
func TestAllowAndReport(t *testing.T) {
	a, err := ParseAllow("aws-access-key-id:docs/example.md")
	if err != nil {
		t.Fatal(err)
	}
	k, err := ParseAllow("gateway-credential:anthropic:test/fixture.txt")
	if err != nil || k != (Allow{Rule: KnownRulePrefix + "anthropic", Path: "test/fixture.txt"}) {
		t.Fatalf("ParseAllow of a held credential's rule: %+v %v", k, err)
	}
	for _, bad := range []string{"", "aws-access-key-id", ":x", "nope:x", "gateway-credential:x"} {
		if _, err := ParseAllow(bad); err == nil {
			t.Errorf("ParseAllow(%q) accepted", bad)
		}
	}
	s := New(map[string]string{"anthropic": held}, []Allow{a, k})
	text := "id AKIAIOSFODNN7EXAMPLE\n"
	if f, _ := s.ScanReader("docs/example.md", strings.NewReader(text)); len(f) != 0 {
		t.Fatalf("allowed finding reported: %v", f)
	}
	f, _ := s.ScanShared([]string{"docs/example.md", "src/real.go"}, strings.NewReader(text+held+"\n"))
	want := []Finding{{"src/real.go", 1, "aws-access-key-id"}, {"docs/example.md", 2, KnownRulePrefix + "anthropic"}, {"src/real.go", 2, KnownRulePrefix + "anthropic"}}
	if len(f) != len(want) {
		t.Fatalf("findings %v, want %v", f, want)
	}
	for _, w := range want {
		if !slices.Contains(f, w) {
			t.Fatalf("findings %v, want %v", f, want)
		}
	}
	msg := (&FoundError{Findings: f}).Error()
	if strings.Contains(msg, held) || strings.Contains(msg, "AKIAIOSFODNN7EXAMPLE") || !strings.Contains(msg, "src/real.go:1 aws-access-key-id") {
		t.Fatalf("error %q: want path:line rule and no secret", msg)
	}
}

// TestLongLineAndTree: a secret across the read buffer's edge in a line of megabytes is found;
// ScanTree reads files and symlink targets without following links.
func TestLongLineAndTree(t *testing.T) {
	s := New(map[string]string{"anthropic": held}, nil)
	long := strings.Repeat("x", 64<<10-5) + held + strings.Repeat("y", 3<<20) + "\n"
	if f := scan(t, s, long); !slices.Contains(ruleNames(f), KnownRulePrefix+"anthropic") {
		t.Fatalf("secret at the buffer edge missed: %v", f)
	}
	root := t.TempDir()
	if err := os.WriteFile(filepath.Join(root, "a.txt"), []byte("ok\n"+held+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("a.txt", filepath.Join(root, "link")); err != nil {
		t.Fatal(err)
	}
	f, err := s.ScanTree(root, []manifest.Entry{
		{Path: "a.txt", Type: manifest.TypeFile},
		{Path: "l", Type: manifest.TypeSymlink, Target: "../" + base64.StdEncoding.EncodeToString([]byte(held))},
		{Path: "d", Type: manifest.TypeDir},
	})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(f, Finding{"a.txt", 2, KnownRulePrefix + "anthropic"}) || !slices.Contains(f, Finding{"l", 1, KnownRulePrefix + "anthropic"}) {
		t.Fatalf("tree findings %v", f)
	}
	if _, err := s.ScanTree(root, []manifest.Entry{{Path: "link", Type: manifest.TypeFile}}); err == nil || errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a symlink staged as a file was followed: %v", err)
	}
}

// A blob of secret-shaped lines at many paths (K lines × N paths findings) cannot make the
// gateway hold millions of findings: a scan stops at MaxFindings, and its error says so.
func TestFindingsAreBounded(t *testing.T) {
	s := New(nil, nil)
	blob := strings.Repeat("id AKIAIOSFODNN7EXAMPLE here\n", 3*MaxFindings)
	paths := make([]string, 500)
	for i := range paths {
		paths[i] = "dir/copy" + strings.Repeat("x", i%7) + string(rune('a'+i%26)) + ".txt"
	}
	found, err := s.ScanShared(paths, strings.NewReader(blob))
	if err != nil {
		t.Fatal(err)
	}
	if len(found) != MaxFindings {
		t.Fatalf("%d findings, want the scan to stop at %d", len(found), MaxFindings)
	}
	if msg := (&FoundError{Findings: found}).Error(); !strings.Contains(msg, "at least 1000 likely secret(s)") || !strings.Contains(msg, "the scan stopped there") {
		t.Fatalf("error %q does not say the scan stopped", msg)
	}
	one, _ := s.ScanReader("f", strings.NewReader(blob))
	if len(one) != MaxFindings {
		t.Fatalf("one file of %d secret lines: %d findings, want %d", 3*MaxFindings, len(one), MaxFindings)
	}
}

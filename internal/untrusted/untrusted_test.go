package untrusted

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"
)

// A quoted word reaches the program as exactly itself, whatever shell syntax it holds.
func TestQuoteKeepsEveryWordLiteral(t *testing.T) {
	if _, err := exec.LookPath("sh"); err != nil {
		t.Skip("no sh")
	}
	words := []string{"plain", "it's", `a"b`, "$(id)", "`id`", "a; rm -rf /", "new\nline", "", "*", `back\slash`, "'", "''"}
	out, err := exec.Command("sh", "-c", `for w in `+QuoteAll(words)+`; do printf '%s\0' "$w"; done`).Output()
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Split(strings.TrimSuffix(string(out), "\x00"), "\x00")
	if !slices.Equal(got, words) {
		t.Fatalf("the shell saw %q, want %q", got, words)
	}
}

// Hostile text becomes one bounded printable line: no control character, no escape sequence's
// ESC, valid UTF-8, never longer than asked (plus the mark of the cut).
func TestLineIsBoundedAndPrintable(t *testing.T) {
	for _, tc := range []struct {
		in   string
		max  int
		want string
	}{
		{"plain", 100, "plain"},
		{"  two\n\nlines\t here  ", 100, "two lines here"},
		{"bell\x07 and \x1b[31mred\x1b[0m", 100, "bell and [31mred[0m"},
		{"bad \xff utf8", 100, "bad ? utf8"},
		{"é" + strings.Repeat("x", 20), 10, "éxxxxxxxx…"},
	} {
		if got := Line(tc.in, tc.max); got != tc.want {
			t.Errorf("Line(%q, %d) = %q, want %q", tc.in, tc.max, got, tc.want)
		}
	}
	long := Line(strings.Repeat("ü", 1000), 64)
	if !strings.HasSuffix(long, "…") || len(strings.TrimSuffix(long, "…")) > 64 || !utf8.ValidString(long) {
		t.Errorf("Line of 2000 bytes bounded to 64: %q", long)
	}
	if got := Redact("key sk-123 and sk-123", "sk-123"); got != "key [redacted] and [redacted]" {
		t.Errorf("Redact: %q", got)
	}
}

// Command output keeps its lines and its tail, without terminal escapes or carriage-return
// overwrites.
func TestOutputKeepsLinesAndTail(t *testing.T) {
	in := "step 1\r\nprogress 10%\rprogress 100%\n\x1b[1mbold\x1b[0m\x1b]0;title\x07 done\n"
	if got, want := Output(in, 1000), "step 1\nprogress 10%\nprogress 100%\nbold done"; got != want {
		t.Errorf("Output = %q, want %q", got, want)
	}
	if got := Output(strings.Repeat("a", 100)+"\nlast line", 9); got != "last line" {
		t.Errorf("the tail of long output: %q", got)
	}
}

// A secret is redacted even when a control character the cleaning drops splits it (the halves
// would be joined), and no part of it is left by the cut.
func TestRedactedLineLeavesNoSecret(t *testing.T) {
	const key = "sk-SECRET123"
	for _, in := range []string{
		"bad key sk-SECRET123",
		"bad key sk-\x07SECRET123",
		"bad key sk-\u0080SECRET123 and sk-\x7fSECRET123",
	} {
		got := RedactedLine(in, key, 100)
		if strings.Contains(got, "SECRET123") || !strings.Contains(got, "[redacted]") {
			t.Errorf("RedactedLine(%q) = %q", in, got)
		}
	}
	if got := RedactedLine(strings.Repeat("x", 95)+key, key, 100); strings.Contains(got, "sk-") {
		t.Errorf("a cut left a prefix of the secret: %q", got)
	}
	if got := Line("abc   ", 3); got != "abc" {
		t.Errorf("Line(%q, 3) = %q: trailing spaces are not content to cut", "abc   ", got)
	}
}

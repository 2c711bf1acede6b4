package untrusted

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
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

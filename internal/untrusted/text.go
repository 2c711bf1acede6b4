package untrusted

import (
	"regexp"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Line makes text from outside (a provider's message, a box's output, an API's error) safe to
// show on one line and store: invalid UTF-8 becomes "?", newlines and tabs become spaces, other
// control characters are dropped, runs of spaces become one, and at most max bytes are kept
// (cut on a rune boundary and marked with "…").
func Line(s string, max int) string { return Cut(clean(s), max) }

// RedactedLine is Line with every occurrence of secret replaced by "[redacted]", before and after
// the cleaning (a secret split by a control character that the cleaning drops is caught too) and
// before the cut (no prefix of it survives a cut).
func RedactedLine(s, secret string, max int) string {
	return Cut(Redact(clean(Redact(s, secret)), secret), max)
}

// Redact replaces every occurrence of secret in s with "[redacted]" (nothing when secret is "").
func Redact(s, secret string) string {
	if secret == "" {
		return s
	}
	return strings.ReplaceAll(s, secret, "[redacted]")
}

// clean is s as one printable line, unbounded.
func clean(s string) string {
	s = strings.ToValidUTF8(s, "?")
	var b strings.Builder
	space := true // drops leading spaces
	for _, r := range s {
		if unicode.IsSpace(r) {
			r = ' '
		}
		if unicode.IsControl(r) {
			continue
		}
		if r == ' ' {
			if space {
				continue
			}
			space = true
		} else {
			space = false
		}
		b.WriteRune(r)
	}
	return strings.TrimRight(b.String(), " ")
}

// Cut bounds s to at most max bytes on a rune boundary, marking a cut with "…".
func Cut(s string, max int) string {
	if len(s) <= max {
		return s
	}
	n := max
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}

// ansiEscape matches terminal escape sequences (CSI, OSC, and two-byte ones).
var ansiEscape = regexp.MustCompile(`\x1b(\[[0-9;?]*[ -/]*[@-~]|\][^\x07\x1b]*(\x07|\x1b\\)|[@-Z\\-_])`)

// Output makes command output safe to store and show as lines: invalid UTF-8 replaced, terminal
// escape sequences and control characters other than newline and tab removed, carriage returns
// turned into newlines, and only the last max bytes kept (on a rune boundary).
func Output(s string, max int) string {
	s = strings.ToValidUTF8(s, "?")
	s = ansiEscape.ReplaceAllString(s, "")
	s = strings.ReplaceAll(s, "\r\n", "\n")
	var b strings.Builder
	for _, r := range s {
		switch {
		case r == '\r':
			r = '\n'
		case r == '\n' || r == '\t':
		case unicode.IsControl(r):
			continue
		}
		b.WriteRune(r)
	}
	out := b.String()
	if len(out) > max {
		cut := len(out) - max
		for cut < len(out) && !utf8.RuneStart(out[cut]) {
			cut++
		}
		out = out[cut:]
	}
	return strings.TrimRight(out, "\n")
}

// Path is a file name from outside as it can be printed in a list: invalid UTF-8 and control
// characters (C0, DEL, C1) each replaced by '?', nothing else changed, so names stay told apart.
func Path(p string) string {
	p = strings.ToValidUTF8(p, "?")
	return strings.Map(func(r rune) rune {
		if r < 0x20 || (r >= 0x7f && r <= 0x9f) {
			return '?'
		}
		return r
	}, p)
}

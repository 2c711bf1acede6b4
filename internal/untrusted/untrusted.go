// Package untrusted holds the one way each kind of untrusted text is made safe to pass on:
// quoted for a POSIX shell (Quote), shown on one bounded line (Line, after Redact of a secret),
// kept as bounded command output (Output), printed as a file name (Path).
package untrusted

import "strings"

// Quote quotes s as one word for a POSIX shell: whatever s holds (quotes, $, ;, newlines) is
// taken literally.
func Quote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// QuoteAll quotes each of args and joins them with spaces: a command line whose words are
// exactly args.
func QuoteAll(args []string) string {
	q := make([]string, len(args))
	for i, a := range args {
		q[i] = Quote(a)
	}
	return strings.Join(q, " ")
}

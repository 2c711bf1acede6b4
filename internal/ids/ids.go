// Package ids makes the random identifiers of the gateway's rows, tokens and temp names.
package ids

import (
	"crypto/rand"
	"encoding/hex"
)

// Hex is n random bytes (crypto/rand) as 2n lower-case hex digits.
func Hex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // never fails (crypto/rand.Read panics rather than return short)
	return hex.EncodeToString(b)
}

// New is prefix followed by n random bytes in hex: "ses_" + 24 digits for n = 12.
func New(prefix string, n int) string { return prefix + Hex(n) }

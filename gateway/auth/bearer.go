// Package auth authenticates at the gateway's doors: the bearer scheme they share, the log of
// refused authentications (aggregated per source and minute), the Control UI's one-time sign-in
// codes and its browser sessions, and whether a request came over TLS.
package auth

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"net/http"
	"strings"
)

// Bearer returns the credentials of r's "Authorization: Bearer <token>" header. The scheme is
// matched without regard to case (RFC 9110 section 11.1): "bearer" and "BEARER" are "Bearer".
// ok is false when the header is missing, names another scheme or carries no token.
func Bearer(r *http.Request) (token string, ok bool) {
	h := r.Header.Get("Authorization")
	scheme, rest, found := strings.Cut(h, " ")
	if !found || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	token = strings.TrimLeft(rest, " ")
	return token, token != ""
}

// BearerIs reports whether r carries want as its bearer token (compared in constant time); an
// empty want matches nothing.
func BearerIs(r *http.Request, want string) bool {
	got, ok := Bearer(r)
	return ok && want != "" && subtle.ConstantTimeCompare([]byte(got), []byte(want)) == 1
}

// hash is the hex sha256 of a secret: what the tables store instead of it.
func hash(secret string) string {
	sum := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(sum[:])
}

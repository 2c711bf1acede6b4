// Package tokenfile keeps a bearer token in a file of its own, mode 0600: the gateway's API
// token, OCC's token and the MCP token, each in the data dir.
package tokenfile

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/openclaw/cloudworkers/internal/atomicfile"
)

// MinLen is the shortest token a file may hold: a shorter one is not a real token.
const MinLen = 32

// Read returns the token in path; a missing file is os.ErrNotExist. A token shorter than MinLen
// is an error naming path and fix, what the operator does about it.
func Read(path, fix string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	tok := strings.TrimSpace(string(b))
	if len(tok) < MinLen {
		return "", fmt.Errorf("token file %s is too short: %s", path, fix)
	}
	return tok, nil
}

// Ensure returns the token in path (Read), tightening the file's mode to 0600 when it allows
// more; without a file it writes a new token (New).
func Ensure(path, prefix, fix string) (string, error) {
	tok, err := Read(path, fix)
	if errors.Is(err, os.ErrNotExist) {
		return New(path, prefix)
	}
	if err != nil {
		return "", err
	}
	if fi, err := os.Stat(path); err == nil && fi.Mode().Perm()&0o077 != 0 {
		if err := os.Chmod(path, 0o600); err != nil {
			return "", err
		}
	}
	return tok, nil
}

// New writes a new token, prefix and 32 random bytes in hex, to path (mode 0600) and returns it;
// the token it replaces stops working for everyone who reads the file at each request.
func New(path, prefix string) (string, error) {
	var raw [32]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return "", err
	}
	tok := prefix + hex.EncodeToString(raw[:])
	if err := atomicfile.Write(path, []byte(tok+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("write token: %w", err)
	}
	return tok, nil
}

package openclaw

import (
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"strconv"
	"strings"
	"time"
)

// maxSignatureSkew bounds how far a device's signedAt may be from the challenge's time.
const maxSignatureSkew = 10 * time.Minute

// verifyDevice checks a connect's device identity against the challenge it answers: the id is the
// SHA-256 of the raw Ed25519 public key, and the signature covers the v3 payload (or, for older
// clients, the v2 one) bound to the challenge nonce. It returns a connect error detail code, or "".
func verifyDevice(d *device, p connectParams, token, nonce string, challengeAt time.Time) (code, msg string) {
	if d.Nonce == "" {
		return DetailDeviceNonceRequired, "device nonce required"
	}
	if d.Nonce != nonce {
		return DetailDeviceNonceMismatch, "device nonce mismatch"
	}
	raw, err := decodeB64(d.PublicKey)
	if err != nil || len(raw) != ed25519.PublicKeySize {
		return DetailDevicePublicKeyBad, "device public key invalid"
	}
	sum := sha256.Sum256(raw)
	if !strings.EqualFold(d.ID, hex.EncodeToString(sum[:])) {
		return DetailDeviceIDMismatch, "device identity mismatch"
	}
	if skew := time.UnixMilli(d.SignedAt).Sub(challengeAt); skew > maxSignatureSkew || skew < -maxSignatureSkew {
		return DetailDeviceSigExpired, "device signature expired"
	}
	sig, err := decodeB64(d.Signature)
	if err != nil || len(sig) != ed25519.SignatureSize {
		return DetailDeviceSigInvalid, "device signature invalid"
	}
	role := p.Role
	if role == "" {
		role = "operator"
	}
	fields := []string{d.ID, p.Client.ID, p.Client.Mode, role, strings.Join(p.Scopes, ","), strconv.FormatInt(d.SignedAt, 10), token, d.Nonce}
	v3 := strings.Join(append(append([]string{"v3"}, fields...), authMeta(p.Client.Platform), authMeta(p.Client.DeviceFamily)), "|")
	v2 := strings.Join(append([]string{"v2"}, fields...), "|")
	if ed25519.Verify(raw, []byte(v3), sig) || ed25519.Verify(raw, []byte(v2), sig) {
		return "", ""
	}
	return DetailDeviceSigInvalid, "device signature invalid"
}

// authMeta is normalizeDeviceMetadataForAuth: trimmed, ASCII upper case folded.
func authMeta(s string) string {
	s = strings.TrimSpace(s)
	return strings.Map(func(r rune) rune {
		if r >= 'A' && r <= 'Z' {
			return r + 32
		}
		return r
	}, s)
}

// decodeB64 reads base64url or standard base64, padded or not.
func decodeB64(s string) ([]byte, error) {
	s = strings.TrimRight(s, "=")
	s = strings.NewReplacer("+", "-", "/", "_").Replace(s)
	return base64.RawURLEncoding.DecodeString(s)
}

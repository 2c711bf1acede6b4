package openclaw

import (
	"encoding/json"
)

// ProtocolVersion is the protocol this endpoint speaks (OpenClaw's PROTOCOL_VERSION).
const ProtocolVersion = 4

// Error codes of the protocol (ErrorCodes in the openclaw package).
const (
	CodeInvalidRequest = "INVALID_REQUEST"
	CodeForbidden      = "FORBIDDEN"
	CodeUnavailable    = "UNAVAILABLE"
	CodeNotFound       = "NOT_FOUND"
	CodeAgentTimeout   = "AGENT_TIMEOUT"
)

// Connect error detail codes (ConnectErrorDetailCodes in the openclaw package).
const (
	DetailAuthTokenMissing      = "AUTH_TOKEN_MISSING"
	DetailAuthTokenMismatch     = "AUTH_TOKEN_MISMATCH"
	DetailAuthRateLimited       = "AUTH_RATE_LIMITED"
	DetailProtocolMismatch      = "PROTOCOL_MISMATCH"
	DetailDeviceIDMismatch      = "DEVICE_AUTH_DEVICE_ID_MISMATCH"
	DetailDeviceSigExpired      = "DEVICE_AUTH_SIGNATURE_EXPIRED"
	DetailDeviceNonceRequired   = "DEVICE_AUTH_NONCE_REQUIRED"
	DetailDeviceNonceMismatch   = "DEVICE_AUTH_NONCE_MISMATCH"
	DetailDeviceSigInvalid      = "DEVICE_AUTH_SIGNATURE_INVALID"
	DetailDevicePublicKeyBad    = "DEVICE_AUTH_PUBLIC_KEY_INVALID"
	DetailDeviceTokenMismatch   = "AUTH_DEVICE_TOKEN_MISMATCH"
	DetailAuthScopeMismatch     = "AUTH_SCOPE_MISMATCH"
	DetailControlUIOriginDenied = "CONTROL_UI_ORIGIN_NOT_ALLOWED"
)

// inFrame is a frame from a client: only requests are accepted after connect.
type inFrame struct {
	Type   string          `json:"type"`
	ID     string          `json:"id"`
	Method string          `json:"method"`
	Params json.RawMessage `json:"params"`
}

// errorShape is the protocol's error: {code, message, details?, retryable?, retryAfterMs?}.
type errorShape struct {
	Code         string `json:"code"`
	Message      string `json:"message"`
	Details      any    `json:"details,omitempty"`
	Retryable    bool   `json:"retryable,omitempty"`
	RetryAfterMs int64  `json:"retryAfterMs,omitempty"`
}

func (e *errorShape) Error() string { return e.Code + ": " + e.Message }

func errf(code, msg string) *errorShape { return &errorShape{Code: code, Message: msg} }

type resFrame struct {
	Type    string      `json:"type"`
	ID      string      `json:"id"`
	OK      bool        `json:"ok"`
	Payload any         `json:"payload,omitempty"`
	Error   *errorShape `json:"error,omitempty"`
}

type eventFrame struct {
	Type    string `json:"type"`
	Event   string `json:"event"`
	Payload any    `json:"payload,omitempty"`
	Seq     uint64 `json:"seq,omitempty"`
}

// connectParams are the fields of a connect request this endpoint reads.
type connectParams struct {
	MinProtocol int      `json:"minProtocol"`
	MaxProtocol int      `json:"maxProtocol"`
	Client      client   `json:"client"`
	Role        string   `json:"role"`
	Scopes      []string `json:"scopes"`
	Auth        *struct {
		Token       string `json:"token"`
		Password    string `json:"password"`
		DeviceToken string `json:"deviceToken"`
	} `json:"auth"`
	Device *device `json:"device"`
}

type client struct {
	ID           string `json:"id"`
	DisplayName  string `json:"displayName"`
	Version      string `json:"version"`
	Platform     string `json:"platform"`
	DeviceFamily string `json:"deviceFamily"`
	Mode         string `json:"mode"`
	InstanceID   string `json:"instanceId"`
}

type device struct {
	ID        string `json:"id"`
	PublicKey string `json:"publicKey"`
	Signature string `json:"signature"`
	SignedAt  int64  `json:"signedAt"`
	Nonce     string `json:"nonce"`
}

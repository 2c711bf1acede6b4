package occ

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
)

// Error is a failure a method reports to OCC; it is written as
// {"error":{"code","message","retryable"}} with Status as the HTTP status. Messages never carry
// credentials, provider output or another namespace's values.
type Error struct {
	Status    int    `json:"-"`
	Code      string `json:"code"`
	Message   string `json:"message"`
	Retryable bool   `json:"retryable"`
}

func (e *Error) Error() string { return e.Code + ": " + e.Message }

// Error codes of the adapter itself (methods add their own, e.g. PROVISIONING_REJECTED).
const (
	CodeInvalid               = "INVALID_INPUT"
	CodeUnknownMethod         = "UNKNOWN_METHOD"
	CodeNotImplemented        = "NOT_IMPLEMENTED"
	CodeUnauthorized          = "UNAUTHORIZED"
	CodeDependencyUnavailable = "DEPENDENCY_UNAVAILABLE"
	CodeBodyTooLarge          = "BODY_TOO_LARGE"
)

// Invalid is a 400 naming the field that was wrong, e.g. Invalid("revision.id", "is required").
func Invalid(field, msg string) *Error {
	return &Error{Status: http.StatusBadRequest, Code: CodeInvalid, Message: field + ": " + msg}
}

// Invalidf is Invalid with a format.
func Invalidf(field, format string, args ...any) *Error {
	return Invalid(field, fmt.Sprintf(format, args...))
}

// Permanent is a 409: a failure that repeating the same call will not fix (PROVISIONING_REJECTED,
// a foreign or unmapped namespace, …).
func Permanent(code, msg string) *Error {
	return &Error{Status: http.StatusConflict, Code: code, Message: msg}
}

// NotImplemented is a 501 for a method this driver does not implement.
func NotImplemented(method string) *Error {
	return &Error{Status: http.StatusNotImplemented, Code: CodeNotImplemented, Message: method + " is not implemented by this driver"}
}

// Retryable is a 503: a dependency failed, the same call may succeed later.
func Retryable(code, msg string) *Error {
	return &Error{Status: http.StatusServiceUnavailable, Code: code, Message: msg, Retryable: true}
}

// asError turns what a method returned into the error written to OCC. An error that is not an
// *Error is never shown (it may carry provider output): it becomes a retryable dependency
// failure with a fixed message, and the caller logs it.
func asError(err error) (e *Error, raw bool) {
	if errors.As(err, &e) {
		return e, false
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return Retryable(CodeDependencyUnavailable, "the call was cancelled or timed out; repeat it"), true
	}
	return Retryable(CodeDependencyUnavailable, "a gateway dependency failed; repeat the call (the gateway log has the cause)"), true
}

// Bind decodes a method's body into dst (a struct whose JSON tags are the TypeScript parameter
// names). A value of the wrong type is a 400 naming the field; unknown keys are ignored (OCC's
// types grow).
func Bind(body json.RawMessage, dst any) error {
	if err := json.Unmarshal(body, dst); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			field := te.Field
			if field == "" {
				field = "body"
			}
			return Invalidf(field, "must be %s, got a JSON %s", jsonKind(te.Type.Kind().String()), te.Value)
		}
		return Invalid("body", "is not valid JSON")
	}
	return nil
}

func jsonKind(goKind string) string {
	switch {
	case goKind == "string":
		return "a string"
	case goKind == "bool":
		return "a boolean"
	case strings.HasPrefix(goKind, "int"), strings.HasPrefix(goKind, "uint"), strings.HasPrefix(goKind, "float"):
		return "a number"
	case goKind == "slice" || goKind == "array":
		return "an array"
	default:
		return "an object"
	}
}

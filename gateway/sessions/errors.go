package sessions

import (
	"errors"
	"fmt"

	"github.com/openclaw/cloudworkers/gateway/store"
	"github.com/openclaw/cloudworkers/protocol"
)

// CodeResyncRequired answers a live event whose seq skips ahead of the gateway's ACK cursor.
const CodeResyncRequired = protocol.CodeResyncRequired

// ErrNotFound is returned (wrapped in an *Error with CodeSessionNotAttached) for an unknown session.
var ErrNotFound = store.ErrNotFound

// Error is a rejected session operation. Code is what a worker sees in its res frame.
type Error struct {
	Code    protocol.Code
	Message string
	// AckedSeq and ExpectedSeq are set with CodeResyncRequired: the worker resumes at ExpectedSeq.
	AckedSeq    uint64
	ExpectedSeq uint64
	// LeafID is the session's current leaf, set with CodeStaleBaseLeaf.
	LeafID string
	Err    error
}

func (e *Error) Error() string {
	if e.Message == "" {
		return string(e.Code)
	}
	return string(e.Code) + ": " + e.Message
}

func (e *Error) Unwrap() error { return e.Err }

// Protocol converts the error into the error object of a res frame.
func (e *Error) Protocol() *protocol.Error {
	return &protocol.Error{Code: e.Code, Message: e.Message, AckedSeq: e.AckedSeq, ExpectedSeq: e.ExpectedSeq, LeafID: e.LeafID}
}

func errorf(code protocol.Code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

func notFound(id string) *Error {
	return &Error{Code: protocol.CodeSessionNotAttached, Message: fmt.Sprintf("session %.128q not found", id),
		Err: fmt.Errorf("session %.128q: %w", id, store.ErrNotFound)}
}

// CodeOf returns the protocol code of err, or "" when err is not an *Error.
func CodeOf(err error) protocol.Code {
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return ""
}

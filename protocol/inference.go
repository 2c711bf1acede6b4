package protocol

import (
	"encoding/json"
	"errors"
	"fmt"
)

// Inference proxy and worker turn methods.
const (
	// MethodInferenceStart asks the gateway to make one model call (InferenceStartParams).
	MethodInferenceStart = "worker.inference.start"
	// MethodInferenceEvent is the gateway's event frame carrying one stream event (InferenceEventPayload).
	MethodInferenceEvent = "worker.inference.event"
	// MethodInferenceTerminal is the gateway's event frame ending a call (InferenceTerminal).
	MethodInferenceTerminal = "worker.inference.terminal"
	// MethodInferenceCredit raises the byte offset up to which the gateway may send a call's events
	// (InferenceCreditParams).
	MethodInferenceCredit = "worker.inference.credit"
	// MethodInferenceCancel abandons a call; the provider request is closed (InferenceCancelParams).
	MethodInferenceCancel = "worker.inference.cancel"
	// MethodTranscriptContext returns a session's context (TranscriptContextParams, TranscriptContextResult).
	MethodTranscriptContext = "worker.transcript.context"
	// MethodTurnStart is the gateway's request telling a worker to run a turn (TurnStartParams).
	MethodTurnStart = "worker.turn.start"
	// MethodTurnCancel is the gateway's request cancelling a worker's running turn (TurnCancelParams).
	MethodTurnCancel = "worker.turn.cancel"
	// MethodTurnStatus is the gateway's question whether a worker still runs a turn
	// (TurnCancelParams; TurnStatusResult): asked when a worker comes back during one of its
	// turns, since a worker that was relaunched lost the run it had.
	MethodTurnStatus = "worker.turn.status"
)

// Inference limits, checked by the gateway before anything reaches a provider (invalid-context).
const (
	MaxInferenceMessages = 1024
	MaxInferenceTools    = 256
	// MaxInferenceRequestBytes bounds the params of one worker.inference.start.
	MaxInferenceRequestBytes = 16 << 20
	// DefaultInferenceWindow is the initial credit of a call when the worker names none.
	DefaultInferenceWindow = 256 << 10
	maxTurnIDLen           = 128
)

// Inference error codes.
const (
	CodeModelNotApproved Code = "model-not-approved"
	CodeInvalidContext   Code = "invalid-context"
	// CodeBusy answers a request for something already in progress (a turn, a call).
	CodeBusy Code = "busy"
	// CodeCredentialUnavailable refuses a call whose environment serves an OCC revision that has no
	// usable credential for the model's provider (withdrawn, removed or never attached).
	CodeCredentialUnavailable Code = "credential-unavailable"
)

// Statuses of a worker.inference.start answer.
const (
	InferenceAccepted = "accepted"
	InferenceReplayed = "replayed"
)

// InferenceOptions are the constrained options a worker may set on a call.
type InferenceOptions struct {
	Temperature *float64 `json:"temperature,omitempty"`
	MaxTokens   int      `json:"maxTokens,omitempty"`
	Reasoning   string   `json:"reasoning,omitempty"`
}

// InferenceStartParams are the params of worker.inference.start. The schema is closed: a worker
// cannot name a base URL, a header or a model object; ModelRef is looked up in the gateway's catalog.
type InferenceStartParams struct {
	SessionID  string `json:"sessionId"`
	OwnerEpoch uint64 `json:"ownerEpoch"`
	RunEpoch   uint64 `json:"runEpoch"`
	RunID      string `json:"runId"`
	// TurnID names the call within the run; (session, runEpoch, turnId) is its identity for replay.
	TurnID   string           `json:"turnId"`
	ModelRef string           `json:"modelRef"`
	Context  Context          `json:"context"`
	Options  InferenceOptions `json:"options"`
	// Credit is the initial byte offset the gateway may send up to; 0 means DefaultInferenceWindow.
	Credit uint64 `json:"credit,omitempty"`
}

// Validate checks identity and limits; its errors are invalid-context.
func (p InferenceStartParams) Validate() error {
	switch {
	case badSessionID(p.SessionID):
		return errSessionID
	case p.TurnID == "" || len(p.TurnID) > maxTurnIDLen:
		return fmt.Errorf("turnId must be 1..%d bytes", maxTurnIDLen)
	case len(p.RunID) > maxRunIDLen:
		return errRunID
	case p.OwnerEpoch == 0 || p.RunEpoch == 0:
		return errors.New("ownerEpoch and runEpoch start at 1")
	case p.ModelRef == "" || len(p.ModelRef) > 256:
		return errors.New("modelRef must be 1..256 bytes")
	case len(p.Context.Messages) == 0:
		return errors.New("context has no messages")
	case len(p.Context.Messages) > MaxInferenceMessages:
		return fmt.Errorf("context has %d messages, at most %d", len(p.Context.Messages), MaxInferenceMessages)
	case len(p.Context.Tools) > MaxInferenceTools:
		return fmt.Errorf("context has %d tools, at most %d", len(p.Context.Tools), MaxInferenceTools)
	case p.Options.MaxTokens < 0:
		return errors.New("options.maxTokens must not be negative")
	}
	for i, m := range p.Context.Messages {
		if err := m.Validate(); err != nil {
			return fmt.Errorf("messages[%d]: %w", i, err)
		}
	}
	return nil
}

// CallKey is the call's identity within its session.
func (p InferenceStartParams) CallKey() string {
	return fmt.Sprintf("%s\x00%d\x00%s", p.SessionID, p.RunEpoch, p.TurnID)
}

// InferenceStartResult answers worker.inference.start. With status replayed the call already ended
// and Terminal is its cached result; nothing is sent to the provider again.
type InferenceStartResult struct {
	Status   string             `json:"status"`
	Terminal *InferenceTerminal `json:"terminal,omitempty"`
}

// InferenceEventPayload is the payload of a worker.inference.event frame. Seq counts a call's
// events from 1.
type InferenceEventPayload struct {
	SessionID string      `json:"sessionId"`
	RunID     string      `json:"runId"`
	TurnID    string      `json:"turnId"`
	Seq       uint64      `json:"seq"`
	Event     StreamEvent `json:"event"`
}

// InferenceTerminal ends a call: exactly one of Done and Error is set.
type InferenceTerminal struct {
	SessionID string          `json:"sessionId"`
	RunID     string          `json:"runId"`
	TurnID    string          `json:"turnId"`
	Done      *InferenceDone  `json:"done,omitempty"`
	Error     *InferenceError `json:"error,omitempty"`
}

// InferenceDone is a call that finished; Message is the final assistant message.
type InferenceDone struct {
	Message Message `json:"message"`
}

// InferenceError is a call that failed. Reason is error or aborted; Message, when set, is the
// partial assistant message (stopReason error|aborted), so the transcript records it.
type InferenceError struct {
	Reason       string   `json:"reason"`
	ErrorMessage string   `json:"message"`
	Usage        *Usage   `json:"usage,omitempty"`
	Partial      *Message `json:"partial,omitempty"`
}

// InferenceCreditParams are the params of worker.inference.credit: Limit is a cumulative byte offset.
type InferenceCreditParams struct {
	SessionID string `json:"sessionId"`
	TurnID    string `json:"turnId"`
	RunEpoch  uint64 `json:"runEpoch"`
	Limit     uint64 `json:"limit"`
}

// InferenceCancelParams are the params of worker.inference.cancel.
type InferenceCancelParams struct {
	SessionID string `json:"sessionId"`
	TurnID    string `json:"turnId"`
	RunEpoch  uint64 `json:"runEpoch"`
}

// TranscriptContextParams are the params of worker.transcript.context.
type TranscriptContextParams struct {
	SessionID  string `json:"sessionId"`
	OwnerEpoch uint64 `json:"ownerEpoch"`
}

// TranscriptContextResult is the session's context: its messages root first (leaf → root walk) and leaf.
type TranscriptContextResult struct {
	Messages []Message `json:"messages"`
	LeafID   string    `json:"leafId"`
}

// TurnStartParams are the params of the gateway's worker.turn.start request. Workspace is an
// absolute directory on the box ("" means the worker's default for the session).
type TurnStartParams struct {
	SessionID  string `json:"sessionId"`
	OwnerEpoch uint64 `json:"ownerEpoch"`
	RunEpoch   uint64 `json:"runEpoch"`
	RunID      string `json:"runId"`
	ModelRef   string `json:"modelRef"`
	Text       string `json:"text"`
	Workspace  string `json:"workspace,omitempty"`
	// GatewayTools are the schemas of gateway-resident tools (web_search) the turn may call with
	// worker.tool.call; they run on the gateway, with its credentials.
	GatewayTools []Tool `json:"gatewayTools,omitempty"`
	// Continue goes on with a turn that an earlier owner stopped at a model-call boundary (a live
	// move): the run starts with a model call on the transcript as it is, with no new user
	// message (Text is empty).
	Continue bool `json:"continue,omitempty"`
}

// TurnStatusResult answers worker.turn.status.
type TurnStatusResult struct {
	Running bool `json:"running"`
}

// MethodToolCall is a worker's request to run a gateway-resident tool (ToolCallParams).
const MethodToolCall = "worker.tool.call"

// ToolCallParams are the params of worker.tool.call.
type ToolCallParams struct {
	SessionID  string          `json:"sessionId"`
	OwnerEpoch uint64          `json:"ownerEpoch"`
	RunID      string          `json:"runId"`
	ToolCallID string          `json:"toolCallId"`
	Name       string          `json:"name"`
	Arguments  json.RawMessage `json:"arguments"`
}

// maxToolCallIDLen bounds a tool call id (the model's; providers use a few dozen bytes).
const maxToolCallIDLen = 256

// Validate checks the ids of a worker.tool.call (or of the call a worker.sessions.spawn makes): a
// session id of 1..128 bytes, a run id and tool name of at most 128, a tool call id of 1..256.
func (p ToolCallParams) Validate() error {
	switch {
	case badSessionID(p.SessionID):
		return errSessionID
	case len(p.RunID) > maxRunIDLen:
		return errRunID
	case p.ToolCallID == "" || len(p.ToolCallID) > maxToolCallIDLen:
		return fmt.Errorf("toolCallId must be 1..%d bytes", maxToolCallIDLen)
	case len(p.Name) > maxIDLen:
		return fmt.Errorf("tool name longer than %d bytes", maxIDLen)
	}
	return nil
}

// ToolCallResult is the result of worker.tool.call, as the tool gave it.
type ToolCallResult struct {
	Content []Content       `json:"content"`
	Details json.RawMessage `json:"details,omitempty"`
	IsError bool            `json:"isError,omitempty"`
}

// TurnStartResult acknowledges worker.turn.start; the turn's outcome arrives as its lifecycle events.
type TurnStartResult struct {
	Accepted bool `json:"accepted"`
}

// TurnCancelParams are the params of worker.turn.cancel.
type TurnCancelParams struct {
	SessionID string `json:"sessionId"`
	RunID     string `json:"runId"`
}

// InferenceCreditCost is the credit one worker.inference.event frame takes: its payload's length,
// capped at half the window. A receiver grants again once less than half its window is left, so a
// cost of at most half the window is always granted eventually, and one large event (a text_end
// carrying the whole text) cannot stall a call.
func InferenceCreditCost(payloadLen int, window uint64) uint64 {
	return min(uint64(payloadLen), max(window/2, 1))
}

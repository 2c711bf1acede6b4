package protocol

import (
	"encoding/json"
	"fmt"
)

// LiveEventType discriminates the LiveEvent union.
type LiveEventType string

// Live event types.
const (
	LiveTextDelta      LiveEventType = "text_delta"      // Delta
	LiveThinkingDelta  LiveEventType = "thinking_delta"  // Delta
	LiveToolStart      LiveEventType = "tool_start"      // ToolCallID, ToolName, Args?
	LiveToolUpdate     LiveEventType = "tool_update"     // ToolCallID, ToolName?, PartialResult
	LiveToolResult     LiveEventType = "tool_result"     // ToolCallID, ToolName?, Result?, IsError?
	LiveLifecycleStart LiveEventType = "lifecycle_start" // nothing else
	LiveLifecycleEnd   LiveEventType = "lifecycle_end"   // nothing else
	LiveLifecycleError LiveEventType = "lifecycle_error" // Error
)

// Lifecycle reports whether t is a run lifecycle event.
func (t LiveEventType) Lifecycle() bool {
	return t == LiveLifecycleStart || t == LiveLifecycleEnd || t == LiveLifecycleError
}

// LiveEvent is the typed union of the live events of a run: what the agent loop publishes (on the
// gateway, or from a worker in worker.live-event) and what subscribers receive. Only the fields of
// its Type may be set.
type LiveEvent struct {
	Type          LiveEventType   `json:"type"`
	Delta         string          `json:"delta,omitempty"`
	ToolCallID    string          `json:"toolCallId,omitempty"`
	ToolName      string          `json:"toolName,omitempty"`
	Args          json.RawMessage `json:"args,omitempty"`
	PartialResult json.RawMessage `json:"partialResult,omitempty"`
	Result        json.RawMessage `json:"result,omitempty"`
	IsError       bool            `json:"isError,omitempty"`
	Error         string          `json:"error,omitempty"`
}

// Validate checks that the event has the fields its type requires and no others.
func (e LiveEvent) Validate() error {
	set := map[string]bool{
		"delta": e.Delta != "", "toolCallId": e.ToolCallID != "", "toolName": e.ToolName != "",
		"args": len(e.Args) > 0, "partialResult": len(e.PartialResult) > 0, "result": len(e.Result) > 0,
		"isError": e.IsError, "error": e.Error != "",
	}
	var required, optional []string
	switch e.Type {
	case LiveTextDelta, LiveThinkingDelta:
		required = []string{"delta"}
	case LiveToolStart:
		required, optional = []string{"toolCallId", "toolName"}, []string{"args"}
	case LiveToolUpdate:
		required, optional = []string{"toolCallId", "partialResult"}, []string{"toolName"}
	case LiveToolResult:
		required, optional = []string{"toolCallId"}, []string{"toolName", "result", "isError"}
	case LiveLifecycleStart, LiveLifecycleEnd:
	case LiveLifecycleError:
		required = []string{"error"}
	default:
		return fmt.Errorf("unknown live event type %.32q", string(e.Type))
	}
	for _, k := range required {
		if !set[k] {
			return fmt.Errorf("%s event: missing %s", e.Type, k)
		}
		delete(set, k)
	}
	for _, k := range optional {
		delete(set, k)
	}
	for k, v := range set {
		if v {
			return fmt.Errorf("%s event: field %s belongs to another event type", e.Type, k)
		}
	}
	for name, raw := range map[string]json.RawMessage{"args": e.Args, "partialResult": e.PartialResult, "result": e.Result} {
		if len(raw) > 0 && !json.Valid(raw) {
			return fmt.Errorf("%s event: %s is not JSON", e.Type, name)
		}
	}
	return nil
}

// LiveEventParams are the params of worker.live-event; LastAckedSeq is the worker's view of the
// cumulative ACK.
type LiveEventParams struct {
	Scope
	LastAckedSeq uint64    `json:"lastAckedSeq"`
	Event        LiveEvent `json:"event"`
}

// LiveEventResult answers worker.live-event with the stream's cumulative ACK.
type LiveEventResult struct {
	AckedSeq uint64 `json:"ackedSeq"`
}

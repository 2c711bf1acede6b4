package protocol

import (
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"
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
	// LiveLifecycleYield ends a run that stopped at a model-call boundary for a live move; its turn
	// goes on (the same run id) with LiveLifecycleResume on the session's next owner. A watcher
	// sees one turn: neither is its start or its end.
	LiveLifecycleYield  LiveEventType = "lifecycle_yield"  // nothing else
	LiveLifecycleResume LiveEventType = "lifecycle_resume" // nothing else
)

// Lifecycle reports whether t is a run lifecycle event.
func (t LiveEventType) Lifecycle() bool {
	switch t {
	case LiveLifecycleStart, LiveLifecycleEnd, LiveLifecycleError, LiveLifecycleYield, LiveLifecycleResume:
		return true
	}
	return false
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
	// StoppedProcesses, on lifecycle_end, lifecycle_error and lifecycle_yield, counts the processes the run's
	// commands left running (detached ones included) that its end stopped. Shown, never acted on.
	StoppedProcesses int `json:"stoppedProcesses,omitempty"`
}

// MaxLiveEventBytes bounds what one live event carries: its delta, ids, names, args, results and
// error together. The gateway keeps the newest events of every session in memory and in SQLite
// for replay; a worker cannot make it keep more than this per event. Fit cuts an event to it.
const MaxLiveEventBytes = 64 << 10

// size is what the event carries, as MaxLiveEventBytes counts it.
func (e LiveEvent) size() int {
	return len(e.Delta) + len(e.ToolCallID) + len(e.ToolName) + len(e.Args) + len(e.PartialResult) + len(e.Result) + len(e.Error)
}

// maxLiveName bounds a tool call id or tool name that Fit keeps.
const maxLiveName = 256

// Fit returns e cut to MaxLiveEventBytes for the live view, unchanged when it fits (but for
// invalid UTF-8, replaced as JSON would): the fields over an equal share of the bytes are cut to
// it, a delta to its first bytes, an error to its last, an args or result to a JSON string of its
// first bytes that gives its size. Live events are what a run
// shows while it goes on; the transcript keeps the whole message.
func (e LiveEvent) Fit() LiveEvent {
	// measured as the gateway will decode them: JSON carries an invalid byte as U+FFFD (3 bytes)
	for _, t := range []*string{&e.Delta, &e.Error, &e.ToolCallID, &e.ToolName} {
		*t = strings.ToValidUTF8(*t, "\uFFFD")
	}
	if e.size() <= MaxLiveEventBytes {
		return e
	}
	e.ToolCallID, e.ToolName = cutText(e.ToolCallID, maxLiveName), cutText(e.ToolName, maxLiveName)
	texts := []*string{&e.Delta, &e.Error}
	raws := []*json.RawMessage{&e.Args, &e.PartialResult, &e.Result}
	n := 0
	for _, t := range texts {
		if *t != "" {
			n++
		}
	}
	for _, r := range raws {
		if len(*r) > 0 {
			n++
		}
	}
	share := (MaxLiveEventBytes - len(e.ToolCallID) - len(e.ToolName)) / max(n, 1)
	e.Delta = cutText(e.Delta, share)
	e.Error = cutTail(e.Error, share) // an error's cause is at its end ("…: context canceled")
	for _, r := range raws {
		if len(*r) > share {
			*r = cutJSON(*r, share)
		}
	}
	return e
}

// cutText returns the longest prefix of s of at most n bytes that ends on a UTF-8 boundary.
func cutText(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// cutTail returns the longest suffix of s of at most n bytes that starts on a UTF-8 boundary,
// after "…" when it cut something.
func cutTail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	i := len(s) - max(n-len("…"), 0)
	for i < len(s) && !utf8.RuneStart(s[i]) {
		i++
	}
	return "…" + s[i:]
}

// cutJSON returns raw as a JSON string of at most n bytes: its first bytes and its size.
func cutJSON(raw json.RawMessage, n int) json.RawMessage {
	for k := n / 2; k > 0; k /= 2 {
		b, _ := json.Marshal(fmt.Sprintf("%s… [%d bytes, cut for the live view]", strings.ToValidUTF8(cutText(string(raw), k), ""), len(raw)))
		if len(b) <= n {
			return b
		}
	}
	b, _ := json.Marshal(fmt.Sprintf("[%d bytes]", len(raw)))
	return b
}

// Validate checks that the event is within MaxLiveEventBytes and has the fields its type requires
// and no others.
func (e LiveEvent) Validate() error {
	if n := e.size(); n > MaxLiveEventBytes {
		return fmt.Errorf("%.32s event of %d bytes, at most %d", e.Type, n, MaxLiveEventBytes)
	}
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
	case LiveLifecycleStart, LiveLifecycleEnd, LiveLifecycleYield, LiveLifecycleResume:
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

package inference

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/openclaw/cloudworkers/internal/untrusted"
	"github.com/openclaw/cloudworkers/protocol"
)

// Reasoning levels of Options.Reasoning ("" and "off" disable thinking).
const (
	ReasoningOff     = "off"
	ReasoningMinimal = "minimal"
	ReasoningLow     = "low"
	ReasoningMedium  = "medium"
	ReasoningHigh    = "high"
)

// Options are the constrained call options a session may set.
type Options struct {
	Temperature *float64 `json:"temperature,omitempty"`
	// MaxTokens bounds the output; 0 means the model's maxTokens (else 4096).
	MaxTokens int    `json:"maxTokens,omitempty"`
	Reasoning string `json:"reasoning,omitempty"`
	// Session is the session the call belongs to (set by the gateway, never by a worker or a
	// client): the prompt-cache key derives from it, so it is the same on every placement.
	Session string `json:"-"`
}

// ValidReasoning reports whether r is a known reasoning level.
func ValidReasoning(r string) bool {
	switch r {
	case "", ReasoningOff, ReasoningMinimal, ReasoningLow, ReasoningMedium, ReasoningHigh:
		return true
	}
	return false
}

// Call is one model call as an adapter sees it.
type Call struct {
	Model   Model
	Context protocol.Context
	Options Options
	// APIKey is the provider credential's value (empty when the provider has none). Adapters send it
	// only in the provider's auth header; it never appears in an event, an error or a log.
	APIKey string
}

// CacheKey is the call's prompt-cache key: stable for a session wherever its loop runs, and ""
// for a call of no session (a probe). It is a digest, so the provider never sees the session id.
func (c Call) CacheKey() string {
	if c.Options.Session == "" {
		return ""
	}
	sum := sha256.Sum256([]byte("openclaw prompt cache\x00" + c.Options.Session))
	return "oc-" + hex.EncodeToString(sum[:12])
}

// MaxTokens is the output bound of the call.
func (c Call) MaxTokens() int {
	switch {
	case c.Options.MaxTokens > 0 && (c.Model.MaxTokens == 0 || c.Options.MaxTokens <= c.Model.MaxTokens):
		return c.Options.MaxTokens
	case c.Model.MaxTokens > 0:
		return c.Model.MaxTokens
	}
	return 4096
}

// Emit receives the events of a call in order. An error from Emit stops the call: the provider stream
// is closed and Stream returns that error without a terminal event.
type Emit func(protocol.StreamEvent) error

// Adapter streams a model call of one API kind.
//
// Stream emits start, then the content events (text_*, thinking_*, toolcall_* with contentIndex), then
// exactly one terminal event: done {reason stop|length|toolUse, message} or error {reason error|aborted,
// message with errorMessage}. It returns the final message (the one in the terminal event); the error
// is non-nil when the terminal event was an error (a *CallError) or Emit failed. Cancelling ctx closes
// the provider's HTTP stream and ends the call with reason aborted.
type Adapter interface {
	Stream(ctx context.Context, call Call, emit Emit) (protocol.Message, error)
}

// CallError is the error returned by a failed call; Message is sanitized (bounded, credential-free).
type CallError struct {
	// Reason is protocol.StopError or protocol.StopAborted.
	Reason  string
	Message string
	// Status is the provider's HTTP status when it refused the request (0 otherwise).
	Status int
	// RetryAfter is the provider's Retry-After hint, if any.
	RetryAfter time.Duration
}

func (e *CallError) Error() string { return e.Message }

// ProviderError is an adapter's description of a provider failure, turned into a CallError by
// Builder.Fail.
type ProviderError struct {
	Status     int
	RetryAfter time.Duration
	Message    string
}

func (e *ProviderError) Error() string {
	if e.Status != 0 {
		return fmt.Sprintf("HTTP %d: %s", e.Status, e.Message)
	}
	return e.Message
}

// NewProviderError describes a refused request from its status, the provider's message and the
// headers of its response (nil when there was none).
func NewProviderError(status int, resp *http.Response, message string) *ProviderError {
	e := &ProviderError{Status: status, Message: message}
	if e.Message == "" {
		e.Message = http.StatusText(status)
	}
	if resp != nil {
		h := resp.Header
		if ms, err := strconv.ParseFloat(h.Get("Retry-After-Ms"), 64); err == nil && ms >= 0 {
			e.RetryAfter = time.Duration(ms * float64(time.Millisecond))
		} else if s, err := strconv.ParseFloat(h.Get("Retry-After"), 64); err == nil && s >= 0 {
			e.RetryAfter = time.Duration(s * float64(time.Second))
		} else if t, err := http.ParseTime(h.Get("Retry-After")); err == nil {
			e.RetryAfter = max(0, time.Until(t))
		}
	}
	return e
}

// maxErrorMessage bounds provider text copied into an error.
const maxErrorMessage = 512

// Sanitize bounds s, removes control characters and every occurrence of secret.
func Sanitize(s, secret string) string {
	return untrusted.RedactedLine(s, secret, maxErrorMessage)
}

// ApplyCost fills TotalTokens and Cost of u from per-million prices.
func (c Cost) ApplyCost(u *protocol.Usage) {
	u.TotalTokens = u.Input + u.Output + u.CacheRead + u.CacheWrite
	u.Cost = protocol.Cost{
		Input:      float64(u.Input) * c.Input / 1e6,
		Output:     float64(u.Output) * c.Output / 1e6,
		CacheRead:  float64(u.CacheRead) * c.CacheRead / 1e6,
		CacheWrite: float64(u.CacheWrite) * c.CacheWrite / 1e6,
	}
	u.Cost.Total = u.Cost.Input + u.Cost.Output + u.Cost.CacheRead + u.Cost.CacheWrite
}

// Builder assembles the assistant message of a call and emits the matching events. Adapters map
// their provider's stream onto its methods. Methods after a failed Emit do nothing and return the
// Emit error.
type Builder struct {
	call    Call
	emit    Emit
	msg     protocol.Message
	open    []bool
	args    []strings.Builder
	usage   protocol.Usage
	emitErr error
	started bool
}

// NewBuilder starts the message of call.
func NewBuilder(call Call, emit Emit) *Builder {
	return &Builder{call: call, emit: emit, msg: protocol.Message{
		Role: protocol.RoleAssistant, Content: []protocol.Content{}, API: string(call.Model.API),
		Provider: call.Model.Provider, Model: call.Model.ID, Timestamp: time.Now().UnixMilli(),
	}}
}

func (b *Builder) send(ev protocol.StreamEvent) error {
	if b.emitErr != nil {
		return b.emitErr
	}
	if err := b.emit(ev); err != nil {
		b.emitErr = err
	}
	return b.emitErr
}

func (b *Builder) snapshot() *protocol.Message {
	m := b.msg
	m.Content = make([]protocol.Content, len(b.msg.Content))
	copy(m.Content, b.msg.Content)
	return &m
}

// Start emits the start event (once).
func (b *Builder) Start() error {
	if b.started {
		return b.emitErr
	}
	b.started = true
	return b.send(protocol.StreamEvent{Type: protocol.EventStart, Message: b.snapshot()})
}

// Err is the Emit error that stopped the call, if any.
func (b *Builder) Err() error { return b.emitErr }

// SetUsage records token counts (cost is computed from the catalog at the end).
func (b *Builder) SetUsage(u protocol.Usage) { b.usage = u }

// Usage returns the usage recorded so far.
func (b *Builder) Usage() protocol.Usage { return b.usage }

func (b *Builder) begin(c protocol.Content, typ string) (int, error) {
	if err := b.Start(); err != nil {
		return -1, err
	}
	i := len(b.msg.Content)
	b.msg.Content = append(b.msg.Content, c)
	b.open = append(b.open, true)
	b.args = append(b.args, strings.Builder{})
	ev := protocol.StreamEvent{Type: typ, ContentIndex: i}
	if c.Type == protocol.ContentToolCall {
		ev.ToolCall = &protocol.Content{Type: c.Type, ID: c.ID, Name: c.Name}
	}
	return i, b.send(ev)
}

// BeginText opens a text block and returns its content index.
func (b *Builder) BeginText() (int, error) {
	return b.begin(protocol.Content{Type: protocol.ContentText}, protocol.EventTextStart)
}

// BeginThinking opens a thinking block.
func (b *Builder) BeginThinking() (int, error) {
	return b.begin(protocol.Content{Type: protocol.ContentThinking}, protocol.EventThinkingStart)
}

// BeginToolCall opens a tool call block.
func (b *Builder) BeginToolCall(id, name string) (int, error) {
	return b.begin(protocol.Content{Type: protocol.ContentToolCall, ID: id, Name: name}, protocol.EventToolCallStart)
}

// Delta appends to an open block; empty deltas are dropped.
func (b *Builder) Delta(i int, s string) error {
	if b.emitErr != nil || s == "" {
		return b.emitErr
	}
	if i < 0 || i >= len(b.open) || !b.open[i] {
		return fmt.Errorf("delta for content %d, which is not open", i)
	}
	c := &b.msg.Content[i]
	var typ string
	switch c.Type {
	case protocol.ContentText:
		c.Text += s
		typ = protocol.EventTextDelta
	case protocol.ContentThinking:
		c.Thinking += s
		typ = protocol.EventThinkingDelta
	case protocol.ContentToolCall:
		b.args[i].WriteString(s)
		typ = protocol.EventToolCallDelta
	}
	return b.send(protocol.StreamEvent{Type: typ, ContentIndex: i, Delta: s})
}

// SetToolCall fills a tool call's id or name that arrived after its start (OpenAI streams them late).
func (b *Builder) SetToolCall(i int, id, name string) {
	if i >= 0 && i < len(b.msg.Content) && b.msg.Content[i].Type == protocol.ContentToolCall {
		if id != "" {
			b.msg.Content[i].ID = id
		}
		if name != "" {
			b.msg.Content[i].Name = name
		}
	}
}

// End closes a block (closing twice is a no-op).
func (b *Builder) End(i int) error {
	if b.emitErr != nil {
		return b.emitErr
	}
	if i < 0 || i >= len(b.open) || !b.open[i] {
		return nil
	}
	b.open[i] = false
	c := &b.msg.Content[i]
	switch c.Type {
	case protocol.ContentText:
		return b.send(protocol.StreamEvent{Type: protocol.EventTextEnd, ContentIndex: i, Content: c.Text})
	case protocol.ContentThinking:
		return b.send(protocol.StreamEvent{Type: protocol.EventThinkingEnd, ContentIndex: i, Content: c.Thinking})
	default:
		c.Arguments = toolArguments(b.args[i].String())
		tc := *c
		return b.send(protocol.StreamEvent{Type: protocol.EventToolCallEnd, ContentIndex: i, ToolCall: &tc})
	}
}

// toolArguments returns the streamed arguments if they are a JSON object, else {} (a model that
// produced broken JSON then gets a tool error about missing parameters).
func toolArguments(s string) json.RawMessage {
	s = strings.TrimSpace(s)
	var obj map[string]json.RawMessage
	if s == "" || json.Unmarshal([]byte(s), &obj) != nil || obj == nil {
		return json.RawMessage(`{}`)
	}
	return json.RawMessage(s)
}

func (b *Builder) endAll() error {
	for i := range b.open {
		if err := b.End(i); err != nil {
			return err
		}
	}
	return nil
}

func (b *Builder) finalUsage() *protocol.Usage {
	u := b.usage
	b.call.Model.Cost.ApplyCost(&u)
	return &u
}

// Done closes open blocks and emits done with reason stop, length or toolUse.
func (b *Builder) Done(reason string) (protocol.Message, error) {
	if err := b.Start(); err != nil {
		return b.msg, err
	}
	if err := b.endAll(); err != nil {
		return b.msg, err
	}
	b.msg.StopReason = reason
	b.msg.Usage = b.finalUsage()
	if err := b.send(protocol.StreamEvent{Type: protocol.EventDone, Reason: reason, Message: b.snapshot()}); err != nil {
		return b.msg, err
	}
	return b.msg, nil
}

// Fail ends the call with an error event: reason aborted when ctx is done, else error. The partial
// content is kept (open blocks are closed without their end events). The message is sanitized.
func (b *Builder) Fail(ctx context.Context, cause error) (protocol.Message, error) {
	if b.emitErr != nil {
		return b.msg, b.emitErr
	}
	ce := &CallError{Reason: protocol.StopError}
	var pe *ProviderError
	switch {
	case ctx.Err() != nil:
		ce.Reason = protocol.StopAborted
		ce.Message = "request aborted"
		if errors.Is(context.Cause(ctx), context.DeadlineExceeded) {
			ce.Message = "request timed out"
		}
	case errors.As(cause, &pe):
		ce.Status, ce.RetryAfter = pe.Status, pe.RetryAfter
		ce.Message = Sanitize(b.call.Model.Provider+": "+pe.Error(), b.call.APIKey)
	case cause != nil:
		ce.Message = Sanitize(b.call.Model.Provider+": "+cause.Error(), b.call.APIKey)
	default:
		ce.Message = b.call.Model.Provider + ": unknown error"
	}
	if err := b.Start(); err != nil {
		return b.msg, err
	}
	for i := range b.open {
		if b.open[i] && b.msg.Content[i].Type == protocol.ContentToolCall {
			b.msg.Content[i].Arguments = toolArguments(b.args[i].String())
		}
		b.open[i] = false
	}
	b.msg.StopReason = ce.Reason
	b.msg.ErrorMessage = ce.Message
	b.msg.Usage = b.finalUsage()
	if err := b.send(protocol.StreamEvent{Type: protocol.EventError, Reason: ce.Reason, Message: b.snapshot()}); err != nil {
		return b.msg, err
	}
	return b.msg, ce
}

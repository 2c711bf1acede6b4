package protocol

import (
	"encoding/json"
	"fmt"
)

// Message roles (upstream vocabulary).
const (
	RoleUser       = "user"
	RoleAssistant  = "assistant"
	RoleToolResult = "toolResult"
)

// Content block types.
const (
	ContentText     = "text"
	ContentThinking = "thinking"
	ContentToolCall = "toolCall"
	ContentImage    = "image"
)

// Stop reasons of an assistant message.
const (
	StopStop    = "stop"
	StopLength  = "length"
	StopToolUse = "toolUse"
	StopError   = "error"
	StopAborted = "aborted"
)

// Content is one block of a message: text, thinking, a tool call or an image.
//
// Signature is the provider's opaque signature of a thinking block (Anthropic's extended thinking),
// kept so the block can be sent back unchanged to the model that produced it; empty when the
// provider gave none (such thinking is not sent back).
type Content struct {
	Type      string          `json:"type"`
	Text      string          `json:"text,omitempty"`
	Thinking  string          `json:"thinking,omitempty"`
	Signature string          `json:"signature,omitempty"` // thinking
	ID        string          `json:"id,omitempty"`        // toolCall
	Name      string          `json:"name,omitempty"`      // toolCall
	Arguments json.RawMessage `json:"arguments,omitempty"` // toolCall: a JSON object
	Data      string          `json:"data,omitempty"`      // image, base64
	MimeType  string          `json:"mimeType,omitempty"`  // image
}

// Cost is money spent on a call, in USD.
type Cost struct {
	Input      float64 `json:"input"`
	Output     float64 `json:"output"`
	CacheRead  float64 `json:"cacheRead"`
	CacheWrite float64 `json:"cacheWrite"`
	Total      float64 `json:"total"`
}

// Usage is the upstream usage shape.
type Usage struct {
	Input       int64 `json:"input"`
	Output      int64 `json:"output"`
	CacheRead   int64 `json:"cacheRead"`
	CacheWrite  int64 `json:"cacheWrite"`
	TotalTokens int64 `json:"totalTokens"`
	Cost        Cost  `json:"cost"`
}

// Message is a user, assistant or toolResult message (the fields of the other roles stay empty).
type Message struct {
	Role    string    `json:"role"`
	Content []Content `json:"content"`
	// assistant
	API          string `json:"api,omitempty"`
	Provider     string `json:"provider,omitempty"`
	Model        string `json:"model,omitempty"`
	Usage        *Usage `json:"usage,omitempty"`
	StopReason   string `json:"stopReason,omitempty"`
	ErrorMessage string `json:"errorMessage,omitempty"`
	// toolResult
	ToolCallID string          `json:"toolCallId,omitempty"`
	ToolName   string          `json:"toolName,omitempty"`
	Details    json.RawMessage `json:"details,omitempty"`
	IsError    bool            `json:"isError,omitempty"`
	// Timestamp is Unix milliseconds.
	Timestamp int64 `json:"timestamp"`
}

// Validate checks the role and the content types allowed for it.
func (m Message) Validate() error {
	allowed := map[string][]string{
		RoleUser:       {ContentText, ContentImage},
		RoleAssistant:  {ContentText, ContentThinking, ContentToolCall},
		RoleToolResult: {ContentText, ContentImage},
	}[m.Role]
	if allowed == nil {
		return fmt.Errorf("unknown message role %q", m.Role)
	}
	for i, c := range m.Content {
		ok := false
		for _, a := range allowed {
			ok = ok || c.Type == a
		}
		if !ok {
			return fmt.Errorf("content[%d]: type %q not allowed in a %s message", i, c.Type, m.Role)
		}
		if c.Type == ContentToolCall && (c.ID == "" || c.Name == "") {
			return fmt.Errorf("content[%d]: toolCall needs id and name", i)
		}
	}
	if m.Role == RoleToolResult && m.ToolCallID == "" {
		return fmt.Errorf("toolResult message needs toolCallId")
	}
	return nil
}

// Text concatenates the text blocks of a message.
func (m Message) Text() string {
	var s string
	for _, c := range m.Content {
		if c.Type == ContentText {
			s += c.Text
		}
	}
	return s
}

// Tool is a tool schema offered to the model.
type Tool struct {
	Name        string          `json:"name"`
	Description string          `json:"description"`
	Parameters  json.RawMessage `json:"parameters"` // JSON Schema object
}

// Context is what a model call sees.
type Context struct {
	SystemPrompt string    `json:"systemPrompt,omitempty"`
	Messages     []Message `json:"messages"`
	Tools        []Tool    `json:"tools,omitempty"`
}

// Stream event types of a model call (upstream vocabulary).
const (
	EventStart         = "start"
	EventTextStart     = "text_start"
	EventTextDelta     = "text_delta"
	EventTextEnd       = "text_end"
	EventThinkingStart = "thinking_start"
	EventThinkingDelta = "thinking_delta"
	EventThinkingEnd   = "thinking_end"
	EventToolCallStart = "toolcall_start"
	EventToolCallDelta = "toolcall_delta"
	EventToolCallEnd   = "toolcall_end"
	EventDone          = "done"
	EventError         = "error"
)

// StreamEvent is one event of a model call. Done carries the final message; Error carries the
// partial message with StopReason "error" or "aborted" and ErrorMessage set.
type StreamEvent struct {
	Type         string   `json:"type"`
	ContentIndex int      `json:"contentIndex,omitempty"`
	Delta        string   `json:"delta,omitempty"`
	Content      string   `json:"content,omitempty"`  // *_end: the whole text/thinking
	ToolCall     *Content `json:"toolCall,omitempty"` // toolcall_end
	Reason       string   `json:"reason,omitempty"`   // done: stop|length|toolUse; error: error|aborted
	Message      *Message `json:"message,omitempty"`  // done and error: the final (or partial) message
}

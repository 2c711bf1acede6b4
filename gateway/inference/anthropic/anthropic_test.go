package anthropic_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/openclaw/cloudworkers/gateway/inference"
	"github.com/openclaw/cloudworkers/gateway/inference/anthropic"
	"github.com/openclaw/cloudworkers/gateway/inference/inferencetest"
	"github.com/openclaw/cloudworkers/protocol"
)

const secret = "sk-ant-test-SECRET-0123456789"

func call(baseURL string, retries int) inference.Call {
	return inference.Call{
		Model: inference.Model{Ref: "anthropic/claude-sonnet-4-5", Provider: "anthropic", ID: "claude-sonnet-4-5",
			API: inference.APIAnthropicMessages, BaseURL: baseURL, MaxTokens: 8192, MaxRetries: retries,
			Headers: map[string]string{"X-Catalog-Header": "from-catalog"},
			Cost:    inference.Cost{Input: 3, Output: 15, CacheRead: 0.3, CacheWrite: 3.75}},
		Context: protocol.Context{
			SystemPrompt: "You are terse.",
			Messages: []protocol.Message{
				{Role: protocol.RoleUser, Content: []protocol.Content{{Type: protocol.ContentText, Text: "read the readme"}}},
				{Role: protocol.RoleAssistant, StopReason: protocol.StopToolUse, Content: []protocol.Content{
					{Type: protocol.ContentThinking, Thinking: "hmm"},
					{Type: protocol.ContentToolCall, ID: "toolu_0", Name: "read", Arguments: json.RawMessage(`{"path":"README.md"}`)}}},
				{Role: protocol.RoleToolResult, ToolCallID: "toolu_0", ToolName: "read", Content: []protocol.Content{{Type: protocol.ContentText, Text: "# Hello"}}},
			},
			Tools: []protocol.Tool{{Name: "read", Description: "Read a file", Parameters: json.RawMessage(
				`{"type":"object","properties":{"path":{"type":"string"}},"required":["path"],"additionalProperties":false}`)}},
		},
		APIKey: secret,
	}
}

const (
	msgStart = `event: message_start
data: {"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","content":[],"model":"claude-sonnet-4-5","stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":25,"cache_creation_input_tokens":10,"cache_read_input_tokens":100,"output_tokens":1}}}`
	ping      = "event: ping\ndata: {\"type\": \"ping\"}"
	msgStop   = "event: message_stop\ndata: {\"type\":\"message_stop\"}"
	textStart = `event: content_block_start
data: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`
)

func delta(i int, d string) string {
	return "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":" + itoa(i) + ",\"delta\":" + d + "}"
}
func blockStop(i int) string {
	return "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":" + itoa(i) + "}"
}
func msgDelta(reason string, out int) string {
	return "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"" + reason + "\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":" + itoa(out) + "}}"
}
func itoa(i int) string { b, _ := json.Marshal(i); return string(b) }

func TestStream(t *testing.T) {
	textTurn := []string{msgStart, textStart, ping, delta(0, `{"type":"text_delta","text":"Hello"}`),
		delta(0, `{"type":"text_delta","text":" world"}`), blockStop(0), msgDelta("end_turn", 15), msgStop}
	for _, tc := range []inferencetest.Case{
		{
			Name:    "plain text with usage",
			Handler: func(_ int, w http.ResponseWriter, _ *http.Request) { inferencetest.SSE(w, textTurn...) },
			Events: []string{"start", "text_start 0", "text_delta 0 Hello", "text_delta 0  world", "text_end 0 Hello world",
				"done stop"},
			Stop: protocol.StopStop, Text: "Hello world", Requests: 1,
			Usage: &protocol.Usage{Input: 25, Output: 15, CacheRead: 100, CacheWrite: 10, TotalTokens: 150},
		},
		{
			Name: "thinking then tool use with streamed JSON arguments",
			Handler: func(_ int, w http.ResponseWriter, _ *http.Request) {
				inferencetest.SSE(w, msgStart,
					`event: content_block_start
data: {"type":"content_block_start","index":0,"content_block":{"type":"thinking","thinking":"","signature":""}}`,
					delta(0, `{"type":"thinking_delta","thinking":"I should read "}`),
					delta(0, `{"type":"thinking_delta","thinking":"the file."}`),
					delta(0, `{"type":"signature_delta","signature":"EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds"}`),
					blockStop(0),
					`event: content_block_start
data: {"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"toolu_01T1x1fJ34qAmk2tNTrN7Up6","name":"read","input":{}}}`,
					delta(1, `{"type":"input_json_delta","partial_json":""}`),
					delta(1, `{"type":"input_json_delta","partial_json":"{\"path\": \"REA"}`),
					delta(1, `{"type":"input_json_delta","partial_json":"DME.md\"}"}`),
					blockStop(1), msgDelta("tool_use", 89), msgStop)
			},
			Events: []string{"start", "thinking_start 0", "thinking_delta 0 I should read ", "thinking_delta 0 the file.",
				"thinking_end 0 I should read the file.", "toolcall_start 1 toolu_01T1x1fJ34qAmk2tNTrN7Up6 read",
				`toolcall_delta 1 {"path": "REA`, `toolcall_delta 1 DME.md"}`,
				`toolcall_end 1 toolu_01T1x1fJ34qAmk2tNTrN7Up6 read {"path": "README.md"}`, "done toolUse"},
			Stop: protocol.StopToolUse, Requests: 1,
			Usage: &protocol.Usage{Input: 25, Output: 89, CacheRead: 100, CacheWrite: 10, TotalTokens: 224},
		},
		{
			Name: "max_tokens maps to length",
			Handler: func(_ int, w http.ResponseWriter, _ *http.Request) {
				inferencetest.SSE(w, msgStart, textStart, delta(0, `{"type":"text_delta","text":"Hi"}`), blockStop(0), msgDelta("max_tokens", 2), msgStop)
			},
			Events: []string{"start", "text_start 0", "text_delta 0 Hi", "text_end 0 Hi", "done length"},
			Stop:   protocol.StopLength, Text: "Hi", Requests: 1,
		},
		{
			Name: "error event mid-stream",
			Handler: func(_ int, w http.ResponseWriter, _ *http.Request) {
				inferencetest.SSE(w, msgStart, textStart, delta(0, `{"type":"text_delta","text":"Hel"}`),
					`event: error
data: {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded (key `+secret+`)"}}`)
			},
			Events: []string{"start", "text_start 0", "text_delta 0 Hel", "error error"},
			Stop:   protocol.StopError, Text: "Hel", ErrMatch: "Overloaded", Requests: 1,
		},
		{
			Name: "connection cut mid-stream",
			Handler: func(_ int, w http.ResponseWriter, _ *http.Request) {
				inferencetest.SSE(w, msgStart, textStart, delta(0, `{"type":"text_delta","text":"Hel"}`))
				inferencetest.Cut()
			},
			Events: []string{"start", "text_start 0", "text_delta 0 Hel", "error error"},
			Stop:   protocol.StopError, Text: "Hel", ErrMatch: "EOF", Requests: 1,
		},
		{
			Name: "stream closed cleanly before message_stop",
			Handler: func(_ int, w http.ResponseWriter, _ *http.Request) {
				inferencetest.SSE(w, msgStart, textStart, delta(0, `{"type":"text_delta","text":"Hel"}`))
			},
			Events: []string{"start", "text_start 0", "text_delta 0 Hel", "error error"},
			Stop:   protocol.StopError, Text: "Hel", ErrMatch: "before message_stop", Requests: 1,
		},
		{
			Name:    "429 with retry-after, no retries",
			Handler: inferencetest.JSONError(http.StatusTooManyRequests, `{"type":"error","error":{"type":"rate_limit_error","message":"Number of request tokens has exceeded your per-minute rate limit"}}`, "Retry-After", "7"),
			Events:  []string{"start", "error error"},
			Stop:    protocol.StopError, Status: 429, Retry: 7 * time.Second, ErrMatch: "rate limit", Requests: 1,
		},
		{
			Name:    "429 with retry-after-ms is retried once",
			Retries: 1,
			Handler: inferencetest.FailFirst(inferencetest.JSONError(http.StatusTooManyRequests, `{"type":"error","error":{"type":"rate_limit_error","message":"slow down"}}`, "Retry-After-Ms", "1"),
				func(_ int, w http.ResponseWriter, _ *http.Request) { inferencetest.SSE(w, textTurn...) }),
			Events: []string{"start", "text_start 0", "text_delta 0 Hello", "text_delta 0  world", "text_end 0 Hello world", "done stop"},
			Stop:   protocol.StopStop, Text: "Hello world", Requests: 2,
		},
		{
			Name:    "401 echoing the key is redacted",
			Handler: inferencetest.JSONError(http.StatusUnauthorized, `{"type":"error","error":{"type":"authentication_error","message":"invalid x-api-key `+secret+`"}}`),
			Events:  []string{"start", "error error"},
			Stop:    protocol.StopError, Status: 401, ErrMatch: "invalid x-api-key [redacted]", Requests: 1,
		},
	} {
		t.Run(tc.Name, func(t *testing.T) {
			msg, r := inferencetest.RunCase(t, anthropic.New(), call, secret, tc)
			if tc.Usage != nil && msg.Usage.Cost.Total <= 0 {
				t.Errorf("cost not computed: %+v", msg.Usage.Cost)
			}
			if r.Path != "/v1/messages" || !(strings.Contains(r.Header.Get("Authorization"), secret) || r.Header.Get("X-Api-Key") == secret) {
				t.Errorf("request %s without the credential in its auth header: %v", r.Path, r.Header)
			}
			if r.Header.Get("X-Catalog-Header") != "from-catalog" {
				t.Errorf("catalog header missing")
			}
		})
	}
}

func TestRequestMapping(t *testing.T) {
	ctx := inferencetest.Context(t)
	srv := inferencetest.NewServer(t, func(_ int, w http.ResponseWriter, _ *http.Request) {
		inferencetest.SSE(w, msgStart, msgDelta("end_turn", 1), msgStop)
	})
	c := call(srv.URL, 0)
	c.Options = inference.Options{Reasoning: inference.ReasoningLow, MaxTokens: 4000}
	if _, err := anthropic.New().Stream(ctx, c, (&inferencetest.Recorder{}).Emit); err != nil {
		t.Fatal(err)
	}
	var body struct {
		Model     string `json:"model"`
		MaxTokens int    `json:"max_tokens"`
		Stream    bool   `json:"stream"`
		System    []struct{ Text string }
		Thinking  struct {
			Type         string `json:"type"`
			BudgetTokens int    `json:"budget_tokens"`
		}
		Messages []struct {
			Role    string           `json:"role"`
			Content []map[string]any `json:"content"`
		}
		Tools []struct {
			Name        string         `json:"name"`
			InputSchema map[string]any `json:"input_schema"`
		}
	}
	if err := json.Unmarshal(srv.Requests()[0].Body, &body); err != nil {
		t.Fatal(err)
	}
	if body.Model != "claude-sonnet-4-5" || body.MaxTokens != 4000 || !body.Stream || body.System[0].Text != "You are terse." {
		t.Errorf("request: %+v", body)
	}
	if body.Thinking.Type != "enabled" || body.Thinking.BudgetTokens != 2048 {
		t.Errorf("thinking: %+v", body.Thinking)
	}
	if len(body.Messages) != 3 || body.Messages[1].Content[0]["type"] != "tool_use" || len(body.Messages[1].Content) != 1 ||
		body.Messages[2].Role != "user" || body.Messages[2].Content[0]["type"] != "tool_result" || body.Messages[2].Content[0]["tool_use_id"] != "toolu_0" {
		t.Errorf("messages: %+v", body.Messages)
	}
	if len(body.Tools) != 1 || body.Tools[0].InputSchema["additionalProperties"] != false || body.Tools[0].InputSchema["required"] == nil {
		t.Errorf("tools: %+v", body.Tools)
	}
}

func TestCancelClosesProviderConnection(t *testing.T) {
	inferencetest.CheckCancel(t, stream, msgStart, textStart, delta(0, `{"type":"text_delta","text":"Hel"}`))
}

// stream calls the adapter with the test call against the provider at baseURL.
func stream(ctx context.Context, baseURL string, emit inference.Emit) (protocol.Message, error) {
	return anthropic.New().Stream(ctx, call(baseURL, 0), emit)
}

func TestEmitErrorStopsStream(t *testing.T) {
	rec := inferencetest.CheckEmitError(t, stream, msgStart, textStart, delta(0, `{"type":"text_delta","text":"Hel"}`))
	if n := len(rec.Events); rec.Events[n-1].Type != protocol.EventTextDelta {
		t.Errorf("events after the failed emit: %v", rec.Summary())
	}
}

const testSignature = "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds"

// thinkingToolTurn streams a signed thinking block (the signature in a signature_delta), optionally a
// redacted_thinking block, and a tool call.
func thinkingToolTurn(redacted bool) []string {
	ev := []string{msgStart,
		`event: content_block_start
data: {"type":"content_block_start","index":0,"content_block":{"type":"thinking","thinking":"","signature":""}}`,
		delta(0, `{"type":"thinking_delta","thinking":"I should read the file."}`),
		delta(0, `{"type":"signature_delta","signature":"`+testSignature+`"}`),
		blockStop(0)}
	tool := 1
	if redacted {
		ev = append(ev, `event: content_block_start
data: {"type":"content_block_start","index":1,"content_block":{"type":"redacted_thinking","data":"EmwKAhgBEgy3va3pzix/LafPsn4a"}}`, blockStop(1))
		tool = 2
	}
	return append(ev, `event: content_block_start
data: {"type":"content_block_start","index":`+itoa(tool)+`,"content_block":{"type":"tool_use","id":"toolu_1","name":"read","input":{}}}`,
		delta(tool, `{"type":"input_json_delta","partial_json":"{\"path\":\"README.md\"}"}`),
		blockStop(tool), msgDelta("tool_use", 40), msgStop)
}

func TestThinkingSignatureRoundTrip(t *testing.T) {
	ctx := inferencetest.Context(t)
	srv := inferencetest.NewServer(t, func(n int, w http.ResponseWriter, _ *http.Request) {
		if n == 0 {
			inferencetest.SSE(w, thinkingToolTurn(false)...)
			return
		}
		inferencetest.SSE(w, msgStart, msgDelta("end_turn", 1), msgStop)
	})
	c := call(srv.URL, 0)
	c.Options = inference.Options{Reasoning: inference.ReasoningLow}
	rec := &inferencetest.Recorder{}
	msg, err := anthropic.New().Stream(ctx, c, rec.Emit)
	if err != nil {
		t.Fatal(err)
	}
	if msg.Content[0].Type != protocol.ContentThinking || msg.Content[0].Signature != testSignature {
		t.Fatalf("returned message content: %+v", msg.Content)
	}
	done := rec.Events[len(rec.Events)-1]
	if done.Type != protocol.EventDone || done.Message.Content[0].Signature != testSignature {
		t.Fatalf("done event message content: %+v", done.Message.Content)
	}
	for _, ev := range rec.Events[:len(rec.Events)-1] {
		if ev.Message != nil && len(ev.Message.Content) > 0 && ev.Message.Content[0].Signature != "" {
			t.Errorf("%s event carries a signature before the block was signed", ev.Type)
		}
	}

	// The follow-up request sends the signed thinking block back first, then the tool call.
	c.Context.Messages = []protocol.Message{c.Context.Messages[0], msg,
		{Role: protocol.RoleToolResult, ToolCallID: "toolu_1", ToolName: "read", Content: []protocol.Content{{Type: protocol.ContentText, Text: "# Hello"}}}}
	if _, err := anthropic.New().Stream(ctx, c, (&inferencetest.Recorder{}).Emit); err != nil {
		t.Fatal(err)
	}
	assistant := func(r inferencetest.Request) []map[string]any {
		t.Helper()
		var body struct {
			Messages []struct {
				Role    string           `json:"role"`
				Content []map[string]any `json:"content"`
			}
		}
		if err := json.Unmarshal(r.Body, &body); err != nil {
			t.Fatal(err)
		}
		if len(body.Messages) != 3 || body.Messages[1].Role != "assistant" {
			t.Fatalf("messages: %+v", body.Messages)
		}
		return body.Messages[1].Content
	}
	got := assistant(srv.Requests()[1])
	if len(got) != 2 || got[0]["type"] != "thinking" || got[0]["thinking"] != "I should read the file." ||
		got[0]["signature"] != testSignature || len(got[0]) != 3 || got[1]["type"] != "tool_use" || got[1]["id"] != "toolu_1" {
		t.Errorf("assistant content: %+v", got)
	}

	// Signatures are model-specific: another model gets the turn without its thinking.
	other := c
	other.Model.ID = "claude-opus-4-1"
	if _, err := anthropic.New().Stream(ctx, other, (&inferencetest.Recorder{}).Emit); err != nil {
		t.Fatal(err)
	}
	if got := assistant(srv.Requests()[2]); len(got) != 1 || got[0]["type"] != "tool_use" {
		t.Errorf("assistant content sent to another model: %+v", got)
	}
}

// A turn with redacted thinking cannot be kept whole, so none of its thinking keeps a signature (it is
// then not sent back, rather than sent back incomplete).
func TestRedactedThinkingDropsSignatures(t *testing.T) {
	ctx := inferencetest.Context(t)
	srv := inferencetest.NewServer(t, func(_ int, w http.ResponseWriter, _ *http.Request) {
		inferencetest.SSE(w, thinkingToolTurn(true)...)
	})
	rec := &inferencetest.Recorder{}
	msg, err := anthropic.New().Stream(ctx, call(srv.URL, 0), rec.Emit)
	if err != nil {
		t.Fatal(err)
	}
	if len(msg.Content) != 2 || msg.Content[0].Signature != "" || msg.Content[1].Type != protocol.ContentToolCall {
		t.Fatalf("content: %+v", msg.Content)
	}
	if strings.Contains(rec.JSON(), testSignature) {
		t.Error("an event carries the signature")
	}
}

package openai_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/openclaw/cloudworkers/gateway/inference"
	"github.com/openclaw/cloudworkers/gateway/inference/inferencetest"
	"github.com/openclaw/cloudworkers/gateway/inference/openai"
	"github.com/openclaw/cloudworkers/protocol"
)

const secret = "sk-proj-test-SECRET-0123456789"

func call(baseURL string, retries int) inference.Call {
	return inference.Call{
		Model: inference.Model{Ref: "openai/gpt-5", Provider: "openai", ID: "gpt-5", API: inference.APIOpenAICompletions,
			BaseURL: baseURL, MaxTokens: 8192, MaxRetries: retries, Headers: map[string]string{"X-Catalog-Header": "from-catalog"},
			Cost: inference.Cost{Input: 1.25, Output: 10, CacheRead: 0.125}},
		Context: protocol.Context{
			SystemPrompt: "You are terse.",
			Messages: []protocol.Message{
				{Role: protocol.RoleUser, Content: []protocol.Content{{Type: protocol.ContentText, Text: "read the readme"}}},
				{Role: protocol.RoleAssistant, StopReason: protocol.StopToolUse, Content: []protocol.Content{
					{Type: protocol.ContentToolCall, ID: "call_0", Name: "read", Arguments: json.RawMessage(`{"path":"README.md"}`)}}},
				{Role: protocol.RoleToolResult, ToolCallID: "call_0", ToolName: "read", Content: []protocol.Content{{Type: protocol.ContentText, Text: "# Hello"}}},
				{Role: protocol.RoleAssistant, StopReason: protocol.StopAborted, Content: []protocol.Content{{Type: protocol.ContentText, Text: "partial"}}},
			},
			Tools: []protocol.Tool{{Name: "read", Description: "Read a file", Parameters: json.RawMessage(
				`{"type":"object","properties":{"path":{"type":"string"}},"required":["path"]}`)}},
		},
		APIKey: secret,
	}
}

func chunk(delta string, finish string) string {
	f := "null"
	if finish != "" {
		f = `"` + finish + `"`
	}
	return `data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"gpt-5","choices":[{"index":0,"delta":` + delta + `,"finish_reason":` + f + `}],"usage":null}`
}

const usageChunk = `data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"gpt-5","choices":[],"usage":{"prompt_tokens":120,"completion_tokens":7,"total_tokens":127,"prompt_tokens_details":{"cached_tokens":100}}}`

func TestCompletions(t *testing.T) {
	textTurn := []string{chunk(`{"role":"assistant","content":""}`, ""), chunk(`{"content":"Hello"}`, ""),
		chunk(`{"content":" world"}`, ""), chunk(`{}`, "stop"), usageChunk, "data: [DONE]"}
	textEvents := []string{"start", "text_start 0", "text_delta 0 Hello", "text_delta 0  world", "text_end 0 Hello world", "done stop"}
	for _, tc := range append([]inferencetest.Case{
		{
			Name:    "plain text with usage",
			Handler: func(_ int, w http.ResponseWriter, _ *http.Request) { inferencetest.SSE(w, textTurn...) },
			Events:  textEvents, Stop: protocol.StopStop, Text: "Hello world", Requests: 1,
			Usage: &protocol.Usage{Input: 20, Output: 7, CacheRead: 100, TotalTokens: 127},
		},
		{
			Name: "text then two tool calls with streamed arguments",
			Handler: func(_ int, w http.ResponseWriter, _ *http.Request) {
				inferencetest.SSE(w, chunk(`{"role":"assistant","content":"Reading."}`, ""),
					chunk(`{"content":null,"tool_calls":[{"index":0,"id":"call_abc","type":"function","function":{"name":"read","arguments":""}}]}`, ""),
					chunk(`{"tool_calls":[{"index":0,"function":{"arguments":"{\"pa"}}]}`, ""),
					chunk(`{"tool_calls":[{"index":0,"function":{"arguments":"th\": \"README.md\"}"}}]}`, ""),
					chunk(`{"tool_calls":[{"index":1,"id":"call_def","type":"function","function":{"name":"ls","arguments":"{}"}}]}`, ""),
					chunk(`{}`, "tool_calls"), usageChunk, "data: [DONE]")
			},
			Events: []string{"start", "text_start 0", "text_delta 0 Reading.", "text_end 0 Reading.", "toolcall_start 1 call_abc read",
				`toolcall_delta 1 {"pa`, `toolcall_delta 1 th": "README.md"}`, `toolcall_end 1 call_abc read {"path": "README.md"}`,
				"toolcall_start 2 call_def ls", "toolcall_delta 2 {}", "toolcall_end 2 call_def ls {}", "done toolUse"},
			Stop: protocol.StopToolUse, Text: "Reading.", Requests: 1,
			Usage: &protocol.Usage{Input: 20, Output: 7, CacheRead: 100, TotalTokens: 127},
		},
		{
			Name: "reasoning_content of compatible servers is thinking",
			Handler: func(_ int, w http.ResponseWriter, _ *http.Request) {
				inferencetest.SSE(w, chunk(`{"role":"assistant","reasoning_content":"Think"}`, ""), chunk(`{"reasoning_content":"ing."}`, ""),
					chunk(`{"content":"Done"}`, ""), chunk(`{}`, "length"), "data: [DONE]")
			},
			Events: []string{"start", "thinking_start 0", "thinking_delta 0 Think", "thinking_delta 0 ing.", "thinking_end 0 Thinking.",
				"text_start 1", "text_delta 1 Done", "text_end 1 Done", "done length"},
			Stop: protocol.StopLength, Text: "Done", Requests: 1,
		},
		{
			Name: "error event mid-stream",
			Handler: func(_ int, w http.ResponseWriter, _ *http.Request) {
				inferencetest.SSE(w, chunk(`{"content":"Hel"}`, ""), `data: {"error":{"message":"The server had an error (`+secret+`)","type":"server_error"}}`)
			},
			Events: []string{"start", "text_start 0", "text_delta 0 Hel", "error error"},
			Stop:   protocol.StopError, Text: "Hel", ErrMatch: "server had an error", Requests: 1,
		},
		{
			Name: "connection cut mid-stream",
			Handler: func(_ int, w http.ResponseWriter, _ *http.Request) {
				inferencetest.SSE(w, chunk(`{"content":"Hel"}`, ""))
				inferencetest.Cut()
			},
			Events: []string{"start", "text_start 0", "text_delta 0 Hel", "error error"},
			Stop:   protocol.StopError, Text: "Hel", ErrMatch: "EOF", Requests: 1,
		},
		{
			Name: "stream closed cleanly without finish_reason",
			Handler: func(_ int, w http.ResponseWriter, _ *http.Request) {
				inferencetest.SSE(w, chunk(`{"content":"Hel"}`, ""))
			},
			Events: []string{"start", "text_start 0", "text_delta 0 Hel", "error error"},
			Stop:   protocol.StopError, Text: "Hel", ErrMatch: "without a finish_reason", Requests: 1,
		},
	}, httpErrorCases(textTurn, textEvents, nil)...) {
		t.Run(tc.Name, func(t *testing.T) {
			_, r := inferencetest.RunCase(t, openai.NewCompletions(), call, secret, tc)
			checkRequest(t, r, "/chat/completions")
		})
	}
}

// httpErrorCases are the rows both adapters share: OpenAI's HTTP errors, and a rate limit retried into
// textTurn (which shows textEvents and usage).
func httpErrorCases(textTurn, textEvents []string, usage *protocol.Usage) []inferencetest.Case {
	return []inferencetest.Case{
		{
			Name:    "429 with retry-after, no retries",
			Handler: inferencetest.JSONError(http.StatusTooManyRequests, `{"error":{"message":"Rate limit reached for gpt-5","type":"requests","code":"rate_limit_exceeded"}}`, "Retry-After", "7"),
			Events:  []string{"start", "error error"},
			Stop:    protocol.StopError, Status: 429, Retry: 7 * time.Second, ErrMatch: "Rate limit reached", Requests: 1,
		},
		{
			Name:    "429 with retry-after-ms is retried once",
			Retries: 1,
			Handler: inferencetest.FailFirst(inferencetest.JSONError(http.StatusTooManyRequests, `{"error":{"message":"slow down","type":"requests"}}`, "Retry-After-Ms", "1"),
				func(_ int, w http.ResponseWriter, _ *http.Request) { inferencetest.SSE(w, textTurn...) }),
			Events: textEvents, Stop: protocol.StopStop, Text: "Hello world", Requests: 2, Usage: usage,
		},
		{
			Name:    "401 echoing the key is redacted",
			Handler: inferencetest.JSONError(http.StatusUnauthorized, `{"error":{"message":"Incorrect API key provided: `+secret+`","type":"invalid_request_error","code":"invalid_api_key"}}`),
			Events:  []string{"start", "error error"},
			Stop:    protocol.StopError, Status: 401, ErrMatch: "Incorrect API key provided: [redacted]", Requests: 1,
		},
	}
}

// checkRequest checks that a request went to path with the credential and the catalog's header.
func checkRequest(t *testing.T, r inferencetest.Request, path string) {
	t.Helper()
	if r.Path != path || r.Header.Get("Authorization") != "Bearer "+secret {
		t.Errorf("request %s without the credential in Authorization", r.Path)
	}
	if r.Header.Get("X-Catalog-Header") != "from-catalog" {
		t.Errorf("catalog header missing")
	}
}

// mappedRequest streams the call newCall makes, with temperature 0.2, at most 100 tokens and high
// reasoning, through a to a provider that answers events, and returns the request body it sent.
func mappedRequest(t *testing.T, a inference.Adapter, newCall func(string, int) inference.Call, events ...string) map[string]any {
	t.Helper()
	srv := inferencetest.NewServer(t, func(_ int, w http.ResponseWriter, _ *http.Request) { inferencetest.SSE(w, events...) })
	c := newCall(srv.URL, 0)
	temp := 0.2
	c.Options = inference.Options{Temperature: &temp, MaxTokens: 100, Reasoning: inference.ReasoningHigh}
	if _, err := a.Stream(inferencetest.Context(t), c, (&inferencetest.Recorder{}).Emit); err != nil {
		t.Fatal(err)
	}
	var body map[string]any
	if err := json.Unmarshal(srv.Requests()[0].Body, &body); err != nil {
		t.Fatal(err)
	}
	return body
}

func TestCompletionsRequestMapping(t *testing.T) {
	body := mappedRequest(t, openai.NewCompletions(), call, chunk(`{"content":"ok"}`, "stop"), "data: [DONE]")
	so, _ := body["stream_options"].(map[string]any)
	if body["model"] != "gpt-5" || body["stream"] != true || so["include_usage"] != true || body["max_completion_tokens"] != 100.0 ||
		body["temperature"] != 0.2 || body["reasoning_effort"] != "high" {
		t.Errorf("request: %v", body)
	}
	msgs := body["messages"].([]any)
	roles := []string{}
	for _, m := range msgs {
		roles = append(roles, m.(map[string]any)["role"].(string))
	}
	// The aborted assistant message is left out.
	if strings.Join(roles, ",") != "system,user,assistant,tool" {
		t.Errorf("roles: %v", roles)
	}
	tcs := msgs[2].(map[string]any)["tool_calls"].([]any)
	if fn := tcs[0].(map[string]any)["function"].(map[string]any); fn["name"] != "read" || fn["arguments"] != `{"path":"README.md"}` {
		t.Errorf("tool call: %v", tcs)
	}
}

func TestCompletionsCancelClosesProviderConnection(t *testing.T) {
	inferencetest.CheckCancel(t, func(ctx context.Context, baseURL string, emit inference.Emit) (protocol.Message, error) {
		return openai.NewCompletions().Stream(ctx, call(baseURL, 0), emit)
	}, chunk(`{"content":"Hel"}`, ""))
}

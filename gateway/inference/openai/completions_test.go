package openai_test

import (
	"context"
	"encoding/json"
	"errors"
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
	for _, tc := range []struct {
		name     string
		handler  inferencetest.Handler
		retries  int
		want     []string
		stop     string
		text     string
		usage    *protocol.Usage
		status   int
		retry    time.Duration
		errMatch string
		requests int
	}{
		{
			name:    "plain text with usage",
			handler: func(_ int, w http.ResponseWriter, _ *http.Request) { inferencetest.SSE(w, textTurn...) },
			want:    textEvents, stop: protocol.StopStop, text: "Hello world", requests: 1,
			usage: &protocol.Usage{Input: 20, Output: 7, CacheRead: 100, TotalTokens: 127},
		},
		{
			name: "text then two tool calls with streamed arguments",
			handler: func(_ int, w http.ResponseWriter, _ *http.Request) {
				inferencetest.SSE(w, chunk(`{"role":"assistant","content":"Reading."}`, ""),
					chunk(`{"content":null,"tool_calls":[{"index":0,"id":"call_abc","type":"function","function":{"name":"read","arguments":""}}]}`, ""),
					chunk(`{"tool_calls":[{"index":0,"function":{"arguments":"{\"pa"}}]}`, ""),
					chunk(`{"tool_calls":[{"index":0,"function":{"arguments":"th\": \"README.md\"}"}}]}`, ""),
					chunk(`{"tool_calls":[{"index":1,"id":"call_def","type":"function","function":{"name":"ls","arguments":"{}"}}]}`, ""),
					chunk(`{}`, "tool_calls"), usageChunk, "data: [DONE]")
			},
			want: []string{"start", "text_start 0", "text_delta 0 Reading.", "text_end 0 Reading.", "toolcall_start 1 call_abc read",
				`toolcall_delta 1 {"pa`, `toolcall_delta 1 th": "README.md"}`, `toolcall_end 1 call_abc read {"path": "README.md"}`,
				"toolcall_start 2 call_def ls", "toolcall_delta 2 {}", "toolcall_end 2 call_def ls {}", "done toolUse"},
			stop: protocol.StopToolUse, text: "Reading.", requests: 1,
			usage: &protocol.Usage{Input: 20, Output: 7, CacheRead: 100, TotalTokens: 127},
		},
		{
			name: "reasoning_content of compatible servers is thinking",
			handler: func(_ int, w http.ResponseWriter, _ *http.Request) {
				inferencetest.SSE(w, chunk(`{"role":"assistant","reasoning_content":"Think"}`, ""), chunk(`{"reasoning_content":"ing."}`, ""),
					chunk(`{"content":"Done"}`, ""), chunk(`{}`, "length"), "data: [DONE]")
			},
			want: []string{"start", "thinking_start 0", "thinking_delta 0 Think", "thinking_delta 0 ing.", "thinking_end 0 Thinking.",
				"text_start 1", "text_delta 1 Done", "text_end 1 Done", "done length"},
			stop: protocol.StopLength, text: "Done", requests: 1,
		},
		{
			name: "error event mid-stream",
			handler: func(_ int, w http.ResponseWriter, _ *http.Request) {
				inferencetest.SSE(w, chunk(`{"content":"Hel"}`, ""), `data: {"error":{"message":"The server had an error (`+secret+`)","type":"server_error"}}`)
			},
			want: []string{"start", "text_start 0", "text_delta 0 Hel", "error error"},
			stop: protocol.StopError, text: "Hel", errMatch: "server had an error", requests: 1,
		},
		{
			name: "connection cut mid-stream",
			handler: func(_ int, w http.ResponseWriter, _ *http.Request) {
				inferencetest.SSE(w, chunk(`{"content":"Hel"}`, ""))
				inferencetest.Cut()
			},
			want: []string{"start", "text_start 0", "text_delta 0 Hel", "error error"},
			stop: protocol.StopError, text: "Hel", errMatch: "EOF", requests: 1,
		},
		{
			name: "stream closed cleanly without finish_reason",
			handler: func(_ int, w http.ResponseWriter, _ *http.Request) {
				inferencetest.SSE(w, chunk(`{"content":"Hel"}`, ""))
			},
			want: []string{"start", "text_start 0", "text_delta 0 Hel", "error error"},
			stop: protocol.StopError, text: "Hel", errMatch: "without a finish_reason", requests: 1,
		},
		{
			name: "429 with retry-after, no retries",
			handler: func(_ int, w http.ResponseWriter, _ *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				w.Header().Set("Retry-After", "7")
				w.WriteHeader(http.StatusTooManyRequests)
				_, _ = w.Write([]byte(`{"error":{"message":"Rate limit reached for gpt-5","type":"requests","code":"rate_limit_exceeded"}}`))
			},
			want: []string{"start", "error error"},
			stop: protocol.StopError, status: 429, retry: 7 * time.Second, errMatch: "Rate limit reached", requests: 1,
		},
		{
			name:    "429 with retry-after-ms is retried once",
			retries: 1,
			handler: func(n int, w http.ResponseWriter, _ *http.Request) {
				if n == 0 {
					w.Header().Set("Retry-After-Ms", "1")
					w.Header().Set("Content-Type", "application/json")
					w.WriteHeader(http.StatusTooManyRequests)
					_, _ = w.Write([]byte(`{"error":{"message":"slow down","type":"requests"}}`))
					return
				}
				inferencetest.SSE(w, textTurn...)
			},
			want: textEvents, stop: protocol.StopStop, text: "Hello world", requests: 2,
		},
		{
			name: "401 echoing the key is redacted",
			handler: func(_ int, w http.ResponseWriter, _ *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusUnauthorized)
				_, _ = w.Write([]byte(`{"error":{"message":"Incorrect API key provided: ` + secret + `","type":"invalid_request_error","code":"invalid_api_key"}}`))
			},
			want: []string{"start", "error error"},
			stop: protocol.StopError, status: 401, errMatch: "Incorrect API key provided: [redacted]", requests: 1,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := inferencetest.Context(t)
			srv := inferencetest.NewServer(t, tc.handler)
			rec := &inferencetest.Recorder{}
			msg, err := openai.NewCompletions().Stream(ctx, call(srv.URL, tc.retries), rec.Emit)
			if d := inferencetest.Diff(rec.Summary(), tc.want); d != "" {
				t.Fatal(d)
			}
			last := rec.Events[len(rec.Events)-1]
			if last.Message == nil || last.Message.StopReason != tc.stop || msg.StopReason != tc.stop {
				t.Fatalf("stop reason: event %+v, returned %q", last.Message, msg.StopReason)
			}
			if got := msg.Text(); got != tc.text {
				t.Errorf("text = %q, want %q", got, tc.text)
			}
			if tc.usage != nil {
				want := *tc.usage
				call("", 0).Model.Cost.ApplyCost(&want)
				if *msg.Usage != want {
					t.Errorf("usage = %+v, want %+v", *msg.Usage, want)
				}
			}
			if tc.errMatch != "" {
				var ce *inference.CallError
				if !errors.As(err, &ce) || ce.Reason != protocol.StopError || !strings.Contains(msg.ErrorMessage, tc.errMatch) {
					t.Fatalf("err = %v, errorMessage %q, want one containing %q", err, msg.ErrorMessage, tc.errMatch)
				}
				if ce.Status != tc.status || ce.RetryAfter != tc.retry {
					t.Errorf("status %d retry %v, want %d %v", ce.Status, ce.RetryAfter, tc.status, tc.retry)
				}
				if strings.Contains(err.Error(), secret) {
					t.Errorf("error contains the credential: %v", err)
				}
			} else if err != nil {
				t.Fatal(err)
			}
			if strings.Contains(rec.JSON(), secret) {
				t.Error("an event contains the credential")
			}
			reqs := srv.Requests()
			if len(reqs) != tc.requests {
				t.Fatalf("%d requests, want %d", len(reqs), tc.requests)
			}
			r := reqs[0]
			if r.Path != "/chat/completions" || r.Header.Get("Authorization") != "Bearer "+secret {
				t.Errorf("request %s without the credential in Authorization", r.Path)
			}
			if r.Header.Get("X-Catalog-Header") != "from-catalog" {
				t.Errorf("catalog header missing")
			}
		})
	}
}

func TestCompletionsRequestMapping(t *testing.T) {
	ctx := inferencetest.Context(t)
	srv := inferencetest.NewServer(t, func(_ int, w http.ResponseWriter, _ *http.Request) {
		inferencetest.SSE(w, chunk(`{"content":"ok"}`, "stop"), "data: [DONE]")
	})
	c := call(srv.URL, 0)
	temp := 0.2
	c.Options = inference.Options{Temperature: &temp, MaxTokens: 100, Reasoning: inference.ReasoningHigh}
	if _, err := openai.NewCompletions().Stream(ctx, c, (&inferencetest.Recorder{}).Emit); err != nil {
		t.Fatal(err)
	}
	var body map[string]any
	if err := json.Unmarshal(srv.Requests()[0].Body, &body); err != nil {
		t.Fatal(err)
	}
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
	ctx := inferencetest.Context(t)
	closed := make(chan struct{})
	srv := inferencetest.NewServer(t, func(_ int, w http.ResponseWriter, r *http.Request) {
		inferencetest.SSE(w, chunk(`{"content":"Hel"}`, ""))
		<-r.Context().Done()
		close(closed)
	})
	callCtx, cancel := context.WithCancel(ctx)
	rec := &inferencetest.Recorder{OnEvent: func(ev protocol.StreamEvent) error {
		if ev.Type == protocol.EventTextDelta {
			cancel()
		}
		return nil
	}}
	msg, err := openai.NewCompletions().Stream(callCtx, call(srv.URL, 0), rec.Emit)
	var ce *inference.CallError
	if !errors.As(err, &ce) || ce.Reason != protocol.StopAborted || msg.StopReason != protocol.StopAborted {
		t.Fatalf("err = %v, stop %q", err, msg.StopReason)
	}
	if d := inferencetest.Diff(rec.Summary(), []string{"start", "text_start 0", "text_delta 0 Hel", "error aborted"}); d != "" {
		t.Fatal(d)
	}
	select {
	case <-closed:
	case <-ctx.Done():
		t.Fatal("the provider never saw the connection close")
	}
}

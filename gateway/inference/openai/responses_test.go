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

func responsesCall(baseURL string, retries int) inference.Call {
	c := call(baseURL, retries)
	c.Model.API = inference.APIOpenAIResponses
	return c
}

// rev renders one Responses SSE event; fields is the JSON object body without braces (type is added).
func rev(typ, fields string) string {
	body := `"type":"` + typ + `"`
	if fields != "" {
		body += "," + fields
	}
	return "event: " + typ + "\ndata: {" + body + "}"
}

const respUsage = `"usage":{"input_tokens":120,"input_tokens_details":{"cached_tokens":100},"output_tokens":7,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":127}`

func respObj(status, extra string) string {
	s := `"response":{"id":"resp_1","object":"response","created_at":1,"status":"` + status + `","model":"gpt-5","output":[],` + respUsage
	if extra != "" {
		s += "," + extra
	}
	return s + "}"
}

var (
	respCreated = rev("response.created", `"sequence_number":0,"response":{"id":"resp_1","object":"response","created_at":1,"status":"in_progress","model":"gpt-5","output":[]}`)
	msgAdded    = rev("response.output_item.added", `"output_index":0,"item":{"id":"msg_1","type":"message","role":"assistant","status":"in_progress","content":[]}`)
	msgDone     = rev("response.output_item.done", `"output_index":0,"item":{"id":"msg_1","type":"message","role":"assistant","status":"completed","content":[]}`)
)

func textDelta(item, d string) string {
	b, _ := json.Marshal(d)
	return rev("response.output_text.delta", `"item_id":"`+item+`","output_index":0,"content_index":0,"delta":`+string(b))
}

func TestResponses(t *testing.T) {
	textTurn := []string{respCreated, msgAdded, textDelta("msg_1", "Hello"), textDelta("msg_1", " world"),
		rev("response.output_text.done", `"item_id":"msg_1","output_index":0,"content_index":0,"text":"Hello world"`),
		msgDone, rev("response.completed", respObj("completed", ""))}
	textEvents := []string{"start", "text_start 0", "text_delta 0 Hello", "text_delta 0  world", "text_end 0 Hello world", "done stop"}
	usage := &protocol.Usage{Input: 20, Output: 7, CacheRead: 100, TotalTokens: 127}
	for _, tc := range []struct {
		name     string
		handler  inferencetest.Handler
		retries  int
		want     []string
		stop     string
		text     string
		thinking string
		usage    *protocol.Usage
		status   int
		retry    time.Duration
		errMatch string
		requests int
	}{
		{
			name:    "plain text with usage",
			handler: func(_ int, w http.ResponseWriter, _ *http.Request) { inferencetest.SSE(w, textTurn...) },
			want:    textEvents, stop: protocol.StopStop, text: "Hello world", requests: 1, usage: usage,
		},
		{
			name: "reasoning summary, text, then two tool calls with streamed arguments",
			handler: func(_ int, w http.ResponseWriter, _ *http.Request) {
				inferencetest.SSE(w, respCreated,
					rev("response.output_item.added", `"output_index":0,"item":{"id":"rs_1","type":"reasoning","summary":[]}`),
					rev("response.reasoning_summary_part.added", `"item_id":"rs_1","output_index":0,"summary_index":0,"part":{"type":"summary_text","text":""}`),
					rev("response.reasoning_summary_text.delta", `"item_id":"rs_1","output_index":0,"summary_index":0,"delta":"Look at"`),
					rev("response.reasoning_summary_text.delta", `"item_id":"rs_1","output_index":0,"summary_index":0,"delta":" the file."`),
					rev("response.reasoning_summary_text.delta", `"item_id":"rs_1","output_index":0,"summary_index":1,"delta":"Then list."`),
					rev("response.output_item.done", `"output_index":0,"item":{"id":"rs_1","type":"reasoning","summary":[]}`),
					strings.Replace(msgAdded, `"output_index":0`, `"output_index":1`, 1),
					textDelta("msg_1", "Reading."),
					msgDone,
					rev("response.output_item.added", `"output_index":2,"item":{"id":"fc_1","type":"function_call","call_id":"call_abc","name":"read","arguments":"","status":"in_progress"}`),
					rev("response.function_call_arguments.delta", `"item_id":"fc_1","output_index":2,"delta":"{\"pa"`),
					rev("response.function_call_arguments.delta", `"item_id":"fc_1","output_index":2,"delta":"th\": \"README.md\"}"`),
					rev("response.function_call_arguments.done", `"item_id":"fc_1","output_index":2,"arguments":"{\"path\": \"README.md\"}"`),
					rev("response.output_item.done", `"output_index":2,"item":{"id":"fc_1","type":"function_call","call_id":"call_abc","name":"read","arguments":"{\"path\": \"README.md\"}","status":"completed"}`),
					// A server that sends the arguments only whole, in output_item.done.
					rev("response.output_item.added", `"output_index":3,"item":{"id":"fc_2","type":"function_call","call_id":"call_def","name":"ls","arguments":"","status":"in_progress"}`),
					rev("response.output_item.done", `"output_index":3,"item":{"id":"fc_2","type":"function_call","call_id":"call_def","name":"ls","arguments":"{}","status":"completed"}`),
					rev("response.completed", respObj("completed", "")))
			},
			want: []string{"start", "thinking_start 0", "thinking_delta 0 Look at", "thinking_delta 0  the file.", "thinking_delta 0 \n\n",
				"thinking_delta 0 Then list.", "thinking_end 0 Look at the file.\n\nThen list.",
				"text_start 1", "text_delta 1 Reading.", "text_end 1 Reading.", "toolcall_start 2 call_abc read",
				`toolcall_delta 2 {"pa`, `toolcall_delta 2 th": "README.md"}`, `toolcall_end 2 call_abc read {"path": "README.md"}`,
				"toolcall_start 3 call_def ls", "toolcall_delta 3 {}", "toolcall_end 3 call_def ls {}", "done toolUse"},
			stop: protocol.StopToolUse, text: "Reading.", thinking: "Look at the file.\n\nThen list.", requests: 1, usage: usage,
		},
		{
			name: "incomplete at max_output_tokens is length",
			handler: func(_ int, w http.ResponseWriter, _ *http.Request) {
				inferencetest.SSE(w, respCreated, msgAdded, textDelta("msg_1", "Hel"),
					rev("response.incomplete", respObj("incomplete", `"incomplete_details":{"reason":"max_output_tokens"}`)))
			},
			want: []string{"start", "text_start 0", "text_delta 0 Hel", "text_end 0 Hel", "done length"},
			stop: protocol.StopLength, text: "Hel", requests: 1, usage: usage,
		},
		{
			name: "error event mid-stream",
			handler: func(_ int, w http.ResponseWriter, _ *http.Request) {
				inferencetest.SSE(w, respCreated, msgAdded, textDelta("msg_1", "Hel"),
					rev("error", `"sequence_number":4,"code":"server_error","message":"The server had an error (`+secret+`)","param":null`))
			},
			want: []string{"start", "text_start 0", "text_delta 0 Hel", "error error"},
			stop: protocol.StopError, text: "Hel", errMatch: "server_error: The server had an error ([redacted])", requests: 1,
		},
		{
			name: "response.failed",
			handler: func(_ int, w http.ResponseWriter, _ *http.Request) {
				inferencetest.SSE(w, respCreated, msgAdded, textDelta("msg_1", "Hel"),
					rev("response.failed", respObj("failed", `"error":{"code":"server_error","message":"overloaded"}`)))
			},
			want: []string{"start", "text_start 0", "text_delta 0 Hel", "error error"},
			stop: protocol.StopError, text: "Hel", errMatch: "server_error: overloaded", requests: 1, usage: usage,
		},
		{
			name: "connection cut mid-stream",
			handler: func(_ int, w http.ResponseWriter, _ *http.Request) {
				inferencetest.SSE(w, respCreated, msgAdded, textDelta("msg_1", "Hel"))
				inferencetest.Cut()
			},
			want: []string{"start", "text_start 0", "text_delta 0 Hel", "error error"},
			stop: protocol.StopError, text: "Hel", errMatch: "EOF", requests: 1,
		},
		{
			name: "stream closed cleanly without response.completed",
			handler: func(_ int, w http.ResponseWriter, _ *http.Request) {
				inferencetest.SSE(w, respCreated, msgAdded, textDelta("msg_1", "Hel"))
			},
			want: []string{"start", "text_start 0", "text_delta 0 Hel", "error error"},
			stop: protocol.StopError, text: "Hel", errMatch: "without response.completed", requests: 1,
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
			want: textEvents, stop: protocol.StopStop, text: "Hello world", requests: 2, usage: usage,
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
			msg, err := openai.NewResponses().Stream(ctx, responsesCall(srv.URL, tc.retries), rec.Emit)
			if d := inferencetest.Diff(rec.Summary(), tc.want); d != "" {
				t.Fatal(d)
			}
			last := rec.Events[len(rec.Events)-1]
			if last.Message == nil || last.Message.StopReason != tc.stop || msg.StopReason != tc.stop {
				t.Fatalf("stop reason: event %+v, returned %q", last.Message, msg.StopReason)
			}
			if msg.API != "openai-responses" || msg.Provider != "openai" || msg.Model != "gpt-5" {
				t.Errorf("message identity: %s %s %s", msg.API, msg.Provider, msg.Model)
			}
			if got := msg.Text(); got != tc.text {
				t.Errorf("text = %q, want %q", got, tc.text)
			}
			var thinking string
			for _, c := range msg.Content {
				thinking += c.Thinking
			}
			if thinking != tc.thinking {
				t.Errorf("thinking = %q, want %q", thinking, tc.thinking)
			}
			if tc.usage != nil {
				want := *tc.usage
				responsesCall("", 0).Model.Cost.ApplyCost(&want)
				if *msg.Usage != want {
					t.Errorf("usage = %+v, want %+v", *msg.Usage, want)
				}
				if want.Cost.Total == 0 || want.Cost.CacheRead == 0 {
					t.Fatalf("test prices yield no cost: %+v", want.Cost)
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
			if r.Path != "/responses" || r.Header.Get("Authorization") != "Bearer "+secret {
				t.Errorf("request %s without the credential in Authorization", r.Path)
			}
			if r.Header.Get("X-Catalog-Header") != "from-catalog" {
				t.Errorf("catalog header missing")
			}
		})
	}
}

func TestResponsesRequestMapping(t *testing.T) {
	ctx := inferencetest.Context(t)
	srv := inferencetest.NewServer(t, func(_ int, w http.ResponseWriter, _ *http.Request) {
		inferencetest.SSE(w, respCreated, msgAdded, textDelta("msg_1", "ok"), rev("response.completed", respObj("completed", "")))
	})
	c := responsesCall(srv.URL, 0)
	temp := 0.2
	c.Options = inference.Options{Temperature: &temp, MaxTokens: 100, Reasoning: inference.ReasoningHigh}
	if _, err := openai.NewResponses().Stream(ctx, c, (&inferencetest.Recorder{}).Emit); err != nil {
		t.Fatal(err)
	}
	var body map[string]any
	if err := json.Unmarshal(srv.Requests()[0].Body, &body); err != nil {
		t.Fatal(err)
	}
	reasoning, _ := body["reasoning"].(map[string]any)
	if body["model"] != "gpt-5" || body["stream"] != true || body["store"] != false || body["max_output_tokens"] != 100.0 ||
		body["temperature"] != 0.2 || body["instructions"] != "You are terse." ||
		reasoning["effort"] != "high" || reasoning["summary"] != "auto" {
		t.Errorf("request: %v", body)
	}
	var kinds []string
	items := body["input"].([]any)
	for _, it := range items {
		m := it.(map[string]any)
		k, _ := m["type"].(string)
		if role, ok := m["role"].(string); ok {
			k += ":" + role
		}
		kinds = append(kinds, k)
	}
	// The aborted assistant message is left out.
	if strings.Join(kinds, ",") != ":user,function_call,function_call_output" {
		t.Errorf("input items: %v", kinds)
	}
	fc := items[1].(map[string]any)
	if fc["call_id"] != "call_0" || fc["name"] != "read" || fc["arguments"] != `{"path":"README.md"}` {
		t.Errorf("function call: %v", fc)
	}
	if out := items[2].(map[string]any); out["call_id"] != "call_0" || out["output"] != "# Hello" {
		t.Errorf("function call output: %v", out)
	}
	tools := body["tools"].([]any)
	if tl := tools[0].(map[string]any); tl["type"] != "function" || tl["name"] != "read" || tl["description"] != "Read a file" || tl["strict"] != false {
		t.Errorf("tool: %v", tl)
	}
}

func TestResponsesCancelClosesProviderConnection(t *testing.T) {
	ctx := inferencetest.Context(t)
	closed := make(chan struct{})
	srv := inferencetest.NewServer(t, func(_ int, w http.ResponseWriter, r *http.Request) {
		inferencetest.SSE(w, respCreated, msgAdded, textDelta("msg_1", "Hel"))
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
	msg, err := openai.NewResponses().Stream(callCtx, responsesCall(srv.URL, 0), rec.Emit)
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

func TestResponsesEmitErrorStopsTheCall(t *testing.T) {
	ctx := inferencetest.Context(t)
	closed := make(chan struct{})
	srv := inferencetest.NewServer(t, func(_ int, w http.ResponseWriter, r *http.Request) {
		inferencetest.SSE(w, respCreated, msgAdded, textDelta("msg_1", "Hel"))
		<-r.Context().Done()
		close(closed)
	})
	stop := errors.New("worker gone")
	rec := &inferencetest.Recorder{OnEvent: func(ev protocol.StreamEvent) error {
		if ev.Type == protocol.EventTextDelta {
			return stop
		}
		return nil
	}}
	if _, err := openai.NewResponses().Stream(ctx, responsesCall(srv.URL, 0), rec.Emit); !errors.Is(err, stop) {
		t.Fatalf("err = %v, want the emit error", err)
	}
	if d := inferencetest.Diff(rec.Summary(), []string{"start", "text_start 0", "text_delta 0 Hel"}); d != "" {
		t.Fatal(d)
	}
	select {
	case <-closed:
	case <-ctx.Done():
		t.Fatal("the provider never saw the connection close")
	}
}

package openai_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

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
	for _, tc := range append([]inferencetest.Case{
		{
			Name:    "plain text with usage",
			Handler: func(_ int, w http.ResponseWriter, _ *http.Request) { inferencetest.SSE(w, textTurn...) },
			Events:  textEvents, Stop: protocol.StopStop, Text: "Hello world", Requests: 1, Usage: usage,
		},
		{
			Name: "reasoning summary, text, then two tool calls with streamed arguments",
			Handler: func(_ int, w http.ResponseWriter, _ *http.Request) {
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
			Events: []string{"start", "thinking_start 0", "thinking_delta 0 Look at", "thinking_delta 0  the file.", "thinking_delta 0 \n\n",
				"thinking_delta 0 Then list.", "thinking_end 0 Look at the file.\n\nThen list.",
				"text_start 1", "text_delta 1 Reading.", "text_end 1 Reading.", "toolcall_start 2 call_abc read",
				`toolcall_delta 2 {"pa`, `toolcall_delta 2 th": "README.md"}`, `toolcall_end 2 call_abc read {"path": "README.md"}`,
				"toolcall_start 3 call_def ls", "toolcall_delta 3 {}", "toolcall_end 3 call_def ls {}", "done toolUse"},
			Stop: protocol.StopToolUse, Text: "Reading.", Thinking: "Look at the file.\n\nThen list.", Requests: 1, Usage: usage,
		},
		{
			Name: "incomplete at max_output_tokens is length",
			Handler: func(_ int, w http.ResponseWriter, _ *http.Request) {
				inferencetest.SSE(w, respCreated, msgAdded, textDelta("msg_1", "Hel"),
					rev("response.incomplete", respObj("incomplete", `"incomplete_details":{"reason":"max_output_tokens"}`)))
			},
			Events: []string{"start", "text_start 0", "text_delta 0 Hel", "text_end 0 Hel", "done length"},
			Stop:   protocol.StopLength, Text: "Hel", Requests: 1, Usage: usage,
		},
		{
			Name: "error event mid-stream",
			Handler: func(_ int, w http.ResponseWriter, _ *http.Request) {
				inferencetest.SSE(w, respCreated, msgAdded, textDelta("msg_1", "Hel"),
					rev("error", `"sequence_number":4,"code":"server_error","message":"The server had an error (`+secret+`)","param":null`))
			},
			Events: []string{"start", "text_start 0", "text_delta 0 Hel", "error error"},
			Stop:   protocol.StopError, Text: "Hel", ErrMatch: "server_error: The server had an error ([redacted])", Requests: 1,
		},
		{
			Name: "response.failed",
			Handler: func(_ int, w http.ResponseWriter, _ *http.Request) {
				inferencetest.SSE(w, respCreated, msgAdded, textDelta("msg_1", "Hel"),
					rev("response.failed", respObj("failed", `"error":{"code":"server_error","message":"overloaded"}`)))
			},
			Events: []string{"start", "text_start 0", "text_delta 0 Hel", "error error"},
			Stop:   protocol.StopError, Text: "Hel", ErrMatch: "server_error: overloaded", Requests: 1, Usage: usage,
		},
		{
			Name: "connection cut mid-stream",
			Handler: func(_ int, w http.ResponseWriter, _ *http.Request) {
				inferencetest.SSE(w, respCreated, msgAdded, textDelta("msg_1", "Hel"))
				inferencetest.Cut()
			},
			Events: []string{"start", "text_start 0", "text_delta 0 Hel", "error error"},
			Stop:   protocol.StopError, Text: "Hel", ErrMatch: "EOF", Requests: 1,
		},
		{
			Name: "stream closed cleanly without response.completed",
			Handler: func(_ int, w http.ResponseWriter, _ *http.Request) {
				inferencetest.SSE(w, respCreated, msgAdded, textDelta("msg_1", "Hel"))
			},
			Events: []string{"start", "text_start 0", "text_delta 0 Hel", "error error"},
			Stop:   protocol.StopError, Text: "Hel", ErrMatch: "without response.completed", Requests: 1,
		},
	}, httpErrorCases(textTurn, textEvents, usage)...) {
		t.Run(tc.Name, func(t *testing.T) {
			msg, r := inferencetest.RunCase(t, openai.NewResponses(), responsesCall, secret, tc)
			if msg.API != "openai-responses" || msg.Provider != "openai" || msg.Model != "gpt-5" {
				t.Errorf("message identity: %s %s %s", msg.API, msg.Provider, msg.Model)
			}
			var thinking string
			for _, c := range msg.Content {
				thinking += c.Thinking
			}
			if thinking != tc.Thinking {
				t.Errorf("thinking = %q, want %q", thinking, tc.Thinking)
			}
			if tc.Usage != nil {
				want := *tc.Usage
				responsesCall("", 0).Model.Cost.ApplyCost(&want)
				if want.Cost.Total == 0 || want.Cost.CacheRead == 0 {
					t.Fatalf("test prices yield no cost: %+v", want.Cost)
				}
			}
			checkRequest(t, r, "/responses")
		})
	}
}

func TestResponsesRequestMapping(t *testing.T) {
	body := mappedRequest(t, openai.NewResponses(), responsesCall, respCreated, msgAdded, textDelta("msg_1", "ok"),
		rev("response.completed", respObj("completed", "")))
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
	inferencetest.CheckCancel(t, streamResponses, respCreated, msgAdded, textDelta("msg_1", "Hel"))
}

// streamResponses calls the Responses adapter with the test call against the provider at baseURL.
func streamResponses(ctx context.Context, baseURL string, emit inference.Emit) (protocol.Message, error) {
	return openai.NewResponses().Stream(ctx, responsesCall(baseURL, 0), emit)
}

func TestResponsesEmitErrorStopsTheCall(t *testing.T) {
	rec := inferencetest.CheckEmitError(t, streamResponses, respCreated, msgAdded, textDelta("msg_1", "Hel"))
	if d := inferencetest.Diff(rec.Summary(), []string{"start", "text_start 0", "text_delta 0 Hel"}); d != "" {
		t.Fatal(d)
	}
}

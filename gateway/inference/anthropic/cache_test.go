package anthropic_test

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/openclaw/cloudworkers/gateway/inference/anthropic"
	"github.com/openclaw/cloudworkers/protocol"
)

// TestCacheBreakpoints: the request carries Anthropic's four cache breakpoints by the documented
// policy: the last tool, the system prompt, the last block of the last message, and the last block
// of the user message before it (the previous call's rolling breakpoint); none elsewhere. Two
// requests built from the same inputs are the same bytes.
func TestCacheBreakpoints(t *testing.T) {
	c := call("http://127.0.0.1:1", 0)
	c.Context.Tools = append(c.Context.Tools, protocol.Tool{Name: "write", Parameters: json.RawMessage(`{"type":"object","properties":{}}`)})
	c.Context.Messages = append(c.Context.Messages,
		protocol.Message{Role: protocol.RoleAssistant, API: string(c.Model.API), Provider: c.Model.Provider, Model: c.Model.ID, StopReason: protocol.StopStop,
			Content: []protocol.Content{{Type: protocol.ContentText, Text: "read it"}, {Type: protocol.ContentThinking, Thinking: "hm", Signature: "sig"}}},
		protocol.Message{Role: protocol.RoleUser, Content: []protocol.Content{{Type: protocol.ContentText, Text: "thanks"}}})
	p, opts, err := anthropic.Params(c)
	if err != nil || len(opts) != 0 {
		t.Fatal(err, opts)
	}
	body, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	var req struct {
		System   []map[string]any
		Tools    []map[string]any
		Messages []struct {
			Role    string
			Content []map[string]any
		}
	}
	if err := json.Unmarshal(body, &req); err != nil {
		t.Fatal(err)
	}
	var marked []string
	mark := func(where string, block map[string]any) {
		if cc, ok := block["cache_control"].(map[string]any); ok {
			if cc["type"] != "ephemeral" {
				t.Errorf("%s: cache_control %v", where, cc)
			}
			marked = append(marked, where)
		}
	}
	for _, tl := range req.Tools {
		mark(fmt.Sprint("tool ", tl["name"]), tl)
	}
	for _, s := range req.System {
		mark("system", s)
	}
	for i, m := range req.Messages {
		for j, b := range m.Content {
			mark(fmt.Sprintf("messages[%d][%d] %s %v", i, j, m.Role, b["type"]), b)
		}
	}
	want := []string{"tool write", "system", "messages[2][0] user tool_result", "messages[4][0] user text"}
	if len(marked) != len(want) {
		t.Fatalf("breakpoints %q, want %q\n%s", marked, want, body)
	}
	for i := range want {
		if marked[i] != want[i] {
			t.Fatalf("breakpoints %q, want %q\n%s", marked, want, body)
		}
	}
	again, _, _ := anthropic.Params(c)
	if b, _ := json.Marshal(again); string(b) != string(body) {
		t.Fatalf("the same call built twice differs:\n%s\n%s", b, body)
	}
}

package scripted_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/openclaw/cloudworkers/gateway/inference"
	"github.com/openclaw/cloudworkers/gateway/inference/inferencetest"
	"github.com/openclaw/cloudworkers/gateway/inference/scripted"
	"github.com/openclaw/cloudworkers/protocol"
)

const script = `[
  {"thinking": "look first", "text": "Reading.", "toolCalls": [{"name": "read", "arguments": {"path": "a.txt"}}, {"name": "ls"}]},
  {"text": "All done."}
]`

func callWith(t *testing.T, assistants int) inference.Call {
	t.Helper()
	path := filepath.Join(t.TempDir(), "script.json")
	if err := os.WriteFile(path, []byte(script), 0o600); err != nil {
		t.Fatal(err)
	}
	cx := protocol.Context{Messages: []protocol.Message{{Role: protocol.RoleUser, Content: []protocol.Content{{Type: protocol.ContentText, Text: "go"}}}}}
	for i := 0; i < assistants; i++ {
		cx.Messages = append(cx.Messages, protocol.Message{Role: protocol.RoleAssistant, Content: []protocol.Content{{Type: protocol.ContentText, Text: "x"}}},
			protocol.Message{Role: protocol.RoleToolResult, ToolCallID: "c", Content: []protocol.Content{{Type: protocol.ContentText, Text: "r"}}})
	}
	return inference.Call{Model: inference.Model{Provider: "demo", ID: "demo", API: inference.APIScripted, Script: path}, Context: cx}
}

func TestTurnsByAssistantCount(t *testing.T) {
	for _, tc := range []struct {
		assistants int
		want       []string
		stop       string
	}{
		{0, []string{"start", "thinking_start 0", "thinking_delta 0 look ", "thinking_delta 0 first", "thinking_end 0 look first",
			"text_start 1", "text_delta 1 Reading.", "text_end 1 Reading.",
			"toolcall_start 2 call_0_0 read", `toolcall_delta 2 {"path": `, `toolcall_delta 2 "a.txt"}`, `toolcall_end 2 call_0_0 read {"path": "a.txt"}`,
			"toolcall_start 3 call_0_1 ls", "toolcall_delta 3 {}", "toolcall_end 3 call_0_1 ls {}", "done toolUse"}, protocol.StopToolUse},
		{1, []string{"start", "text_start 0", "text_delta 0 All ", "text_delta 0 done.", "text_end 0 All done.", "done stop"}, protocol.StopStop},
		{2, []string{"start", "text_start 0", "text_delta 0 (script ", "text_delta 0 finished)", "text_end 0 (script finished)", "done stop"}, protocol.StopStop},
	} {
		rec := &inferencetest.Recorder{}
		msg, err := scripted.New().Stream(inferencetest.Context(t), callWith(t, tc.assistants), rec.Emit)
		if err != nil {
			t.Fatal(err)
		}
		if d := inferencetest.Diff(rec.Summary(), tc.want); d != "" {
			t.Fatalf("after %d assistant messages: %s", tc.assistants, d)
		}
		if msg.StopReason != tc.stop || msg.Usage == nil || msg.Usage.Output == 0 {
			t.Errorf("message %+v", msg)
		}
		// Deterministic: the same context gives the same message.
		again, _ := scripted.New().Stream(inferencetest.Context(t), callWith(t, tc.assistants), (&inferencetest.Recorder{}).Emit)
		a, _ := json.Marshal(msg.Content)
		b, _ := json.Marshal(again.Content)
		if string(a) != string(b) {
			t.Errorf("not deterministic: %s vs %s", a, b)
		}
	}
}

func TestDefaultScriptAndBadScripts(t *testing.T) {
	if len(scripted.DefaultScript()) == 0 {
		t.Fatal("empty default script")
	}
	for _, bad := range []string{`{}`, `[{}]`, `[{"toolCalls":[{"arguments":{}}]}]`, `[{"text":"x","toolCalls":[{"name":"a","arguments":[1]}]}]`, `[{"txt":"typo"}]`} {
		if _, err := scripted.Parse([]byte(bad)); err == nil {
			t.Errorf("Parse(%s) succeeded", bad)
		}
	}
	c := callWith(t, 0)
	c.Model.Script = filepath.Join(t.TempDir(), "missing.json")
	rec := &inferencetest.Recorder{}
	msg, err := scripted.New().Stream(inferencetest.Context(t), c, rec.Emit)
	var ce *inference.CallError
	if !errors.As(err, &ce) || msg.StopReason != protocol.StopError {
		t.Fatalf("missing script: %v %+v", err, msg)
	}
}

func TestCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(inferencetest.Context(t))
	cancel()
	msg, err := scripted.New().Stream(ctx, callWith(t, 0), (&inferencetest.Recorder{}).Emit)
	var ce *inference.CallError
	if !errors.As(err, &ce) || ce.Reason != protocol.StopAborted || msg.StopReason != protocol.StopAborted {
		t.Fatalf("err %v", err)
	}
}

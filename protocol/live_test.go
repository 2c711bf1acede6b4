package protocol

import "testing"

func TestLiveEventValidate(t *testing.T) {
	tests := []struct {
		name string
		ev   LiveEvent
		ok   bool
	}{
		{"text", LiveEvent{Type: LiveTextDelta, Delta: "hi"}, true},
		{"thinking", LiveEvent{Type: LiveThinkingDelta, Delta: "hm"}, true},
		{"tool start", LiveEvent{Type: LiveToolStart, ToolCallID: "c1", ToolName: "bash", Args: []byte(`{"cmd":"ls"}`)}, true},
		{"tool update", LiveEvent{Type: LiveToolUpdate, ToolCallID: "c1", PartialResult: []byte(`"out"`)}, true},
		{"tool result", LiveEvent{Type: LiveToolResult, ToolCallID: "c1", Result: []byte(`{}`), IsError: true}, true},
		{"lifecycle end", LiveEvent{Type: LiveLifecycleEnd}, true},
		{"lifecycle error", LiveEvent{Type: LiveLifecycleError, Error: "boom"}, true},
		{"unknown type", LiveEvent{Type: "approval"}, false},
		{"text with tool field", LiveEvent{Type: LiveTextDelta, Delta: "x", ToolName: "bash"}, false},
		{"lifecycle start with delta", LiveEvent{Type: LiveLifecycleStart, Delta: "x"}, false},
		{"error without message", LiveEvent{Type: LiveLifecycleError}, false},
		{"args not JSON", LiveEvent{Type: LiveToolStart, ToolCallID: "c", ToolName: "n", Args: []byte(`{`)}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.ev.Validate(); (err == nil) != tt.ok {
				t.Fatalf("Validate = %v, want ok=%v", err, tt.ok)
			}
		})
	}
}

package protocol

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"
)

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

// A live event over MaxLiveEventBytes is refused; Fit cuts any event to a valid one within it,
// keeping what fits, and leaves an event that fits as it is.
func TestLiveEventSizeAndFit(t *testing.T) {
	big := strings.Repeat("é\"x", MaxLiveEventBytes) // multi-byte runes and quotes to escape
	bigJSON, _ := json.Marshal(map[string]string{"content": big})
	over := []LiveEvent{
		{Type: LiveTextDelta, Delta: big},
		{Type: LiveLifecycleError, Error: big},
		{Type: LiveToolStart, ToolCallID: "c1", ToolName: "write", Args: bigJSON},
		{Type: LiveToolUpdate, ToolCallID: "c1", PartialResult: bigJSON},
		{Type: LiveToolResult, ToolCallID: strings.Repeat("i", 4096), ToolName: strings.Repeat("n", 4096), Result: bigJSON, IsError: true},
	}
	for _, ev := range over {
		if err := ev.Validate(); err == nil || !strings.Contains(err.Error(), "at most 65536") {
			t.Errorf("%s event of %d bytes: Validate = %v, want it refused for its size", ev.Type, ev.size(), err)
		}
		fit := ev.Fit()
		if err := fit.Validate(); err != nil {
			t.Errorf("%s event after Fit: %v", ev.Type, err)
		}
		if fit.size() > MaxLiveEventBytes || fit.size() < MaxLiveEventBytes/4 {
			t.Errorf("%s event after Fit carries %d bytes, want most of the %d allowed", ev.Type, fit.size(), MaxLiveEventBytes)
		}
		if fit.Type != ev.Type || fit.IsError != ev.IsError {
			t.Errorf("Fit changed the event's type or error flag: %+v", fit)
		}
		for _, raw := range []json.RawMessage{fit.Args, fit.PartialResult, fit.Result} {
			var s string
			if len(raw) > 0 && (json.Unmarshal(raw, &s) != nil || !strings.Contains(s, fmt.Sprintf("[%d bytes, cut for the live view]", len(bigJSON)))) {
				t.Errorf("a cut args/result is %.80s…, want a JSON string that gives the size", raw)
			}
		}
		if !utf8.ValidString(fit.Delta) || !utf8.ValidString(fit.Error) {
			t.Errorf("Fit cut a rune in two")
		}
	}
	small := LiveEvent{Type: LiveToolStart, ToolCallID: "c1", ToolName: "write", Args: []byte(`{"content":"hi"}`)}
	if got := small.Fit(); !reflect.DeepEqual(got, small) {
		t.Errorf("Fit changed an event that fits: %+v", got)
	}
}

// Fit measures an event as the gateway decodes it (an invalid byte arrives as U+FFFD, 3 bytes),
// and keeps the end of an error, where its cause is.
func TestLiveEventFitAsDecoded(t *testing.T) {
	ev := LiveEvent{Type: LiveLifecycleError, Error: strings.Repeat("a\xff", (MaxLiveEventBytes-100)/2) + ": context canceled"}
	b, err := json.Marshal(ev.Fit())
	if err != nil {
		t.Fatal(err)
	}
	var got LiveEvent
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	if err := got.Validate(); err != nil {
		t.Fatalf("a fitted event as the gateway decodes it: %v", err)
	}
	if !strings.HasSuffix(got.Error, ": context canceled") || !strings.HasPrefix(got.Error, "…") {
		t.Fatalf("fitted error %.20q…%q, want its end kept", got.Error, got.Error[max(0, len(got.Error)-20):])
	}
}

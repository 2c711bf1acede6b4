package console

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/openclaw/cloudworkers/gateway/sessions"
	"github.com/openclaw/cloudworkers/protocol"
)

// TestPrinterKeepsTextAndActivityApart: assistant text goes to Out, tool activity and the run's
// lifecycle to Info, and a text line left open is ended before a note so the two never run
// together on a terminal that shows both.
func TestPrinterKeepsTextAndActivityApart(t *testing.T) {
	var out, info bytes.Buffer
	p := &Printer{Out: &out, Info: &info}
	for _, r := range []sessions.LiveRecord{
		{RunID: "run_1", Event: protocol.LiveEvent{Type: protocol.LiveLifecycleStart}},
		{RunID: "run_1", Event: protocol.LiveEvent{Type: protocol.LiveTextDelta, Delta: "Reading"}},
		{RunID: "run_1", Event: protocol.LiveEvent{Type: protocol.LiveThinkingDelta, Delta: "hidden"}},
		{RunID: "run_1", Event: protocol.LiveEvent{Type: protocol.LiveToolStart, ToolName: "read", Args: json.RawMessage(`{"path":"a.txt"}`)}},
		{RunID: "run_1", Event: protocol.LiveEvent{Type: protocol.LiveToolResult, ToolName: "read", IsError: true, Result: json.RawMessage(`"no  such   file"`)}},
		{RunID: "run_1", Event: protocol.LiveEvent{Type: protocol.LiveLifecycleError, Error: "model refused"}},
	} {
		p.Print(&r)
	}
	if got, want := out.String(), "Reading\n"; got != want {
		t.Errorf("out %q, want %q", got, want)
	}
	want := "[run run_1 started]\n→ read {\"path\":\"a.txt\"}\n← read error \"no such file\"\n[run run_1 failed: model refused]\n"
	if got := info.String(); got != want {
		t.Errorf("info %q, want %q", got, want)
	}
}

package scripted

import (
	"testing"

	"github.com/openclaw/cloudworkers/protocol"
)

// "{{last.FIELD}}" in a scripted tool call's arguments is the field of the newest tool result
// that has it, JSON-escaped; a field no result has becomes empty.
func TestSubstituteLast(t *testing.T) {
	res := func(text string) protocol.Message {
		return protocol.Message{Role: protocol.RoleToolResult, ToolCallID: "c", Content: []protocol.Content{{Type: protocol.ContentText, Text: text}}}
	}
	msgs := []protocol.Message{
		res(`{"sessionId":"ses_old","branch":"b\"x"}`),
		{Role: protocol.RoleAssistant, Content: []protocol.Content{{Type: protocol.ContentText, Text: `{"sessionId":"ses_assistant"}`}}},
		res(`{"sessionId":"ses_new"}`),
		res(`not json`),
	}
	for in, want := range map[string]string{
		`{"sessionId":"{{last.sessionId}}"}`: `{"sessionId":"ses_new"}`,
		`{"b":"{{last.branch}}"}`:            `{"b":"b\"x"}`,
		`{"x":"{{last.missing}}"}`:           `{"x":""}`,
		`{"x":"{{other.sessionId}}"}`:        `{"x":"{{other.sessionId}}"}`,
	} {
		if got := substituteLast(in, msgs); got != want {
			t.Errorf("substituteLast(%s) = %s, want %s", in, got, want)
		}
	}
}

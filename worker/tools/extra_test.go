package tools

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/openclaw/cloudworkers/protocol"
)

type echoTool struct{ name string }

func (e echoTool) Name() string { return e.name }
func (e echoTool) Schema() protocol.Tool {
	return protocol.Tool{Name: e.name, Description: "echo", Parameters: json.RawMessage(`{"type":"object"}`)}
}
func (e echoTool) Run(_ context.Context, args json.RawMessage) (Result, error) {
	return Result{Content: []protocol.Content{{Type: protocol.ContentText, Text: "echo " + string(args)}}}, nil
}

func TestExtraToolsAreOfferedAndRun(t *testing.T) {
	s := NewSet(Config{Workspace: t.TempDir(), Extra: []Tool{echoTool{"web_search"}, echoTool{"read"}}})
	defer s.Close(context.Background())
	var names []string
	for _, sc := range s.Schemas() {
		names = append(names, sc.Name)
	}
	if len(names) != 10 || names[9] != "web_search" {
		t.Fatalf("schemas %v: want the 9 built-ins then web_search (a clashing extra is ignored)", names)
	}
	if got := s.Run(context.Background(), "web_search", json.RawMessage(`{"query":"x"}`)); got.IsError || got.Text() != `echo {"query":"x"}` {
		t.Fatalf("extra tool result %+v", got)
	}
}

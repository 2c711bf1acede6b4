// Package scripted is the inference adapter that replays a JSON script of assistant turns, for demos
// and tests without a model provider.
package scripted

import (
	"bytes"
	"context"
	_ "embed"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"regexp"
	"strings"

	"github.com/openclaw/cloudworkers/gateway/inference"
	"github.com/openclaw/cloudworkers/protocol"
)

//go:embed default-script.json
var defaultScript []byte

// Finished is the text of every turn after the script's last one.
const Finished = "(script finished)"

// MaxScriptBytes bounds a script file.
const MaxScriptBytes = 4 << 20

// ToolCall is a scripted tool call.
type ToolCall struct {
	Name      string          `json:"name"`
	Arguments json.RawMessage `json:"arguments,omitempty"`
}

// Turn is one scripted assistant message: thinking, then text, then tool calls.
type Turn struct {
	Thinking  string     `json:"thinking,omitempty"`
	Text      string     `json:"text,omitempty"`
	ToolCalls []ToolCall `json:"toolCalls,omitempty"`
}

// Parse decodes and validates a script.
func Parse(b []byte) ([]Turn, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var turns []Turn
	if err := dec.Decode(&turns); err != nil {
		return nil, fmt.Errorf("script: %w", err)
	}
	for i, t := range turns {
		if t.Text == "" && t.Thinking == "" && len(t.ToolCalls) == 0 {
			return nil, fmt.Errorf("script turn %d is empty", i)
		}
		for j, tc := range t.ToolCalls {
			if tc.Name == "" {
				return nil, fmt.Errorf("script turn %d, tool call %d: name is required", i, j)
			}
			var obj map[string]json.RawMessage
			if len(tc.Arguments) > 0 && (json.Unmarshal(tc.Arguments, &obj) != nil || obj == nil) {
				return nil, fmt.Errorf("script turn %d, tool call %d: arguments must be a JSON object", i, j)
			}
		}
	}
	return turns, nil
}

// DefaultScript is the built-in demo script.
func DefaultScript() []Turn {
	t, err := Parse(defaultScript)
	if err != nil {
		panic(err)
	}
	return t
}

// Adapter replays scripts. The turn is chosen by the number of assistant messages already in the
// context, so a replay is deterministic across restarts and placements.
type Adapter struct{}

var _ inference.Adapter = (*Adapter)(nil)

// New returns the scripted adapter.
func New() *Adapter { return &Adapter{} }

func loadScript(path string) ([]Turn, error) {
	if path == "" {
		return DefaultScript(), nil
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, MaxScriptBytes+1))
	if err != nil {
		return nil, err
	}
	if len(b) > MaxScriptBytes {
		return nil, fmt.Errorf("script %s is larger than %d bytes", path, MaxScriptBytes)
	}
	return Parse(b)
}

// Stream implements inference.Adapter.
func (a *Adapter) Stream(ctx context.Context, call inference.Call, emit inference.Emit) (protocol.Message, error) {
	b := inference.NewBuilder(call, emit)
	if err := b.Start(); err != nil {
		return protocol.Message{}, err
	}
	turns, err := loadScript(call.Model.Script)
	if err != nil {
		return b.Fail(ctx, err)
	}
	n := 0
	inChars := len(call.Context.SystemPrompt)
	for _, m := range call.Context.Messages {
		if m.Role == protocol.RoleAssistant {
			n++
		}
		inChars += messageChars(m)
	}
	turn := Turn{Text: Finished}
	if n < len(turns) {
		turn = turns[n]
	}
	outChars := 0
	block := func(begin func() (int, error), text string) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		i, err := begin()
		if err != nil {
			return err
		}
		// Words as deltas, so consumers see a real stream.
		for _, w := range splitKeep(text) {
			if err := b.Delta(i, w); err != nil {
				return err
			}
		}
		outChars += len(text)
		return b.End(i)
	}
	if turn.Thinking != "" {
		if err := block(b.BeginThinking, turn.Thinking); err != nil {
			return fail(ctx, b, err)
		}
	}
	if turn.Text != "" {
		if err := block(b.BeginText, turn.Text); err != nil {
			return fail(ctx, b, err)
		}
	}
	for i, tc := range turn.ToolCalls {
		args := string(tc.Arguments)
		if args == "" {
			args = "{}"
		}
		args = substituteLast(args, call.Context.Messages)
		id := fmt.Sprintf("call_%d_%d", n, i)
		if err := block(func() (int, error) { return b.BeginToolCall(id, tc.Name) }, args); err != nil {
			return fail(ctx, b, err)
		}
	}
	// A rough estimate (4 characters a token) so accounting has numbers to show.
	b.SetUsage(protocol.Usage{Input: int64((inChars + 3) / 4), Output: int64((outChars + 3) / 4)})
	reason := protocol.StopStop
	if len(turn.ToolCalls) > 0 {
		reason = protocol.StopToolUse
	}
	return b.Done(reason)
}

func fail(ctx context.Context, b *inference.Builder, err error) (protocol.Message, error) {
	if b.Err() != nil {
		return protocol.Message{}, b.Err()
	}
	return b.Fail(ctx, err)
}

func messageChars(m protocol.Message) int {
	n := 0
	for _, c := range m.Content {
		n += len(c.Text) + len(c.Thinking) + len(c.Arguments) + len(c.Name)
	}
	return n
}

// splitKeep splits s into words, each keeping its trailing whitespace.
func splitKeep(s string) []string {
	var out []string
	for s != "" {
		i := strings.IndexAny(s, " \n")
		if i < 0 {
			return append(out, s)
		}
		out = append(out, s[:i+1])
		s = s[i+1:]
	}
	return out
}

// lastRef is how a scripted tool call's arguments name a field of an earlier tool's result:
// "{{last.FIELD}}" is replaced by the string field FIELD of the JSON object that is the text of
// the newest tool result in the context that has it (a script can follow up on a session id that
// sessions_spawn returned).
var lastRef = regexp.MustCompile(`\{\{last\.([A-Za-z0-9_]+)\}\}`)

func substituteLast(args string, msgs []protocol.Message) string {
	return lastRef.ReplaceAllStringFunc(args, func(ref string) string {
		field := lastRef.FindStringSubmatch(ref)[1]
		for i := len(msgs) - 1; i >= 0; i-- {
			if msgs[i].Role != protocol.RoleToolResult {
				continue
			}
			var obj map[string]any
			if json.Unmarshal([]byte(msgs[i].Text()), &obj) != nil {
				continue
			}
			if v, ok := obj[field].(string); ok {
				b, _ := json.Marshal(v)
				return strings.Trim(string(b), `"`)
			}
		}
		return ""
	})
}

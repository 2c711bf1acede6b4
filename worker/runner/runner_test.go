package runner

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/openclaw/cloudworkers/protocol"
)

// recordingBackend keeps the live events it accepted; like the real backends, it refuses work on a
// cancelled context.
type recordingBackend struct {
	mu     sync.Mutex
	events []protocol.LiveEvent
	seqs   []uint64
}

func (b *recordingBackend) Context(ctx context.Context, _ string) ([]protocol.Message, string, error) {
	return nil, "", ctx.Err()
}

func (b *recordingBackend) Commit(ctx context.Context, _ string, _, _ uint64, _ string, _ []protocol.Message) (string, error) {
	return "leaf", ctx.Err()
}

func (b *recordingBackend) Live(ctx context.Context, _ string, _ uint64, _ string, seq uint64, ev protocol.LiveEvent) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.events, b.seqs = append(b.events, ev), append(b.seqs, seq)
	return nil
}

type noModel struct{}

func (noModel) Stream(context.Context, string, protocol.Context, func(protocol.StreamEvent) error) (protocol.Message, error) {
	return protocol.Message{}, context.Canceled
}

// TestRunCancelledBeforeItStartsStillReportsItsEnd: a turn cancelled before its first event (a
// cancel that reaches the worker as the turn starts) still publishes its start and a lifecycle
// error ending in "context canceled", in sequence: without them the gateway would wait for the
// turn's end forever.
func TestRunCancelledBeforeItStartsStillReportsItsEnd(t *testing.T) {
	b := &recordingBackend{}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := New(Config{Model: noModel{}, Backend: b}).Run(ctx, Turn{SessionID: "ses_1", RunEpoch: 1, RunID: "run_1", ModelRef: "m", Text: "hi"})
	if err == nil {
		t.Fatal("a cancelled run reported success")
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.events) != 2 || b.events[0].Type != protocol.LiveLifecycleStart || b.events[1].Type != protocol.LiveLifecycleError {
		t.Fatalf("live events %+v, want lifecycle_start then lifecycle_error", b.events)
	}
	if !strings.HasSuffix(b.events[1].Error, context.Canceled.Error()) {
		t.Fatalf("lifecycle error %q does not say the run was canceled", b.events[1].Error)
	}
	if b.seqs[0] != 1 || b.seqs[1] != 2 {
		t.Fatalf("seqs %v, want 1, 2", b.seqs)
	}
}

// bigWriteModel asks once for a tool call whose arguments are larger than a live event may be,
// then ends the turn.
type bigWriteModel struct{ calls int }

func (m *bigWriteModel) Stream(_ context.Context, _ string, _ protocol.Context, _ func(protocol.StreamEvent) error) (protocol.Message, error) {
	m.calls++
	if m.calls == 1 {
		args, _ := json.Marshal(map[string]string{"path": "big.txt", "content": strings.Repeat("x", 3*protocol.MaxLiveEventBytes)})
		return protocol.Message{Role: protocol.RoleAssistant, StopReason: protocol.StopToolUse,
			Content: []protocol.Content{{Type: protocol.ContentToolCall, ID: "call_1", Name: "write", Arguments: args}}}, nil
	}
	return protocol.Message{Role: protocol.RoleAssistant, StopReason: protocol.StopStop,
		Content: []protocol.Content{{Type: protocol.ContentText, Text: "done"}}}, nil
}

// A model that writes a large file still runs its turn: the live view of its tool call is cut to
// protocol.MaxLiveEventBytes (which the gateway refuses beyond), and every event is valid.
func TestALargeToolCallIsCutForTheLiveView(t *testing.T) {
	b := &recordingBackend{}
	if err := New(Config{Model: &bigWriteModel{}, Backend: b}).Run(context.Background(), Turn{SessionID: "ses_1", RunEpoch: 1, RunID: "run_1", ModelRef: "m", Text: "hi"}); err != nil {
		t.Fatal(err)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	started := false
	for _, ev := range b.events {
		if err := ev.Validate(); err != nil {
			t.Errorf("live event %s: %v", ev.Type, err)
		}
		started = started || (ev.Type == protocol.LiveToolStart && ev.ToolName == "write" && strings.Contains(string(ev.Args), "cut for the live view"))
	}
	if !started {
		t.Fatalf("no cut tool_start for the write in %d events", len(b.events))
	}
}

// yieldingModel answers a tool call, then (as the hub does for a run a live move stops) refuses
// the next call with protocol.CodeRunYield; it counts the calls and keeps what each was given.
type yieldingModel struct {
	calls    int
	yieldAt  int
	contexts []protocol.Context
}

func (m *yieldingModel) Stream(_ context.Context, _ string, c protocol.Context, _ func(protocol.StreamEvent) error) (protocol.Message, error) {
	m.calls++
	m.contexts = append(m.contexts, c)
	if m.calls == m.yieldAt {
		return protocol.Message{}, protocol.Errorf(protocol.CodeRunYield, "the session moves live")
	}
	if len(c.Messages) > 0 && c.Messages[len(c.Messages)-1].Role == protocol.RoleToolResult {
		return protocol.Message{Role: protocol.RoleAssistant, StopReason: protocol.StopStop,
			Content: []protocol.Content{{Type: protocol.ContentText, Text: "done"}}}, nil
	}
	return protocol.Message{Role: protocol.RoleAssistant, StopReason: protocol.StopToolUse,
		Content: []protocol.Content{{Type: protocol.ContentToolCall, ID: "call_1", Name: "nosuch", Arguments: json.RawMessage(`{}`)}}}, nil
}

// committingBackend is a recordingBackend that keeps the messages committed.
type committingBackend struct {
	recordingBackend
	msgs []protocol.Message
}

func (b *committingBackend) Context(context.Context, string) ([]protocol.Message, string, error) {
	return slices.Clone(b.msgs), "leaf", nil
}

func (b *committingBackend) Commit(_ context.Context, _ string, _, _ uint64, _ string, msgs []protocol.Message) (string, error) {
	b.msgs = append(b.msgs, msgs...)
	return "leaf", nil
}

// TestYieldThenContinue: a run whose second model call is refused with run-yield ends with
// ErrYielded and lifecycle_yield after committing its tool result, and nothing of the refused call.
// A run that continues it commits no user message, opens with lifecycle_resume, and its first
// model call sees the transcript as the first run left it.
func TestYieldThenContinue(t *testing.T) {
	b := &committingBackend{}
	m := &yieldingModel{yieldAt: 2}
	err := New(Config{Model: m, Backend: b}).Run(context.Background(), Turn{SessionID: "ses_1", RunEpoch: 1, RunID: "run_1", ModelRef: "m", Text: "hi"})
	if !errors.Is(err, ErrYielded) {
		t.Fatalf("run: %v, want ErrYielded", err)
	}
	roles := func() []string {
		var out []string
		for _, msg := range b.msgs {
			out = append(out, msg.Role)
		}
		return out
	}
	if got := roles(); !slices.Equal(got, []string{protocol.RoleUser, protocol.RoleAssistant, protocol.RoleToolResult}) {
		t.Fatalf("committed %v before the yield, want user, assistant, toolResult", got)
	}
	types := func() []protocol.LiveEventType {
		var out []protocol.LiveEventType
		for _, ev := range b.events {
			if ev.Type.Lifecycle() {
				out = append(out, ev.Type)
			}
		}
		return out
	}
	if got := types(); !slices.Equal(got, []protocol.LiveEventType{protocol.LiveLifecycleStart, protocol.LiveLifecycleYield}) {
		t.Fatalf("lifecycle %v, want start, yield", got)
	}

	b.events = nil
	m2 := &yieldingModel{}
	if err := New(Config{Model: m2, Backend: b}).Run(context.Background(), Turn{SessionID: "ses_1", RunEpoch: 2, RunID: "run_1", ModelRef: "m", Continue: true}); err != nil {
		t.Fatalf("continue: %v", err)
	}
	if got := roles(); !slices.Equal(got, []string{protocol.RoleUser, protocol.RoleAssistant, protocol.RoleToolResult, protocol.RoleAssistant}) {
		t.Fatalf("after the continuation %v, want one user message and the answer added", got)
	}
	if len(m2.contexts) != 1 || len(m2.contexts[0].Messages) != 3 {
		t.Fatalf("the continuation's first call saw %d messages, want the 3 of the transcript", len(m2.contexts[0].Messages))
	}
	if got := types(); !slices.Equal(got, []protocol.LiveEventType{protocol.LiveLifecycleResume, protocol.LiveLifecycleEnd}) {
		t.Fatalf("continuation lifecycle %v, want resume, end", got)
	}
}

package runner

import (
	"context"
	"encoding/json"
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

package hub_test

import (
	"context"
	"encoding/json"
	"sync"
	"testing"

	"github.com/openclaw/cloudworkers/gateway/hub"
	"github.com/openclaw/cloudworkers/gateway/sessions"
	"github.com/openclaw/cloudworkers/protocol"
	"github.com/openclaw/cloudworkers/worker/tools"
)

// TestHostileSessionsSpawn: worker.sessions.spawn acts only for the session the worker's
// admission binds, inside a started turn; the spawner sees that session and the frame's tool call
// id, and its refusal (spawn-depth-exceeded) reaches the worker with its code.
func TestHostileSessionsSpawn(t *testing.T) {
	var mu sync.Mutex
	var calls []tools.Call
	x := newHostile(t, func(c *hub.Config) {
		c.Spawn = func(_ context.Context, call tools.Call, _ json.RawMessage) (protocol.ToolCallResult, *protocol.Error) {
			mu.Lock()
			calls = append(calls, call)
			mu.Unlock()
			return protocol.ToolCallResult{}, protocol.Errorf(protocol.CodeSpawnDepthExceeded, "too deep")
		}
	})
	ctx := testContext(t)
	other, err := x.st.Create(ctx, sessions.CreateParams{})
	if err != nil {
		t.Fatal(err)
	}
	c := x.sessionConn()
	frames := reader(t, c)
	ask := func(id string, p protocol.SessionsSpawnParams) protocol.Frame {
		t.Helper()
		f, _ := protocol.Request(id, protocol.MethodSessionsSpawn, p)
		sendFrame(t, c, f)
		for {
			a := recvChan(t, id, frames)
			if a.ID == id {
				return a
			}
		}
	}
	args := json.RawMessage(`{"task":"go"}`)
	if a := ask("before", protocol.SessionsSpawnParams{SessionID: x.session, OwnerEpoch: x.epoch, RunID: "run-1", ToolCallID: "c1", Arguments: args}); a.OK || a.Error.Code != protocol.CodeUnknownRun {
		t.Fatalf("a spawn before any turn: %+v, want unknown-run", a.Error)
	}
	x.startTurn("run-1")
	if a := ask("other", protocol.SessionsSpawnParams{SessionID: other.ID, OwnerEpoch: 1, RunID: "run-1", ToolCallID: "c2", Arguments: args}); a.OK {
		t.Fatal("a spawn for a session the worker is not bound to was accepted")
	}
	if a := ask("stale", protocol.SessionsSpawnParams{SessionID: x.session, OwnerEpoch: x.epoch - 1, RunID: "run-1", ToolCallID: "c3", Arguments: args}); a.OK || a.Error.Code != protocol.CodeEpochMismatch {
		t.Fatalf("a spawn from an old owner epoch: %+v, want epoch-mismatch", a.Error)
	}
	mu.Lock()
	n := len(calls)
	mu.Unlock()
	if n != 0 {
		t.Fatalf("the spawner was called %d times for refused frames", n)
	}
	a := ask("own", protocol.SessionsSpawnParams{SessionID: x.session, OwnerEpoch: x.epoch, RunID: "run-1", ToolCallID: "c4", Arguments: args})
	if a.OK || a.Error.Code != protocol.CodeSpawnDepthExceeded {
		t.Fatalf("the spawner's refusal arrived as %+v, want spawn-depth-exceeded", a.Error)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(calls) != 1 || calls[0] != (tools.Call{SessionID: x.session, RunID: "run-1", ToolCallID: "c4"}) {
		t.Fatalf("spawner calls %+v, want one for the bound session and tool call c4", calls)
	}
}

package agents

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/openclaw/cloudworkers/internal/clock"
	"github.com/openclaw/cloudworkers/protocol"
	"github.com/openclaw/cloudworkers/worker/tools"
)

// Tool names (upstream's).
const (
	SpawnToolName    = protocol.SessionsSpawnTool
	SendToolName     = "sessions_send"
	StatusToolName   = "sessions_status"
	PullbackToolName = "sessions_pullback"
)

// MaxToolCallIDBytes bounds the recorded id of a spawning tool call.
const MaxToolCallIDBytes = 256

// Tools returns the gateway-resident sessions_* tools backed by s, for turns on the gateway and
// (through worker.tool.call and worker.sessions.spawn) on workers.
func (s *Spawner) Tools() []tools.Tool {
	return []tools.Tool{&tool{s: s, name: SpawnToolName}, &tool{s: s, name: SendToolName},
		&tool{s: s, name: StatusToolName}, &tool{s: s, name: PullbackToolName}}
}

type tool struct {
	s    *Spawner
	name string
}

var _ tools.Tool = (*tool)(nil)

func (t *tool) Name() string { return t.name }

// collectTimeout is what a waiting call allows on top of the child's run timeout: placing it
// before, pulling it back after.
const collectTimeout = 20 * time.Minute

// Timeout bounds one call of the tool from a worker (worker.tool.call): a sessions_send that waits
// lasts as long as the child's turn.
func (t *tool) Timeout() time.Duration {
	if t.name == StatusToolName {
		return time.Minute
	}
	return t.s.cfg.RunTimeout.D() + collectTimeout
}

const spawnSchema = `{"type":"object","properties":{
"task":{"type":"string","description":"What the child agent should do: its first message."},
"label":{"type":"string","description":"A short title for the child session."},
"profile":{"type":"string","description":"Worker profile to run on (default: the gateway's agents.defaultProfile)."},
"machineClass":{"type":"string","description":"Machine class of the profile's provider."},
"model":{"type":"string","description":"Model reference provider/model for the child (default: yours)."},
"workspace":{"type":"string","enum":["fork","empty"],"description":"fork (default): a copy of your workspace as it is now, uncommitted changes included; empty: an empty directory."},
"runTimeoutSeconds":{"type":"integer","minimum":0,"description":"Cancel the child's turn after this many seconds (default: the gateway's agents.runTimeout)."},
"cleanup":{"type":"string","enum":["keep","delete"],"description":"delete: destroy the child's machine once its results are pulled back."},
"wait":{"type":"boolean","description":"true (default): return the child's answer, branch, commits, files and cost when it is done; false: return its session id at once."},
"budgetUsd":{"type":"number","minimum":0,"description":"The child's own spend limit in US dollars (its model calls and machines, and its children's); your budgets count its spend too."}},
"required":["task"]}`

func (t *tool) Schema() protocol.Tool {
	switch t.name {
	case SpawnToolName:
		return protocol.Tool{Name: t.name, Parameters: json.RawMessage(spawnSchema),
			Description: "Spawn a child agent session on a cloud worker to do a task in parallel with you. It works on a copy of your workspace; its commits come back on a branch."}
	case SendToolName:
		return protocol.Tool{Name: t.name, Description: "Send a follow-up message to a child session you spawned.",
			Parameters: json.RawMessage(`{"type":"object","properties":{"sessionId":{"type":"string","description":"The child's session id."},"message":{"type":"string"},"wait":{"type":"boolean","description":"true (default): return when the child's turn is done."}},"required":["sessionId","message"]}`)}
	case StatusToolName:
		return protocol.Tool{Name: t.name, Description: "Report a child session you spawned: status, answer, branch, commits, usage and cost.",
			Parameters: json.RawMessage(`{"type":"object","properties":{"sessionId":{"type":"string","description":"The child's session id."}},"required":["sessionId"]}`)}
	default:
		return protocol.Tool{Name: t.name, Description: "Bring a child session's results (commits, files) back from its worker, and return them.",
			Parameters: json.RawMessage(`{"type":"object","properties":{"sessionId":{"type":"string","description":"The child's session id."},"busy":{"type":"string","enum":["drain","cancel"],"description":"If the child's turn runs: drain waits for it to end, cancel stops it. Without it, a running child is refused."}},"required":["sessionId"]}`)}
	}
}

type followArgs struct {
	SessionID string `json:"sessionId"`
	Message   string `json:"message"`
	Wait      *bool  `json:"wait"`
	Busy      string `json:"busy"`
}

// Run implements tools.Tool. Refusals are error results naming their code; only a canceled ctx is
// returned as an error.
func (t *tool) Run(ctx context.Context, raw json.RawMessage) (tools.Result, error) {
	call, ok := tools.CallFrom(ctx)
	if !ok || call.SessionID == "" {
		return errorResult(t.name+": no calling session (this tool runs only inside a session's turn)", nil, nil), nil
	}
	var res SpawnResult
	var err error
	switch t.name {
	case SpawnToolName:
		var req SpawnRequest
		if req, err = DecodeSpawn(raw); err == nil {
			req.ToolCallID = call.ToolCallID
			res, err = t.s.Spawn(ctx, call.SessionID, req)
		}
	default:
		var a followArgs
		if err = decodeArgs(raw, &a); err == nil {
			switch t.name {
			case SendToolName:
				res, err = t.s.Send(ctx, call.SessionID, a.SessionID, a.Message, a.Wait == nil || *a.Wait)
			case StatusToolName:
				res, err = t.s.Status(ctx, call.SessionID, a.SessionID)
			default:
				res, err = t.s.Pullback(ctx, call.SessionID, a.SessionID, a.Busy)
			}
		}
	}
	if err != nil {
		if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
			return tools.Result{}, ctx.Err()
		}
		return errorResult(t.name+": "+Message(err), err, &res), nil
	}
	return okResult(res), nil
}

// DecodeSpawn decodes sessions_spawn arguments (a bad type names its field).
func DecodeSpawn(raw json.RawMessage) (SpawnRequest, error) {
	var req SpawnRequest
	err := decodeArgs(raw, &req)
	return req, err
}

func decodeArgs(raw json.RawMessage, v any) error {
	if len(strings.TrimSpace(string(raw))) == 0 || string(raw) == "null" {
		raw = json.RawMessage("{}")
	}
	if err := json.Unmarshal(raw, v); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return fieldf(te.Field, "expected %s, got %s", te.Type, te.Value)
		}
		return fieldf("arguments", "invalid JSON: %v", err)
	}
	return nil
}

// Code is the protocol code of a refusal: spawn-depth-exceeded, capacity-exceeded (with
// retryAfterMs), or "" for others.
func Code(err error) (protocol.Code, int64) {
	var de *DepthError
	var re *RetryError
	switch {
	case errors.As(err, &de):
		return protocol.CodeSpawnDepthExceeded, 0
	case errors.As(err, &re):
		return protocol.CodeCapacityExceeded, re.RetryAfter.Milliseconds()
	}
	return "", 0
}

// Message renders a refusal for an agent: its code first when it has one.
func Message(err error) string {
	if c, ms := Code(err); c != "" {
		if ms > 0 {
			return fmt.Sprintf("%s (retryAfterMs %d): %v", c, ms, err)
		}
		return fmt.Sprintf("%s: %v", c, err)
	}
	return err.Error()
}

type errorDetails struct {
	Code         protocol.Code `json:"code,omitempty"`
	RetryAfterMs int64         `json:"retryAfterMs,omitempty"`
	Error        string        `json:"error"`
	Child        *SpawnResult  `json:"child,omitempty"`
}

func errorResult(msg string, err error, child *SpawnResult) tools.Result {
	r := tools.Result{IsError: true, Content: []protocol.Content{{Type: protocol.ContentText, Text: msg}}}
	d := errorDetails{Error: msg}
	d.Code, d.RetryAfterMs = Code(err)
	if child != nil && child.SessionID != "" {
		d.Child = child
	}
	if b, err := json.Marshal(d); err == nil {
		r.Details = b
	}
	return r
}

func okResult(res SpawnResult) tools.Result {
	b, _ := json.MarshalIndent(res, "", "  ")
	return tools.Result{Content: []protocol.Content{{Type: protocol.ContentText, Text: string(b)}}, Details: b}
}

// WorkerSpawn serves worker.sessions.spawn (hub.SpawnFunc): a worker session's spawn. A depth or
// capacity refusal is a protocol error with its code (and retryAfterMs); other failures are error
// results the model reads.
func (s *Spawner) WorkerSpawn(ctx context.Context, call tools.Call, args json.RawMessage) (protocol.ToolCallResult, *protocol.Error) {
	req, err := DecodeSpawn(args)
	if err == nil {
		req.ToolCallID = call.ToolCallID
		// A worker cannot cancel this call; the parent's turn ending (cancelled, failed, its
		// worker gone) is what cancels the child it waits on.
		ctx, stop := s.whileTurnRuns(ctx, call.RunID)
		defer stop()
		var res SpawnResult
		res, err = s.Spawn(ctx, call.SessionID, req)
		if err == nil {
			r := okResult(res)
			return protocol.ToolCallResult{Content: r.Content, Details: r.Details}, nil
		}
	}
	if c, ms := Code(err); c != "" {
		return protocol.ToolCallResult{}, &protocol.Error{Code: c, Message: err.Error(), Retryable: ms > 0, RetryAfterMs: ms}
	}
	r := errorResult(SpawnToolName+": "+err.Error(), err, nil)
	return protocol.ToolCallResult{Content: r.Content, Details: r.Details, IsError: true}, nil
}

// whileTurnRuns returns ctx, cancelled as well once the run has ended.
func (s *Spawner) whileTurnRuns(ctx context.Context, runID string) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	d, err := s.deps()
	if err != nil || runID == "" {
		return ctx, cancel
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := clock.Or(d.Clock).NewTicker(pollInterval)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C():
			}
			if t, err := d.Turns.Get(ctx, runID); err == nil && !t.Status.Ongoing() {
				cancel()
				return
			}
		}
	}()
	return ctx, func() { cancel(); <-done }
}

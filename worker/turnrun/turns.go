// Package turnrun runs the turns a gateway assigns to this worker: the agent loop with its transcript,
// live events and model calls going through the worker protocol, and its tools on this box.
package turnrun

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/openclaw/cloudworkers/protocol"
	"github.com/openclaw/cloudworkers/worker/remote"
	"github.com/openclaw/cloudworkers/worker/runner"
	"github.com/openclaw/cloudworkers/worker/tools"
)

// Config configures an Executor.
type Config struct {
	// Remote is the worker's connection config; each turn opens a client for its session with it.
	Remote remote.Config
	// StateDir holds default workspaces (StateDir/workspaces/SESSION) for turns that name none.
	StateDir string
	MaxSteps int
	Log      *slog.Logger
}

// Executor runs one turn at a time.
type Executor struct {
	cfg    Config
	log    *slog.Logger
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	running *active
	owner   string // tools.OwnerOf the state dir
}

type active struct {
	p      protocol.TurnStartParams
	cancel context.CancelFunc
}

// New returns an Executor; Close stops it.
func New(cfg Config) *Executor {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	e := &Executor{cfg: cfg, log: cfg.Log.With("subsystem", "turns"), ctx: ctx, cancel: cancel, owner: tools.OwnerOf(cfg.StateDir)}
	// A worker of this state dir that died in the middle of a turn stopped nothing: what its
	// commands left running is stopped before this one takes a turn.
	sctx, scancel := context.WithTimeout(ctx, 30*time.Second)
	defer scancel()
	if st, err := tools.StopLeftovers(sctx, e.owner); err != nil {
		e.log.Warn("stop what an earlier worker's turns left running", "err", err, "stopped", st.Processes)
	} else if st.Processes > 0 {
		e.log.Info("stopped what an earlier worker's turns left running", "processes", st.Processes)
	}
	return e
}

// Close cancels the running turn and waits for it.
func (e *Executor) Close() {
	e.cancel()
	e.wg.Wait()
}

// Handle answers the gateway's turn requests (remote.Config.Handler). It does not block: a turn
// runs in the background and reports its end through its lifecycle events.
func (e *Executor) Handle(_ context.Context, method string, params json.RawMessage) (any, *protocol.Error) {
	switch method {
	case protocol.MethodTurnStart:
		var p protocol.TurnStartParams
		if err := protocol.DecodeParams(params, &p); err != nil {
			return nil, protocol.Errorf(protocol.CodeInvalidFrame, "params: %v", err)
		}
		if err := e.start(p); err != nil {
			return nil, err
		}
		return protocol.TurnStartResult{Accepted: true}, nil
	case protocol.MethodTurnCancel:
		var p protocol.TurnCancelParams
		if err := protocol.DecodeParams(params, &p); err != nil {
			return nil, protocol.Errorf(protocol.CodeInvalidFrame, "params: %v", err)
		}
		e.mu.Lock()
		ok := e.running != nil && e.running.p.SessionID == p.SessionID && e.running.p.RunID == p.RunID
		if ok {
			e.running.cancel()
		}
		e.mu.Unlock()
		return map[string]bool{"canceled": ok}, nil
	case protocol.MethodTurnStatus:
		var p protocol.TurnCancelParams
		if err := protocol.DecodeParams(params, &p); err != nil {
			return nil, protocol.Errorf(protocol.CodeInvalidFrame, "params: %v", err)
		}
		e.mu.Lock()
		running := e.running != nil && e.running.p.SessionID == p.SessionID && e.running.p.RunID == p.RunID
		e.mu.Unlock()
		return protocol.TurnStatusResult{Running: running}, nil
	}
	return nil, protocol.Errorf(protocol.CodeMethodNotAllowed, "worker does not serve %.128q", method)
}

func (e *Executor) start(p protocol.TurnStartParams) *protocol.Error {
	switch {
	case p.SessionID == "" || p.RunID == "" || p.OwnerEpoch == 0 || p.RunEpoch == 0 || p.ModelRef == "":
		return protocol.Errorf(protocol.CodeInvalidFrame, "sessionId, ownerEpoch, runEpoch, runId and modelRef are required")
	case p.Continue != (p.Text == ""):
		return protocol.Errorf(protocol.CodeInvalidFrame, "a turn has text, unless it continues (continue: true) with none")
	case p.Workspace != "" && !filepath.IsAbs(p.Workspace):
		return protocol.Errorf(protocol.CodeInvalidFrame, "workspace %.200q is not an absolute path", p.Workspace)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.ctx.Err() != nil {
		return protocol.Errorf(protocol.CodeBusy, "worker is stopping")
	}
	if e.running != nil {
		if e.running.p.RunID == p.RunID {
			return nil // a resent start of the turn already running
		}
		return &protocol.Error{Code: protocol.CodeBusy, Message: "worker is running turn " + e.running.p.RunID, Retryable: true, RetryAfterMs: 1000}
	}
	ctx, cancel := context.WithCancel(e.ctx)
	e.running = &active{p: p, cancel: cancel}
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		defer func() {
			e.mu.Lock()
			e.running = nil
			e.mu.Unlock()
			cancel()
		}()
		if err := e.run(ctx, p); err != nil {
			e.log.Warn("turn ended with an error", "session", p.SessionID, "run", p.RunID, "err", err)
		} else {
			e.log.Info("turn finished", "session", p.SessionID, "run", p.RunID)
		}
	}()
	return nil
}

// run runs one turn on a client of the turn's session and waits until its live events are acknowledged.
func (e *Executor) run(ctx context.Context, p protocol.TurnStartParams) error {
	cfg := e.cfg.Remote
	cfg.SessionID, cfg.OwnerEpoch = p.SessionID, p.OwnerEpoch
	cfg.Handler = nil
	c, err := remote.NewClient(remote.ClientConfig{Config: cfg, RunEpoch: p.RunEpoch, RunID: p.RunID})
	if err != nil {
		return err
	}
	defer c.Close()
	ws := p.Workspace
	if ws == "" {
		ws = filepath.Join(e.cfg.StateDir, "workspaces", p.SessionID)
	}
	b := &Backend{Client: c}
	var runErr error
	if err := os.MkdirAll(ws, 0o755); err != nil {
		// Still run, so the failure reaches the gateway as the turn's lifecycle error.
		runErr = fmt.Errorf("create workspace: %w", err)
	}
	var extra []tools.Tool
	for _, schema := range p.GatewayTools {
		extra = append(extra, &gatewayTool{client: c, schema: schema, p: p})
	}
	set := tools.NewSet(tools.Config{Workspace: ws, Extra: extra, Owner: e.owner})
	defer set.Close(context.WithoutCancel(ctx))
	r := runner.New(runner.Config{Model: &Model{Client: c}, Backend: b, Tools: set, MaxSteps: e.cfg.MaxSteps})
	if runErr != nil {
		r = runner.New(runner.Config{Model: failModel{runErr}, Backend: b, MaxSteps: 1})
	}
	err = r.Run(ctx, runner.Turn{SessionID: p.SessionID, RunEpoch: p.RunEpoch, RunID: p.RunID, ModelRef: p.ModelRef, Text: p.Text, Continue: p.Continue})
	// The lifecycle event is the turn's outcome at the gateway: deliver it before closing.
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if werr := c.WaitLiveAcked(wctx, b.lastLive()); werr != nil {
		return errors.Join(err, fmt.Errorf("deliver live events: %w", werr))
	}
	return err
}

type failModel struct{ err error }

func (m failModel) Stream(context.Context, string, protocol.Context, func(protocol.StreamEvent) error) (protocol.Message, error) {
	return protocol.Message{}, m.err
}

// Backend is the runner backend of a worker: the session's transcript and live events through the
// worker protocol (remote.Client: outbox, resume, at-least-once delivery).
type Backend struct {
	Client *remote.Client

	mu   sync.Mutex
	live uint64 // seq of the newest live event queued
}

var _ runner.Backend = (*Backend)(nil)

// Context reads the session's context from the gateway.
func (b *Backend) Context(ctx context.Context, _ string) ([]protocol.Message, string, error) {
	return b.Client.TranscriptContext(ctx)
}

// Commit appends messages after the client's previous commit; the client numbers and chains them.
func (b *Backend) Commit(ctx context.Context, _ string, _, _ uint64, _ string, msgs []protocol.Message) (string, error) {
	res, err := b.Client.Commit(ctx, msgs)
	return res.NewLeafID, err
}

// Live queues a live event; it is acknowledged asynchronously.
func (b *Backend) Live(ctx context.Context, _ string, _ uint64, _ string, _ uint64, ev protocol.LiveEvent) error {
	seq, err := b.Client.Live(ctx, ev)
	if err != nil {
		return err
	}
	b.mu.Lock()
	b.live = max(b.live, seq)
	b.mu.Unlock()
	return nil
}

func (b *Backend) lastLive() uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.live
}

// Model is the runner model of a worker: every call goes through the gateway's inference proxy.
type Model struct {
	Client *remote.Client

	mu    sync.Mutex
	calls int
}

var _ runner.Model = (*Model)(nil)

// Stream makes one call; calls of a run are numbered, which names them for replay.
func (m *Model) Stream(ctx context.Context, ref string, c protocol.Context, emit func(protocol.StreamEvent) error) (protocol.Message, error) {
	m.mu.Lock()
	m.calls++
	turnID := "call-" + strconv.Itoa(m.calls)
	m.mu.Unlock()
	return m.Client.Infer(ctx, turnID, ref, c, protocol.InferenceOptions{}, emit)
}

// gatewayTool is a gateway-resident tool (web_search): offered to the model like the others, but run
// on the gateway through worker.tool.call, so its credentials never reach the box.
type gatewayTool struct {
	client *remote.Client
	schema protocol.Tool
	p      protocol.TurnStartParams
	calls  int
}

func (g *gatewayTool) Name() string          { return g.schema.Name }
func (g *gatewayTool) Schema() protocol.Tool { return g.schema }

func (g *gatewayTool) Run(ctx context.Context, args json.RawMessage) (tools.Result, error) {
	g.calls++
	callID := g.p.RunID + "-" + strconv.Itoa(g.calls)
	if c, ok := tools.CallFrom(ctx); ok && c.ToolCallID != "" {
		callID = c.ToolCallID
	}
	var raw json.RawMessage
	var err error
	if g.schema.Name == protocol.SessionsSpawnTool {
		// A spawn is its own closed method, which the gateway bounds by agents.maxSpawnDepth.
		raw, err = g.client.Call(ctx, protocol.MethodSessionsSpawn, protocol.SessionsSpawnParams{SessionID: g.p.SessionID,
			OwnerEpoch: g.p.OwnerEpoch, RunID: g.p.RunID, ToolCallID: callID, Arguments: args})
	} else {
		raw, err = g.client.Call(ctx, protocol.MethodToolCall, protocol.ToolCallParams{SessionID: g.p.SessionID, OwnerEpoch: g.p.OwnerEpoch,
			RunID: g.p.RunID, ToolCallID: callID, Name: g.schema.Name, Arguments: args})
	}
	if err != nil {
		return tools.Result{IsError: true, Content: []protocol.Content{{Type: protocol.ContentText, Text: g.schema.Name + " (on the gateway): " + err.Error()}}}, nil
	}
	var res protocol.ToolCallResult
	if err := json.Unmarshal(raw, &res); err != nil {
		return tools.Result{}, fmt.Errorf("decode %s result: %w", g.schema.Name, err)
	}
	return tools.Result{Content: res.Content, Details: res.Details, IsError: res.IsError}, nil
}

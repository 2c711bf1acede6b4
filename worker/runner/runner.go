// Package runner is the agent loop, identical on the gateway (local placement) and in `openclaw worker`.
package runner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/openclaw/cloudworkers/protocol"
	"github.com/openclaw/cloudworkers/worker/tools"
)

// Model streams one model call. On the gateway it is the catalog; on a worker it is the inference
// proxy through the gateway.
type Model interface {
	Stream(ctx context.Context, modelRef string, c protocol.Context, emit func(protocol.StreamEvent) error) (protocol.Message, error)
}

// Backend is where a run reads its context and writes its transcript and live events. On the
// gateway it is the session store; on a worker it is the worker protocol.
type Backend interface {
	// Context returns the session's messages (leaf → root walk, root first) and its leaf id.
	Context(ctx context.Context, sessionID string) ([]protocol.Message, string, error)
	// Commit appends messages under baseLeaf and returns the new leaf. seq numbers the commits of a run from 1.
	Commit(ctx context.Context, sessionID string, runEpoch, seq uint64, baseLeaf string, msgs []protocol.Message) (string, error)
	// Live publishes one live event. seq numbers the events of a run from 1.
	Live(ctx context.Context, sessionID string, runEpoch uint64, runID string, seq uint64, ev protocol.LiveEvent) error
}

// Config configures a Runner.
type Config struct {
	Model   Model
	Backend Backend
	Tools   *tools.Set
	// MaxSteps bounds model calls per run (default 32).
	MaxSteps     int
	SystemPrompt string
	Now          func() time.Time
}

// Runner runs turns of one session.
type Runner struct{ cfg Config }

// New returns a Runner.
func New(cfg Config) *Runner {
	if cfg.MaxSteps == 0 {
		cfg.MaxSteps = 32
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.SystemPrompt == "" {
		cfg.SystemPrompt = DefaultSystemPrompt
	}
	return &Runner{cfg: cfg}
}

// DefaultSystemPrompt is the agent's instructions when none are configured.
const DefaultSystemPrompt = "You are a coding agent working in the user's workspace. Use the tools to read, edit and run code; keep answers short."

// Turn is one user message to run.
type Turn struct {
	SessionID string
	RunEpoch  uint64
	RunID     string
	ModelRef  string
	Text      string
	// Continue goes on with a turn an earlier owner stopped at a model-call boundary (a live
	// move): no user message is committed and the run opens with lifecycle_resume instead of
	// lifecycle_start; the first step is a model call on the transcript as it is.
	Continue bool
}

// ErrYielded ends a run whose model call was answered with protocol.CodeRunYield: a live move
// stopped it at that model-call boundary, after its tool results were committed. Its end is
// published as lifecycle_yield; its turn goes on from the transcript on the session's next owner.
var ErrYielded = errors.New("the run stopped at a model-call boundary for a live move")

// IsYield reports whether a model call's error is the gateway's request to stop the run there.
func IsYield(err error) bool {
	var perr *protocol.Error
	return errors.Is(err, ErrYielded) || (errors.As(err, &perr) && perr.Code == protocol.CodeRunYield)
}

// ErrStepLimit ends a run that called the model MaxSteps times without finishing.
var ErrStepLimit = errors.New("step limit reached")

type run struct {
	r                *Runner
	t                Turn
	leaf             string
	commitSeq, evSeq uint64
	messages         []protocol.Message
	toolSchemas      []protocol.Tool
}

// Run runs one turn to its end: the user message, model calls, tool calls, commits and live
// events, until the model stops. Every failure is also published as a lifecycle_error event.
func (r *Runner) Run(ctx context.Context, t Turn) (err error) {
	u := &run{r: r, t: t}
	if r.cfg.Tools != nil {
		u.toolSchemas = r.cfg.Tools.Schemas()
	}
	// The run's own context may be cancelled (a cancel can arrive as the turn starts); the start
	// and the end are still published, so subscribers always learn how the run ended.
	lifecycle := func(ev protocol.LiveEvent) error {
		lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		return u.live(lctx, ev)
	}
	opening := protocol.LiveLifecycleStart
	if t.Continue {
		opening = protocol.LiveLifecycleResume
	}
	if err := lifecycle(protocol.LiveEvent{Type: opening}); err != nil {
		return err
	}
	defer func() {
		ev := protocol.LiveEvent{Type: protocol.LiveLifecycleEnd}
		switch {
		case errors.Is(err, ErrYielded):
			ev = protocol.LiveEvent{Type: protocol.LiveLifecycleYield}
		case err != nil:
			ev = protocol.LiveEvent{Type: protocol.LiveLifecycleError, Error: err.Error()}
		}
		// Nothing the run started outlives it, detached processes included (the set's
		// containment finds them); the end says how many were stopped.
		if r.cfg.Tools != nil {
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
			st, serr := r.cfg.Tools.Stop(sctx)
			cancel()
			ev.StoppedProcesses = st.Processes
			if serr != nil && err == nil {
				ev = protocol.LiveEvent{Type: protocol.LiveLifecycleError, StoppedProcesses: st.Processes,
					Error: "stop the processes the run started: " + serr.Error()}
			}
		}
		if lerr := lifecycle(ev); lerr != nil && err == nil {
			err = lerr
		}
	}()
	msgs, leaf, err := r.cfg.Backend.Context(ctx, t.SessionID)
	if err != nil {
		return fmt.Errorf("load context: %w", err)
	}
	u.messages, u.leaf = msgs, leaf
	if !t.Continue {
		user := protocol.Message{Role: protocol.RoleUser, Content: []protocol.Content{{Type: protocol.ContentText, Text: t.Text}}, Timestamp: r.now()}
		if err := u.commit(ctx, user); err != nil {
			return err
		}
	}
	for step := 0; step < r.cfg.MaxSteps; step++ {
		msg, err := u.call(ctx)
		if IsYield(err) && msg.Role != protocol.RoleAssistant {
			return ErrYielded // nothing of the call was made: the next owner makes it
		}
		if msg.Role == protocol.RoleAssistant {
			if cerr := u.commit(ctx, msg); cerr != nil {
				return cerr
			}
		}
		if err != nil {
			return err
		}
		if msg.StopReason != protocol.StopToolUse {
			return nil
		}
		var results []protocol.Message
		for _, c := range msg.Content {
			if c.Type != protocol.ContentToolCall {
				continue
			}
			res, err := u.tool(ctx, c)
			if err != nil {
				return err
			}
			results = append(results, res)
		}
		if len(results) == 0 {
			return errors.New("model stopped for tool use without a tool call")
		}
		if err := u.commit(ctx, results...); err != nil {
			return err
		}
	}
	return ErrStepLimit
}

func (r *Runner) now() int64 { return r.cfg.Now().UnixMilli() }

func (u *run) live(ctx context.Context, ev protocol.LiveEvent) error {
	u.evSeq++
	if err := u.r.cfg.Backend.Live(ctx, u.t.SessionID, u.t.RunEpoch, u.t.RunID, u.evSeq, ev.Fit()); err != nil {
		return fmt.Errorf("live event: %w", err)
	}
	return nil
}

func (u *run) commit(ctx context.Context, msgs ...protocol.Message) error {
	u.commitSeq++
	leaf, err := u.r.cfg.Backend.Commit(ctx, u.t.SessionID, u.t.RunEpoch, u.commitSeq, u.leaf, msgs)
	if err != nil {
		return fmt.Errorf("commit transcript: %w", err)
	}
	u.leaf = leaf
	u.messages = append(u.messages, msgs...)
	return nil
}

// call makes one model call, streaming its deltas as live events.
func (u *run) call(ctx context.Context) (protocol.Message, error) {
	c := protocol.Context{SystemPrompt: u.r.cfg.SystemPrompt, Messages: u.messages, Tools: u.toolSchemas}
	msg, err := u.r.cfg.Model.Stream(ctx, u.t.ModelRef, c, func(ev protocol.StreamEvent) error {
		switch ev.Type {
		case protocol.EventTextDelta:
			return u.live(ctx, protocol.LiveEvent{Type: protocol.LiveTextDelta, Delta: ev.Delta})
		case protocol.EventThinkingDelta:
			return u.live(ctx, protocol.LiveEvent{Type: protocol.LiveThinkingDelta, Delta: ev.Delta})
		}
		return nil
	})
	if err != nil {
		if msg.Role == protocol.RoleAssistant && msg.StopReason == "" {
			msg.StopReason = protocol.StopError
		}
		return msg, fmt.Errorf("model %s: %w", u.t.ModelRef, err)
	}
	if msg.StopReason == protocol.StopError || msg.StopReason == protocol.StopAborted {
		return msg, fmt.Errorf("model %s: %s", u.t.ModelRef, msg.ErrorMessage)
	}
	return msg, nil
}

// tool runs one tool call; tool failures go back to the model as error results.
func (u *run) tool(ctx context.Context, call protocol.Content) (protocol.Message, error) {
	args := call.Arguments
	if len(args) == 0 {
		args = json.RawMessage("{}")
	}
	if err := u.live(ctx, protocol.LiveEvent{Type: protocol.LiveToolStart, ToolCallID: call.ID, ToolName: call.Name, Args: args}); err != nil {
		return protocol.Message{}, err
	}
	var res tools.Result
	if u.r.cfg.Tools == nil {
		res = tools.Result{IsError: true, Content: []protocol.Content{{Type: protocol.ContentText, Text: "no tools are available"}}}
	} else {
		res = u.r.cfg.Tools.Run(tools.WithCall(ctx, tools.Call{SessionID: u.t.SessionID, RunID: u.t.RunID, ToolCallID: call.ID}), call.Name, args)
	}
	if ctx.Err() != nil {
		return protocol.Message{}, ctx.Err()
	}
	summary, _ := json.Marshal(res.Text())
	if err := u.live(ctx, protocol.LiveEvent{Type: protocol.LiveToolResult, ToolCallID: call.ID, ToolName: call.Name, Result: summary, IsError: res.IsError}); err != nil {
		return protocol.Message{}, err
	}
	return protocol.Message{Role: protocol.RoleToolResult, ToolCallID: call.ID, ToolName: call.Name,
		Content: res.Content, Details: res.Details, IsError: res.IsError, Timestamp: u.r.now()}, nil
}

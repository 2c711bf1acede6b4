package remote

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/openclaw/cloudworkers/internal/clock"
	"github.com/openclaw/cloudworkers/protocol"
)

// DefaultInferenceWindow is the credit window a Client grants the gateway per model call.
const DefaultInferenceWindow = protocol.DefaultInferenceWindow

// inferState routes the gateway's inference event frames to the calls waiting for them.
type inferState struct {
	mu    sync.Mutex
	calls map[string]*inferCall // turn id → call
}

// inferCall is one model call's inbox. Its size is bounded by the credit the call granted: the
// gateway may not send past it, and a frame that does fails the call.
type inferCall struct {
	sessionID string
	window    *protocol.ReceiveWindow
	size      uint64

	mu       sync.Mutex
	events   []protocol.InferenceEventPayload
	costs    []uint64
	terminal *protocol.InferenceTerminal
	err      error
	notify   chan struct{} // size 1: something arrived
}

func (ic *inferCall) signal() {
	select {
	case ic.notify <- struct{}{}:
	default:
	}
}

// inferenceEvent handles an event frame of the gateway on the read loop; it never blocks.
func (c *Client) inferenceEvent(f protocol.Frame) {
	var turnID, sessionID string
	var ev protocol.InferenceEventPayload
	var term protocol.InferenceTerminal
	switch f.Event {
	case protocol.MethodInferenceEvent:
		if err := protocol.DecodeParams(f.Payload, &ev); err != nil {
			c.w.log.Warn("bad inference event", "err", err)
			return
		}
		turnID, sessionID = ev.TurnID, ev.SessionID
	case protocol.MethodInferenceTerminal:
		if err := protocol.DecodeParams(f.Payload, &term); err != nil {
			c.w.log.Warn("bad inference terminal", "err", err)
			return
		}
		turnID, sessionID = term.TurnID, term.SessionID
	default:
		c.w.log.Debug("ignoring gateway event", "event", f.Event)
		return
	}
	c.infer.mu.Lock()
	ic := c.infer.calls[turnID]
	c.infer.mu.Unlock()
	if ic == nil || ic.sessionID != sessionID {
		return // a call that ended or was never made: a late frame
	}
	ic.mu.Lock()
	defer ic.mu.Unlock()
	defer ic.signal()
	if f.Event == protocol.MethodInferenceTerminal {
		ic.terminal = &term
		return
	}
	cost := protocol.InferenceCreditCost(len(f.Payload), ic.size)
	if err := ic.window.Receive(cost); err != nil {
		ic.err = err
		return
	}
	ic.events = append(ic.events, ev)
	ic.costs = append(ic.costs, cost)
}

// InferError is a model call that ended with an error terminal.
type InferError struct{ protocol.InferenceError }

func (e *InferError) Error() string { return e.Reason + ": " + e.ErrorMessage }

// Infer makes one model call through the gateway's inference proxy: worker.inference.start, then
// the call's events (emit sees each once, in order) under credit this client grants, until the
// terminal result. turnID names the call within the client's run; asking again with the same turnID
// after a lost connection gets the cached terminal result instead of a second provider call.
// Cancelling ctx cancels the call at the gateway, which closes the provider request.
func (c *Client) Infer(ctx context.Context, turnID, modelRef string, cx protocol.Context, opts protocol.InferenceOptions,
	emit func(protocol.StreamEvent) error) (protocol.Message, error) {
	ic := &inferCall{sessionID: c.cfg.SessionID, window: protocol.NewReceiveWindow(DefaultInferenceWindow),
		size: DefaultInferenceWindow, notify: make(chan struct{}, 1)}
	c.infer.mu.Lock()
	if c.infer.calls == nil {
		c.infer.calls = map[string]*inferCall{}
	}
	if c.infer.calls[turnID] != nil {
		c.infer.mu.Unlock()
		return protocol.Message{}, fmt.Errorf("inference call %s is already in progress", turnID)
	}
	c.infer.calls[turnID] = ic
	c.infer.mu.Unlock()
	defer func() {
		c.infer.mu.Lock()
		delete(c.infer.calls, turnID)
		c.infer.mu.Unlock()
	}()
	params := protocol.InferenceStartParams{SessionID: c.cfg.SessionID, OwnerEpoch: c.cfg.OwnerEpoch, RunEpoch: c.cfg.RunEpoch,
		RunID: c.cfg.RunID, TurnID: turnID, ModelRef: modelRef, Context: cx, Options: opts}
	var lastSeq uint64
	for {
		if err := c.wait(ctx, func() (bool, time.Time) { return c.conn != nil, time.Time{} }); err != nil {
			return protocol.Message{}, err
		}
		cc := c.conn
		c.mu.Unlock()
		// Every attempt starts a fresh window: a call accepted again streams from its beginning.
		ic.mu.Lock()
		ic.window, ic.events, ic.costs, ic.err = protocol.NewReceiveWindow(ic.size), nil, nil, nil
		window := ic.window
		ic.mu.Unlock()
		params.Credit = ic.size
		f, err := cc.call(ctx, protocol.MethodInferenceStart, params)
		if err != nil && ctx.Err() == nil {
			// The connection failed under the request: ask again on the next one (the gateway
			// replays the terminal of a call it already made).
			select {
			case <-cc.lost:
			case <-ctx.Done():
			}
			continue
		}
		if err != nil {
			return protocol.Message{}, err
		}
		if !f.OK {
			if f.Error.Code == protocol.CodeCapacityExceeded || f.Error.Code == protocol.CodeBusy {
				if err := clock.Sleep(ctx, c.cfg.Clock, retryAfter(f.Error)); err != nil {
					return protocol.Message{}, err
				}
				continue
			}
			return protocol.Message{}, f.Error
		}
		var res protocol.InferenceStartResult
		if err := protocol.DecodeParams(f.Payload, &res); err != nil {
			return protocol.Message{}, fmt.Errorf("inference start answer: %w", err)
		}
		if res.Status == protocol.InferenceReplayed {
			if res.Terminal == nil {
				return protocol.Message{}, errors.New("replayed inference call without a terminal result")
			}
			return terminalResult(*res.Terminal)
		}
		lastSeq = 0
		for {
			ic.mu.Lock()
			events, costs, term, ierr := ic.events, ic.costs, ic.terminal, ic.err
			ic.events, ic.costs = nil, nil
			ic.mu.Unlock()
			if ierr != nil {
				c.cancelCall(cc, turnID)
				return protocol.Message{}, ierr
			}
			for i, ev := range events {
				if ev.Seq > lastSeq {
					lastSeq = ev.Seq
					if err := emit(ev.Event); err != nil {
						c.cancelCall(cc, turnID)
						return protocol.Message{}, err
					}
				}
				if limit, ok := window.Release(costs[i]); ok {
					_ = cc.send(ctx, protocol.MethodInferenceCredit, protocol.InferenceCreditParams{
						SessionID: c.cfg.SessionID, TurnID: turnID, RunEpoch: c.cfg.RunEpoch, Limit: limit}, nil)
				}
			}
			if term != nil {
				return terminalResult(*term)
			}
			select {
			case <-ic.notify:
				continue
			case <-cc.lost:
			case <-ctx.Done():
				c.cancelCall(cc, turnID)
				return protocol.Message{}, ctx.Err()
			}
			break // connection lost: ask again
		}
	}
}

// cancelCall tells the gateway to abandon a call, best effort.
func (c *Client) cancelCall(cc *conn, turnID string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = cc.send(ctx, protocol.MethodInferenceCancel, protocol.InferenceCancelParams{
		SessionID: c.cfg.SessionID, TurnID: turnID, RunEpoch: c.cfg.RunEpoch}, nil)
}

func terminalResult(t protocol.InferenceTerminal) (protocol.Message, error) {
	switch {
	case t.Done != nil:
		return t.Done.Message, nil
	case t.Error != nil:
		var msg protocol.Message
		if t.Error.Partial != nil {
			msg = *t.Error.Partial
		}
		return msg, &InferError{InferenceError: *t.Error}
	}
	return protocol.Message{}, errors.New("inference terminal without a result")
}

// TranscriptContext returns the session's messages (root first) and leaf (worker.transcript.context).
func (c *Client) TranscriptContext(ctx context.Context) ([]protocol.Message, string, error) {
	p := protocol.TranscriptContextParams{SessionID: c.cfg.SessionID, OwnerEpoch: c.cfg.OwnerEpoch}
	raw, err := c.Call(ctx, protocol.MethodTranscriptContext, p)
	for errors.Is(err, errConnLost) {
		raw, err = c.Call(ctx, protocol.MethodTranscriptContext, p)
	}
	if err != nil {
		return nil, "", err
	}
	var r protocol.TranscriptContextResult
	if err := json.Unmarshal(raw, &r); err != nil {
		return nil, "", fmt.Errorf("transcript context: %w", err)
	}
	return r.Messages, r.LeafID, nil
}

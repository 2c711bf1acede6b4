package hub

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/openclaw/cloudworkers/gateway/inference"
	"github.com/openclaw/cloudworkers/gateway/store"
	"github.com/openclaw/cloudworkers/protocol"
)

// Models is the gateway's model catalog as the inference proxy uses it; *inference.Catalog is one.
// The worker names only a model reference: endpoint, credentials and headers come from here.
type Models interface {
	Resolve(ref string) (inference.Model, error)
	Stream(ctx context.Context, ref string, cx protocol.Context, opts inference.Options, emit inference.Emit) (protocol.Message, error)
}

// CallCredentials decides the provider credential of one proxied model call; the OCC credential
// gateway (*occ.CredentialGateway) is one.
type CallCredentials interface {
	// CallCredential returns the key of a call of envID's worker to model m: ok false means the
	// catalog's own credential applies. An error refuses the call; a *protocol.Error is what the
	// worker is told (it never carries the key), any other error is answered as internal.
	CallCredential(ctx context.Context, envID string, m inference.Model) (key string, ok bool, err error)
}

// ContextBackend serves worker.transcript.context; *sessions.Store implements it.
type ContextBackend interface {
	WorkerContext(ctx context.Context, p protocol.TranscriptContextParams) (protocol.TranscriptContextResult, error)
}

// Call outcomes recorded in inference_calls.
const (
	callRunning = "running"
	callDone    = "done"
	callError   = "error"
	callAborted = "aborted"
)

// proxyCall is one model call in flight on a connection.
type proxyCall struct {
	reqID  string // the id of the worker.inference.start request (a cancel frame names it)
	window *protocol.CreditWindow
	size   uint64 // the initial credit: no event costs more than this
	cancel context.CancelFunc
}

// callState is the per-connection bookkeeping of proxied calls, embedded in workerConn.
type callState struct {
	cmu   sync.Mutex
	calls map[string]*proxyCall // CallKey → call
}

// serveInferenceCredit grants a call in flight more credit (a call it does not know is ignored).
func (s *Server) serveInferenceCredit(_ context.Context, wc *workerConn, f protocol.Frame) protocol.Frame {
	var p protocol.InferenceCreditParams
	if err := protocol.DecodeParams(f.Params, &p); err != nil {
		return protocol.ErrorResponse(f.ID, protocol.Errorf(protocol.CodeInvalidFrame, "params: %v", err))
	}
	if c := wc.call(p.SessionID, p.RunEpoch, p.TurnID); c != nil {
		c.window.Grant(p.Limit)
	}
	res, _ := protocol.Response(f.ID, struct{}{})
	return res
}

// serveInferenceCancel cancels a call in flight and says whether there was one.
func (s *Server) serveInferenceCancel(_ context.Context, wc *workerConn, f protocol.Frame) protocol.Frame {
	var p protocol.InferenceCancelParams
	if err := protocol.DecodeParams(f.Params, &p); err != nil {
		return protocol.ErrorResponse(f.ID, protocol.Errorf(protocol.CodeInvalidFrame, "params: %v", err))
	}
	c := wc.call(p.SessionID, p.RunEpoch, p.TurnID)
	if c != nil {
		c.cancel()
	}
	res, _ := protocol.Response(f.ID, map[string]bool{"canceled": c != nil})
	return res
}

// call returns the call in flight of a turn, nil when there is none.
func (wc *workerConn) call(sessionID string, runEpoch uint64, turnID string) *proxyCall {
	key := protocol.InferenceStartParams{SessionID: sessionID, RunEpoch: runEpoch, TurnID: turnID}.CallKey()
	wc.cmu.Lock()
	defer wc.cmu.Unlock()
	return wc.calls[key]
}

// serveTranscriptContext reads a session's model context for the worker's next call, from a
// goroutine owned by the connection.
func (s *Server) serveTranscriptContext(ctx context.Context, wc *workerConn, f protocol.Frame) (protocol.Frame, bool) {
	fail := func(code protocol.Code, format string, args ...any) (protocol.Frame, bool) {
		return protocol.ErrorResponse(f.ID, protocol.Errorf(code, format, args...)), true
	}
	cb, ok := s.cfg.Sessions.(ContextBackend)
	if !ok {
		return fail(protocol.CodeMethodNotAllowed, "method %.128q is not served", f.Method)
	}
	var p protocol.TranscriptContextParams
	if err := protocol.DecodeParams(f.Params, &p); err != nil {
		return fail(protocol.CodeInvalidFrame, "params: %v", err)
	}
	if wc.sessionID != "" && p.SessionID != wc.sessionID {
		return fail(protocol.CodeSessionNotAttached, "this worker is admitted for session %s only", wc.sessionID)
	}
	return s.spawnCall(ctx, wc, &f, func() protocol.Frame {
		if e := s.checkBinding(ctx, wc, p.SessionID, p.OwnerEpoch); e != nil {
			return protocol.ErrorResponse(f.ID, e)
		}
		out, err := cb.WorkerContext(ctx, p)
		if err != nil {
			return s.errorFrame(wc, f, err)
		}
		r, err := protocol.Response(f.ID, out)
		if err != nil {
			return s.errorFrame(wc, f, err)
		}
		return r
	})
}

// serveInferenceStart checks a model call's shape and budget on the read loop, then runs it (see
// runCall) from a goroutine owned by the connection.
func (s *Server) serveInferenceStart(ctx context.Context, wc *workerConn, f protocol.Frame) (protocol.Frame, bool) {
	if s.cfg.Models == nil || s.cfg.Sessions == nil {
		return protocol.ErrorResponse(f.ID, protocol.Errorf(protocol.CodeMethodNotAllowed, "method %.128q is not served", f.Method)), true
	}
	refuse := func(code protocol.Code, format string, args ...any) (protocol.Frame, bool) {
		e := protocol.Errorf(code, format, args...)
		s.refused.add("worker.inference.reject", wc.envID, e)
		return protocol.ErrorResponse(f.ID, e), true
	}
	if len(f.Params) > protocol.MaxInferenceRequestBytes {
		return refuse(protocol.CodeInvalidContext, "request of %d bytes, at most %d", len(f.Params), protocol.MaxInferenceRequestBytes)
	}
	// The budget is taken before the params are decoded: a worker over it costs no decoding.
	release, e := s.reserve(wc, len(f.Params))
	if e != nil {
		return protocol.ErrorResponse(f.ID, e), true
	}
	releaseInference, e := s.reserveInference(wc)
	if e != nil {
		release()
		return protocol.ErrorResponse(f.ID, e), true
	}
	releaseCall := release
	release = func() { releaseInference(); releaseCall() }
	started := false
	defer func() {
		if !started {
			release()
		}
	}()
	var p protocol.InferenceStartParams
	if err := protocol.DecodeParams(f.Params, &p); err != nil {
		// A closed schema: a base URL, header or model object the worker adds is an unknown field.
		return refuse(protocol.CodeInvalidContext, "params: %v", err)
	}
	if err := p.Validate(); err != nil {
		return refuse(protocol.CodeInvalidContext, "%v", err)
	}
	if !inference.ValidReasoning(p.Options.Reasoning) {
		return refuse(protocol.CodeInvalidContext, "options.reasoning %.32q is not a reasoning level", p.Options.Reasoning)
	}
	if wc.sessionID != "" && p.SessionID != wc.sessionID {
		return protocol.ErrorResponse(f.ID, protocol.Errorf(protocol.CodeSessionNotAttached, "this worker is admitted for session %s only", wc.sessionID)), true
	}
	if _, err := s.cfg.Models.Resolve(p.ModelRef); err != nil {
		return refuse(protocol.CodeModelNotApproved, "%v", err)
	}
	bytesIn := len(f.Params)
	f.Params = nil // the decoded context is what the call keeps
	started = true
	wc.spawn(release, func() { s.runCall(ctx, wc, f, p, bytesIn, release) })
	return protocol.Frame{}, false
}

// checkRun checks that runID (and runEpoch, unless 0) is the session's running turn (Config.Runs);
// checkBinding, called first, has checked that the session is bound to wc's environment. A
// refusal is audited.
func (s *Server) checkRun(ctx context.Context, wc *workerConn, sessionID, runID string, runEpoch uint64) *protocol.Error {
	var running string
	var epoch uint64
	ok := false
	if s.cfg.Runs != nil {
		var err error
		if running, epoch, ok, err = s.cfg.Runs.RunningTurn(ctx, sessionID); err != nil {
			s.log.Warn("turn state lookup", "session", sessionID, "run", runID, "err", err)
			return &protocol.Error{Code: protocol.CodeInternal, Message: "turn lookup failed", Retryable: true}
		}
	}
	var e *protocol.Error
	if !ok || runID == "" || running != runID || (runEpoch != 0 && epoch != runEpoch) {
		e = protocol.Errorf(protocol.CodeUnknownRun, "run %.128q (run epoch %d) is not the running turn of session %.128q",
			runID, runEpoch, sessionID)
	}
	if e != nil {
		s.refused.add("worker.inference.reject", wc.envID, e)
	}
	return e
}

// checkBinding checks that sessionID is attached to wc's environment with ownerEpoch active.
func (s *Server) checkBinding(ctx context.Context, wc *workerConn, sessionID string, ownerEpoch uint64) *protocol.Error {
	return s.bindingError(ctx, wc.envID, sessionID, ownerEpoch)
}

// bindingError checks that sessionID is attached to envID with ownerEpoch active.
func (s *Server) bindingError(ctx context.Context, envID, sessionID string, ownerEpoch uint64) *protocol.Error {
	if s.cfg.Sessions == nil {
		return protocol.Errorf(protocol.CodeSessionNotAttached, "this gateway serves no sessions")
	}
	if len(sessionID) > 128 {
		return protocol.Errorf(protocol.CodeSessionNotAttached, "session id of %d bytes, at most 128", len(sessionID))
	}
	binding, err := s.cfg.Sessions.WorkerBinding(ctx, sessionID)
	var c coded
	switch {
	case errors.As(err, &c):
		return c.Protocol()
	case err != nil:
		return &protocol.Error{Code: protocol.CodeInternal, Message: "binding lookup failed", Retryable: true}
	}
	return binding.Refuse(sessionID, envID, ownerEpoch, 0)
}

// errCreditStalled ends a call whose worker leaves it without credit for Limits.CreditStall.
var errCreditStalled = errors.New("the worker granted no credit")

// takeCredit takes n bytes of w's credit, waiting for the worker's grants at most
// Limits.CreditStall on the hub's clock.
func (s *Server) takeCredit(ctx context.Context, w *protocol.CreditWindow, n uint64) error {
	if w.TryTake(n) {
		return nil
	}
	stall := s.cfg.Limits.CreditStall
	wctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	t := s.cfg.Clock.NewTimer(stall)
	defer t.Stop()
	go func() {
		select {
		case <-t.C():
			cancel(fmt.Errorf("%w for %s (worker.limits.creditStall): the call is ended", errCreditStalled, stall))
		case <-wctx.Done():
		}
	}()
	err := w.Wait(wctx, n)
	if cause := context.Cause(wctx); err != nil && errors.Is(cause, errCreditStalled) {
		return cause
	}
	return err
}

// runCall serves one worker.inference.start after its shape was checked: fencing, replay, then the
// provider call, its events under the worker's credit, the terminal result and the accounting row.
// The call's budgets are released (release) before its last answer is sent, so a worker that starts
// its next call on that answer finds them free.
func (s *Server) runCall(ctx context.Context, wc *workerConn, f protocol.Frame, p protocol.InferenceStartParams, bytesIn int, release func()) {
	last := func(fr protocol.Frame) {
		release()
		wc.answer(ctx, fr)
	}
	if e := s.checkBinding(ctx, wc, p.SessionID, p.OwnerEpoch); e != nil {
		last(protocol.ErrorResponse(f.ID, e))
		return
	}
	if e := s.checkRun(ctx, wc, p.SessionID, p.RunID, p.RunEpoch); e != nil {
		last(protocol.ErrorResponse(f.ID, e))
		return
	}
	if y, ok := s.cfg.Runs.(Yields); ok && y.Yielding(p.SessionID, p.RunID) {
		// a live move: the run stops here, before its call, and goes on on the session's next owner
		last(protocol.ErrorResponse(f.ID, protocol.Errorf(protocol.CodeRunYield,
			"run %.128q stops at this model call: its session moves live, and the turn goes on on its next owner", p.RunID)))
		return
	}
	callCtx, e := s.callCredential(ctx, wc.envID, p.ModelRef)
	if e != nil {
		s.refused.add("worker.inference.reject", wc.envID, e)
		wc.answer(ctx, protocol.ErrorResponse(f.ID, e))
		return
	}
	key := p.CallKey()
	window := p.Credit
	if window == 0 {
		window = protocol.DefaultInferenceWindow
	}
	cctx, cancel := context.WithCancel(callCtx)
	defer cancel()
	call := &proxyCall{reqID: f.ID, window: protocol.NewCreditWindow(window), size: window, cancel: cancel}
	wc.cmu.Lock()
	if wc.calls[key] != nil {
		wc.cmu.Unlock()
		last(protocol.ErrorResponse(f.ID, protocol.Errorf(protocol.CodeBusy, "call %s is in progress", p.TurnID)))
		return
	}
	wc.calls[key] = call
	wc.cmu.Unlock()
	defer func() {
		wc.cmu.Lock()
		delete(wc.calls, key)
		wc.cmu.Unlock()
		call.window.Close()
	}()

	started := s.cfg.Clock.Now()
	cached, err := s.claimCall(ctx, wc.envID, p, bytesIn, started)
	if err != nil {
		last(s.errorFrame(wc, f, err))
		return
	}
	if cached != nil {
		r, _ := protocol.Response(f.ID, protocol.InferenceStartResult{Status: protocol.InferenceReplayed, Terminal: cached})
		last(r)
		return
	}
	r, _ := protocol.Response(f.ID, protocol.InferenceStartResult{Status: protocol.InferenceAccepted})
	if !wc.answer(ctx, r) {
		s.finishCall(wc.envID, p, started, 0, s.terminalFor(p, protocol.Message{}, errConnGone))
		return
	}
	var seq, bytesOut uint64
	msg, err := s.cfg.Models.Stream(cctx, p.ModelRef, p.Context, inference.Options{
		Temperature: p.Options.Temperature, MaxTokens: p.Options.MaxTokens, Reasoning: p.Options.Reasoning,
		Session: p.SessionID, // bound to this worker by the binding check above
	}, func(ev protocol.StreamEvent) error {
		start := time.Now() // the relay's own latency: encoding and writing, not waiting for credit or rate
		seq++
		fr, err := protocol.NewEvent(protocol.MethodInferenceEvent, seq, protocol.InferenceEventPayload{
			SessionID: p.SessionID, RunID: p.RunID, TurnID: p.TurnID, Seq: seq, Event: ev})
		if err != nil {
			return err
		}
		waitFrom := time.Now()
		if err := s.takeCredit(cctx, call.window, protocol.InferenceCreditCost(len(fr.Payload), call.size)); err != nil {
			return err
		}
		if err := s.paceRelay(cctx, wc.envID, len(fr.Payload)); err != nil {
			return err
		}
		waited := time.Since(waitFrom)
		bytesOut += uint64(len(fr.Payload))
		if err := wc.write(cctx, fr); err != nil {
			return err
		}
		s.metrics.relayed(len(fr.Payload), time.Since(start)-waited)
		return nil
	})
	if err != nil && cctx.Err() != nil && !errors.Is(err, context.Canceled) {
		// the call was cancelled (worker cancel, cancel frame, lost connection): whatever error the
		// provider stream ended with, the outcome is aborted
		err = fmt.Errorf("%w: %v", context.Canceled, err)
	}
	t := s.terminalFor(p, msg, err)
	fr, ferr := protocol.NewEvent(protocol.MethodInferenceTerminal, seq+1, t)
	if ferr == nil {
		bytesOut += uint64(len(fr.Payload))
	}
	s.finishCall(wc.envID, p, started, bytesOut, t)
	if ferr == nil && ctx.Err() == nil {
		last(fr)
	}
}

var errConnGone = errors.New("worker connection lost during the call")

// callCredential returns the context the provider call of envID runs under: with the key the
// CallCredentials bound to the environment's revision, or ctx itself when none is bound.
func (s *Server) callCredential(ctx context.Context, envID, ref string) (context.Context, *protocol.Error) {
	if s.cfg.CallCredentials == nil {
		return ctx, nil
	}
	m, err := s.cfg.Models.Resolve(ref)
	if err != nil {
		return nil, protocol.Errorf(protocol.CodeModelNotApproved, "%v", err)
	}
	key, ok, err := s.cfg.CallCredentials.CallCredential(ctx, envID, m)
	var pe *protocol.Error
	switch {
	case errors.As(err, &pe):
		return nil, pe
	case err != nil:
		s.log.Warn("call credential lookup", "env", envID, "model", ref, "err", err)
		return nil, &protocol.Error{Code: protocol.CodeInternal, Message: "credential lookup failed", Retryable: true}
	case ok:
		return inference.WithAPIKey(ctx, key), nil
	}
	return ctx, nil
}

// terminalFor builds the terminal result of a call from what Stream returned.
func (s *Server) terminalFor(p protocol.InferenceStartParams, msg protocol.Message, err error) protocol.InferenceTerminal {
	t := protocol.InferenceTerminal{SessionID: p.SessionID, RunID: p.RunID, TurnID: p.TurnID}
	if err == nil {
		t.Done = &protocol.InferenceDone{Message: msg}
		return t
	}
	e := &protocol.InferenceError{Reason: protocol.StopError, ErrorMessage: err.Error(), Usage: msg.Usage}
	var ce *inference.CallError
	switch {
	case errors.As(err, &ce):
		e.Reason, e.ErrorMessage = ce.Reason, ce.Message
	case errors.Is(err, context.Canceled), errors.Is(err, protocol.ErrWindowClosed), errors.Is(err, errConnGone):
		e.Reason = protocol.StopAborted
	}
	if msg.Role == protocol.RoleAssistant {
		if msg.StopReason == "" || msg.StopReason == protocol.StopStop || msg.StopReason == protocol.StopToolUse {
			msg.StopReason = e.Reason
		}
		if msg.ErrorMessage == "" {
			msg.ErrorMessage = e.ErrorMessage
		}
		e.Partial = &msg
	}
	t.Error = e
	return t
}

// claimCall records the start of a call, or returns the cached terminal of a call already made with
// this identity. A call left running by a gateway that stopped is failed, never made again.
func (s *Server) claimCall(ctx context.Context, envID string, p protocol.InferenceStartParams, bytesIn int, now time.Time) (*protocol.InferenceTerminal, error) {
	var cached *protocol.InferenceTerminal
	err := s.cfg.DB.InTx(ctx, func(tx *sql.Tx) error {
		var outcome, terminal string
		err := tx.QueryRowContext(ctx, `SELECT outcome, terminal FROM inference_calls WHERE session_id=? AND run_epoch=? AND turn_id=?`,
			p.SessionID, p.RunEpoch, p.TurnID).Scan(&outcome, &terminal)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			_, err = tx.ExecContext(ctx, `INSERT INTO inference_calls(environment_id, session_id, run_epoch, run_id, turn_id, model,
				outcome, bytes_in, started_at) VALUES(?,?,?,?,?,?,?,?,?)`,
				envID, p.SessionID, p.RunEpoch, p.RunID, p.TurnID, p.ModelRef, callRunning, bytesIn, store.FormatTime(now))
			return err
		case err != nil:
			return err
		}
		var t protocol.InferenceTerminal
		if terminal == "" || json.Unmarshal([]byte(terminal), &t) != nil {
			t = protocol.InferenceTerminal{SessionID: p.SessionID, RunID: p.RunID, TurnID: p.TurnID, Error: &protocol.InferenceError{
				Reason: protocol.StopError, ErrorMessage: "the gateway stopped during this call; the turn must be retried"}}
			b, _ := json.Marshal(t)
			if _, err := tx.ExecContext(ctx, `UPDATE inference_calls SET outcome=?, terminal=?, finished_at=? WHERE session_id=? AND run_epoch=? AND turn_id=?`,
				callError, string(b), store.FormatTime(now), p.SessionID, p.RunEpoch, p.TurnID); err != nil {
				return err
			}
		}
		cached = &t
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("record inference call %s: %w", p.TurnID, err)
	}
	return cached, nil
}

// finishCall writes a call's outcome, usage and terminal result.
func (s *Server) finishCall(envID string, p protocol.InferenceStartParams, started time.Time, bytesOut uint64, t protocol.InferenceTerminal) {
	outcome := callDone
	var u protocol.Usage
	switch {
	case t.Done != nil:
		if t.Done.Message.Usage != nil {
			u = *t.Done.Message.Usage
		}
	case t.Error != nil:
		outcome = callError
		if t.Error.Reason == protocol.StopAborted {
			outcome = callAborted
		}
		if t.Error.Usage != nil {
			u = *t.Error.Usage
		}
	}
	b, _ := json.Marshal(t)
	now := s.cfg.Clock.Now()
	s.callEnded(now.Sub(started))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := s.cfg.DB.W.ExecContext(ctx, `UPDATE inference_calls SET outcome=?, input_tokens=?, output_tokens=?, cache_read_tokens=?,
		cache_write_tokens=?, total_tokens=?, cost=?, bytes_out=?, duration_ms=?, terminal=?, finished_at=?
		WHERE session_id=? AND run_epoch=? AND turn_id=?`,
		outcome, u.Input, u.Output, u.CacheRead, u.CacheWrite, u.TotalTokens, u.Cost.Total, bytesOut,
		now.Sub(started).Milliseconds(), string(b), store.FormatTime(now), p.SessionID, p.RunEpoch, p.TurnID)
	if err != nil {
		s.log.Error("record inference outcome", "env", envID, "session", p.SessionID, "turn", p.TurnID, "err", err)
	}
	s.log.Info("inference call", "env", envID, "session", p.SessionID, "run", p.RunID, "turn", p.TurnID, "model", p.ModelRef,
		"outcome", outcome, "tokens", u.TotalTokens, "bytesOut", bytesOut, "duration", now.Sub(started))
}

// PruneCalls deletes the accounting rows of calls that ended before cutoff and returns how many.
// (Their runs ended long ago: a worker asking for such a call again is refused with unknown-run.)
func (s *Server) PruneCalls(ctx context.Context, cutoff time.Time) (int64, error) {
	return s.cfg.DB.DeleteBatched(ctx, `DELETE FROM inference_calls WHERE n IN (SELECT n FROM inference_calls
		WHERE outcome <> 'running' AND finished_at <> '' AND finished_at < ? LIMIT ?)`, store.FormatTime(cutoff))
}

// InferenceTotals are an environment's running totals of proxied model calls.
type InferenceTotals struct {
	Calls        int64   `json:"calls"`
	InputTokens  int64   `json:"inputTokens"`
	OutputTokens int64   `json:"outputTokens"`
	TotalTokens  int64   `json:"totalTokens"`
	Cost         float64 `json:"cost"`
	BytesIn      int64   `json:"bytesIn"`
	BytesOut     int64   `json:"bytesOut"`
}

// InferenceTotals sums the accounting rows of an environment.
func (s *Server) InferenceTotals(ctx context.Context, envID string) (InferenceTotals, error) {
	var t InferenceTotals
	err := s.cfg.DB.R.QueryRowContext(ctx, `SELECT COUNT(*), COALESCE(SUM(input_tokens),0), COALESCE(SUM(output_tokens),0),
		COALESCE(SUM(total_tokens),0), COALESCE(SUM(cost),0), COALESCE(SUM(bytes_in),0), COALESCE(SUM(bytes_out),0)
		FROM inference_calls WHERE environment_id=?`, envID).
		Scan(&t.Calls, &t.InputTokens, &t.OutputTokens, &t.TotalTokens, &t.Cost, &t.BytesIn, &t.BytesOut)
	return t, err
}

// cancelRequest handles a cancel frame: the in-flight call started by request id is cancelled
// (its provider stream closed); it reports whether one was.
func (wc *workerConn) cancelRequest(id string) bool {
	wc.cmu.Lock()
	defer wc.cmu.Unlock()
	for _, c := range wc.calls {
		if c.reqID == id {
			c.cancel()
			return true
		}
	}
	return false
}

package hub

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/openclaw/cloudworkers/protocol"
)

// SessionBackend is the session store as the worker endpoint uses it; *sessions.Store implements it.
// Errors that carry a protocol code implement `Protocol() *protocol.Error`; any other error is
// answered as a retryable internal error.
type SessionBackend interface {
	// WorkerBinding returns the session's binding: the environment it is attached to ("" when none),
	// its active owner epoch and its lifecycle revision.
	WorkerBinding(ctx context.Context, sessionID string) (protocol.Binding, error)
	WorkerCommit(ctx context.Context, p protocol.TranscriptCommitParams) (protocol.TranscriptCommitResult, error)
	// WorkerLive publishes a live event from envID's worker; it checks the session's binding (as
	// WorkerBinding reads it) in the transaction that writes the event.
	WorkerLive(ctx context.Context, envID string, p protocol.LiveEventParams) (protocol.LiveEventResult, error)
	WorkerResume(ctx context.Context, p protocol.ResumeParams) (protocol.ResumeResult, error)
}

// Defaults of the flow-control settings in Config.
const (
	DefaultStreamQueue    = 256
	DefaultMaxStreams     = 64
	DefaultConnQueueBytes = 64 << 20
	DefaultRetryAfter     = 200 * time.Millisecond
	// backpressureHold keeps an environment in the backpressure state this long after a rejection.
	backpressureHold = 5 * time.Second
)

// Backpressure is the flow-control state of an environment's worker connection.
type Backpressure struct {
	// Active: a stream queue is at least three quarters full, or a request was refused with
	// capacity-exceeded within the last few seconds.
	Active bool `json:"active"`
	// Queued is the number of requests waiting in the connection's stream queues.
	Queued int `json:"queued"`
	// Rejected counts capacity-exceeded answers since the gateway started.
	Rejected uint64 `json:"rejected"`
	// Shedding says which limit refused or paced the environment's load last, and since when the
	// environment has been shed without a pause; nil when it is not being shed.
	Shedding *Shedding `json:"shedding,omitempty"`
}

// pressure is the per-environment record behind Backpressure; it outlives connections.
type pressure struct {
	rejected atomic.Uint64
	mu       sync.Mutex
	last     time.Time // the last refusal or pacing
	since    time.Time // the first of the current run of them (none more than backpressureHold apart)
	reason   string    // the reason of the last
}

// shed records a refusal or pacing of reason at now.
func (p *pressure) shed(now time.Time, reason string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.last.IsZero() || now.Sub(p.last) >= backpressureHold {
		p.since = now
	}
	p.last, p.reason = now, reason
}

// shedding is the current shedding, nil when the last refusal is older than backpressureHold.
func (p *pressure) shedding(now time.Time) *Shedding {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.last.IsZero() || now.Sub(p.last) >= backpressureHold {
		return nil
	}
	return &Shedding{Reason: p.reason, Since: p.since}
}

func (s *Server) pressureOf(envID string) *pressure {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.pressure[envID]
	if p == nil {
		p = &pressure{}
		s.pressure[envID] = p
	}
	return p
}

// Backpressure reports the flow-control state of envID's worker.
func (s *Server) Backpressure(envID string) Backpressure {
	s.mu.Lock()
	p, wc := s.pressure[envID], s.workers[envID]
	s.mu.Unlock()
	var b Backpressure
	if p != nil {
		b.Rejected = p.rejected.Load()
		b.Shedding = p.shedding(s.cfg.Clock.Now())
		b.Active = b.Shedding != nil
	}
	if wc != nil {
		wc.smu.Lock()
		for _, st := range wc.streams {
			n := len(st.q)
			b.Queued += n
			if n*4 >= cap(st.q)*3 {
				b.Active = true
			}
		}
		wc.smu.Unlock()
	}
	return b
}

// stream is one ordered stream of a connection (session + stream kind): its requests are served in
// order by one goroutine, from a bounded queue, so a slow stream never blocks the read loop.
type stream struct {
	q chan queued
	// live is the scope of the stream's last live event that the backend accepted: an event of the
	// same owner epoch and lifecycle revision skips the binding read, since WorkerLive checks the
	// binding again in its own transaction. Zero: none (owner epochs start at 1). Only the stream's
	// goroutine uses it.
	live liveScope
}

type liveScope struct{ owner, rev uint64 }

type queued struct {
	f      protocol.Frame
	params any // *protocol.TranscriptCommitParams, *protocol.LiveEventParams or *protocol.ResumeParams
	size   int
}

// decodeCommit decodes and checks a worker.transcript.commit; its stream is the scope's transcript.
func decodeCommit(f protocol.Frame) (key, sessionID string, params any, e *protocol.Error) {
	var p protocol.TranscriptCommitParams
	if err := protocol.DecodeParams(f.Params, &p); err != nil {
		return "", "", nil, protocol.Errorf(protocol.CodeInvalidBatch, "params: %v", err)
	}
	if err := p.Scope.Validate(protocol.StreamTranscript); err != nil {
		return "", "", nil, protocol.Errorf(protocol.CodeInvalidBatch, "%v", err)
	}
	if len(p.Messages) == 0 || len(p.Messages) > protocol.MaxCommitMessages {
		return "", "", nil, protocol.Errorf(protocol.CodeInvalidBatch, "a commit carries 1..%d messages, got %d", protocol.MaxCommitMessages, len(p.Messages))
	}
	return p.StreamKey(), p.SessionID, &p, nil
}

// decodeLiveEvent decodes and checks a worker.live-event; its stream is the scope's live stream.
func decodeLiveEvent(f protocol.Frame) (key, sessionID string, params any, e *protocol.Error) {
	var p protocol.LiveEventParams
	if err := protocol.DecodeParams(f.Params, &p); err != nil {
		return "", "", nil, protocol.Errorf(protocol.CodeInvalidFrame, "params: %v", err)
	}
	if err := p.Scope.Validate(protocol.StreamLive); err != nil {
		return "", "", nil, protocol.Errorf(protocol.CodeInvalidFrame, "%v", err)
	}
	return p.StreamKey(), p.SessionID, &p, nil
}

// decodeResume decodes and checks a worker.resume; each session has one resume stream.
func decodeResume(f protocol.Frame) (key, sessionID string, params any, e *protocol.Error) {
	var p protocol.ResumeParams
	if err := protocol.DecodeParams(f.Params, &p); err != nil {
		return "", "", nil, protocol.Errorf(protocol.CodeInvalidFrame, "params: %v", err)
	}
	if err := p.Validate(); err != nil {
		return "", "", nil, protocol.Errorf(protocol.CodeInvalidFrame, "%v", err)
	}
	return p.SessionID + "\x00resume", p.SessionID, &p, nil
}

// enqueue decodes a durable-session request with decode and queues it on its stream. It answers
// (returns a frame, now true) only when the request is refused before queueing.
func (s *Server) enqueue(ctx context.Context, wc *workerConn, f protocol.Frame,
	decode func(protocol.Frame) (key, sessionID string, params any, e *protocol.Error)) (res protocol.Frame, now bool) {
	if s.cfg.Sessions == nil {
		return protocol.ErrorResponse(f.ID, protocol.Errorf(protocol.CodeMethodNotAllowed, "method %.128q is not served", f.Method)), true
	}
	key, sessionID, params, e := decode(f)
	if e != nil {
		return protocol.ErrorResponse(f.ID, e), true
	}
	if wc.sessionID != "" && sessionID != wc.sessionID {
		return protocol.ErrorResponse(f.ID, protocol.Errorf(protocol.CodeSessionNotAttached, "this worker is admitted for session %s only", wc.sessionID)), true
	}
	size := len(f.Params)
	capacity := func(why string) (protocol.Frame, bool) {
		return protocol.ErrorResponse(f.ID, s.capacityError(wc.envID, ReasonStreamQueue, s.cfg.RetryAfter, "%s", why)), true
	}
	if wc.queuedBytes.Add(int64(size)) > int64(s.cfg.ConnQueueBytes) {
		wc.queuedBytes.Add(-int64(size))
		return capacity(fmt.Sprintf("more than %d bytes queued on this connection", s.cfg.ConnQueueBytes))
	}
	st, err := wc.stream(ctx, s, key)
	if err != nil {
		wc.queuedBytes.Add(-int64(size))
		return capacity(err.Error())
	}
	select {
	case st.q <- queued{f: f, params: params, size: size}:
		return protocol.Frame{}, false
	default:
		wc.queuedBytes.Add(-int64(size))
		return capacity(fmt.Sprintf("stream queue full (%d requests)", cap(st.q)))
	}
}

var errTooManyStreams = errors.New("too many streams on this connection")

// stream returns the stream for key, starting its goroutine on first use.
func (wc *workerConn) stream(ctx context.Context, s *Server, key string) (*stream, error) {
	wc.smu.Lock()
	defer wc.smu.Unlock()
	if st := wc.streams[key]; st != nil {
		return st, nil
	}
	if len(wc.streams) >= s.cfg.MaxStreams {
		return nil, errTooManyStreams
	}
	st := &stream{q: make(chan queued, s.cfg.StreamQueue)}
	wc.streams[key] = st
	wc.swg.Add(1)
	go func() {
		defer wc.swg.Done()
		for {
			select {
			case <-ctx.Done():
				return
			case it := <-st.q:
				res := s.serveStream(ctx, wc, st, it)
				wc.queuedBytes.Add(-int64(it.size))
				if !wc.answer(ctx, res) {
					return
				}
			}
		}
	}()
	return st, nil
}

// serveStream checks a queued operation's scope against the session and serves it.
func (s *Server) serveStream(ctx context.Context, wc *workerConn, st *stream, it queued) protocol.Frame {
	b := s.cfg.Sessions
	var scope protocol.Scope
	switch p := it.params.(type) {
	case *protocol.TranscriptCommitParams:
		scope = p.Scope
	case *protocol.LiveEventParams:
		scope = p.Scope
	case *protocol.ResumeParams:
		scope = protocol.Scope{SessionID: p.SessionID, OwnerEpoch: p.OwnerEpoch}
	}
	lp, isLive := it.params.(*protocol.LiveEventParams)
	// A live event of the scope last accepted on this stream is checked in WorkerLive's own
	// transaction only; the binding read before it was 15 % of the bench gateway's CPU.
	if !isLive || st.live == (liveScope{}) || st.live != (liveScope{scope.OwnerEpoch, scope.LifecycleRevision}) {
		binding, err := b.WorkerBinding(ctx, scope.SessionID)
		if err != nil {
			return s.errorFrame(wc, it.f, err)
		}
		if e := binding.Refuse(scope.SessionID, wc.envID, scope.OwnerEpoch, scope.LifecycleRevision); e != nil {
			return protocol.ErrorResponse(it.f.ID, e)
		}
	}
	var out any
	var err error
	start := time.Now()
	switch p := it.params.(type) {
	case *protocol.TranscriptCommitParams:
		out, err = b.WorkerCommit(ctx, *p)
		s.metrics.committed(commitTranscript, time.Since(start))
	case *protocol.LiveEventParams:
		out, err = b.WorkerLive(ctx, wc.envID, *p)
		s.metrics.committed(commitLive, time.Since(start))
	case *protocol.ResumeParams:
		out, err = b.WorkerResume(ctx, *p)
	}
	if isLive {
		st.live = liveScope{}
		if err == nil {
			st.live = liveScope{lp.OwnerEpoch, lp.LifecycleRevision}
		}
	}
	if err != nil {
		return s.errorFrame(wc, it.f, err)
	}
	res, err := protocol.Response(it.f.ID, out)
	if err != nil {
		return s.errorFrame(wc, it.f, err)
	}
	return res
}

// coded is an error that knows its protocol error object (sessions.Error).
type coded interface{ Protocol() *protocol.Error }

func (s *Server) errorFrame(wc *workerConn, f protocol.Frame, err error) protocol.Frame {
	var c coded
	if errors.As(err, &c) {
		return protocol.ErrorResponse(f.ID, c.Protocol())
	}
	s.log.Warn("worker request failed", "env", wc.envID, "method", f.Method, "err", err)
	return protocol.ErrorResponse(f.ID, &protocol.Error{Code: protocol.CodeInternal, Message: "request failed",
		Retryable: true, RetryAfterMs: s.cfg.RetryAfter.Milliseconds()})
}

// streamState is the per-connection stream bookkeeping, embedded in workerConn.
type streamState struct {
	smu         sync.Mutex
	streams     map[string]*stream
	swg         sync.WaitGroup
	queuedBytes atomic.Int64
}

package remote

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/coder/websocket"
	"golang.org/x/sync/errgroup"

	"github.com/openclaw/cloudworkers/internal/backoff"
	"github.com/openclaw/cloudworkers/protocol"
)

// Defaults of ClientConfig.
const (
	DefaultLiveWindow  = 64
	DefaultOutboxLimit = 4096
)

// ErrClientClosed is returned by a Client's methods after Close.
var ErrClientClosed = errors.New("worker client closed")

// errConnLost fails a request whose connection ended before it was answered.
var errConnLost = errors.New("gateway connection lost")

// ClientConfig configures a Client: the connection (Config, whose SessionID and OwnerEpoch are the
// session the client writes to) and the run it writes for.
type ClientConfig struct {
	Config
	// RunEpoch numbers the run's streams (default 1); RunID is carried for logs.
	RunEpoch uint64
	RunID    string
	// LiveWindow is how many live events may be in flight unacknowledged (default 64).
	LiveWindow int
	// OutboxLimit bounds the live events kept until acknowledged; Live waits when it is full
	// (default 4096).
	OutboxLimit int
}

func (c *ClientConfig) setDefaults() {
	c.Config.setDefaults()
	if c.RunEpoch == 0 {
		c.RunEpoch = 1
	}
	if c.LiveWindow <= 0 {
		c.LiveWindow = DefaultLiveWindow
	}
	if c.OutboxLimit <= 0 {
		c.OutboxLimit = DefaultOutboxLimit
	}
}

// Validate reports a config that cannot work.
func (c *ClientConfig) Validate() error {
	if err := c.Config.Validate(); err != nil {
		return err
	}
	if c.SessionID == "" || c.OwnerEpoch == 0 {
		return errors.New("worker client config: session id and owner epoch are required")
	}
	return nil
}

// ClientStats counts what a Client did, for logs and tests.
type ClientStats struct {
	Connects        int // admitted connections
	LiveSent        int // live-event frames sent, resends included
	Resyncs         int // resync-required answers acted on
	CapacityRetries int // capacity-exceeded (or retryable internal) answers acted on
	CommitRetries   int // commits resent after a lost connection or a retryable answer
}

// Client is the worker side of the durable session protocol for one session and run. It keeps the
// transcript commits and live events it has not seen acknowledged in a bounded outbox, reconnects
// with backoff, asks the gateway where it stands (worker.resume) on every connection and resends
// from there. Delivery is at-least-once; the gateway dedupes on the operation identity.
//
// Live events are pipelined (up to LiveWindow in flight, cumulative ACKs; resync-required and
// capacity-exceeded rewind to the ACK cursor). Transcript commits go one at a time, because each
// commit's base leaf is the previous commit's new leaf.
type Client struct {
	cfg    ClientConfig
	w      *worker
	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}

	mu      sync.Mutex
	changed chan struct{} // closed and replaced on every state change
	conn    *clientConn   // the connection senders use; nil while disconnected or not resumed
	err     error         // terminal: fenced, refused, shut down or closed
	resumed bool          // seqs and leaf initialised from the gateway's cursors
	stats   ClientStats

	// live stream: outbox[i] has seq liveAcked+1+i
	outbox    []json.RawMessage
	liveAcked uint64
	sendFrom  uint64 // next seq to send on the current connection
	gen       uint64 // bumped on every rewind; answers to frames of older generations are ignored
	livePause time.Time

	// transcript stream: commits[0] is in flight
	commits    []*pendingCommit
	commitNext uint64
	leaf       string

	infer inferState // model calls through the gateway's inference proxy
}

type pendingCommit struct {
	seq  uint64
	msgs []json.RawMessage
	done chan struct{}
	res  protocol.TranscriptCommitResult
	err  error
}

// NewClient validates cfg and starts connecting; Close stops it.
func NewClient(cfg ClientConfig) (*Client, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	c := &Client{cfg: cfg, w: newWorker(cfg.Config), ctx: ctx, cancel: cancel, done: make(chan struct{}),
		changed: make(chan struct{})}
	go c.run()
	return c, nil
}

// Close stops the client; unacknowledged frames are abandoned. It is safe to call more than once.
func (c *Client) Close() error {
	c.cancel()
	<-c.done
	c.w.client.CloseIdleConnections()
	return nil
}

// Err is the terminal error that stopped the client, or nil while it runs.
func (c *Client) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// Stats returns a snapshot of the client's counters.
func (c *Client) Stats() ClientStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stats
}

// LiveAcked is the cumulative ACK of the live stream.
func (c *Client) LiveAcked() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.liveAcked
}

func (c *Client) notifyLocked() {
	close(c.changed)
	c.changed = make(chan struct{})
}

// wait blocks until cond holds (checked under c.mu), the client stops or ctx ends. until, when not
// zero, also wakes it at that time. It returns with c.mu held when it returns nil.
func (c *Client) wait(ctx context.Context, cond func() (ok bool, until time.Time)) error {
	for {
		c.mu.Lock()
		ok, until := cond()
		if ok {
			return nil
		}
		if c.err != nil {
			err := c.err
			c.mu.Unlock()
			return err
		}
		ch := c.changed
		c.mu.Unlock()
		var timer <-chan time.Time
		var t *time.Timer
		if !until.IsZero() {
			t = time.NewTimer(time.Until(until))
			timer = t.C
		}
		var err error
		select {
		case <-ch:
		case <-timer:
		case <-ctx.Done():
			err = ctx.Err()
		case <-c.ctx.Done():
			err = ErrClientClosed
		}
		if t != nil {
			t.Stop()
		}
		if err != nil {
			return err
		}
	}
}

// Live queues one live event (a sessions.LiveEvent value or its JSON) and returns its seq. It waits
// while the outbox is full. The event is acknowledged later; see WaitLiveAcked.
func (c *Client) Live(ctx context.Context, event any) (uint64, error) {
	raw, ok := event.(json.RawMessage)
	if !ok {
		b, err := json.Marshal(event)
		if err != nil {
			return 0, fmt.Errorf("encode live event: %w", err)
		}
		raw = b
	}
	if err := c.wait(ctx, func() (bool, time.Time) {
		return c.resumed && len(c.outbox) < c.cfg.OutboxLimit, time.Time{}
	}); err != nil {
		return 0, err
	}
	defer c.mu.Unlock()
	c.outbox = append(c.outbox, raw)
	seq := c.liveAcked + uint64(len(c.outbox))
	c.notifyLocked()
	return seq, nil
}

// WaitLiveAcked waits until the gateway has acknowledged every live event up to seq.
func (c *Client) WaitLiveAcked(ctx context.Context, seq uint64) error {
	if err := c.wait(ctx, func() (bool, time.Time) { return c.liveAcked >= seq, time.Time{} }); err != nil {
		return err
	}
	c.mu.Unlock()
	return nil
}

// Commit appends messages to the session's transcript after the previous commit and waits for the
// result; it is resent across reconnects until the gateway answers. Commits are applied in the
// order they were called.
func (c *Client) Commit(ctx context.Context, msgs []protocol.Message) (protocol.TranscriptCommitResult, error) {
	raws := make([]json.RawMessage, len(msgs))
	for i, m := range msgs {
		b, err := json.Marshal(m)
		if err != nil {
			return protocol.TranscriptCommitResult{}, fmt.Errorf("encode message %d: %w", i, err)
		}
		raws[i] = b
	}
	if err := c.wait(ctx, func() (bool, time.Time) {
		return c.resumed && len(c.commits) < c.cfg.OutboxLimit, time.Time{}
	}); err != nil {
		return protocol.TranscriptCommitResult{}, err
	}
	pc := &pendingCommit{seq: c.commitNext, msgs: raws, done: make(chan struct{})}
	c.commitNext++
	c.commits = append(c.commits, pc)
	c.notifyLocked()
	c.mu.Unlock()
	select {
	case <-pc.done:
		return pc.res, pc.err
	case <-ctx.Done():
		return protocol.TranscriptCommitResult{}, ctx.Err()
	case <-c.ctx.Done():
		return protocol.TranscriptCommitResult{}, ErrClientClosed
	}
}

// Call sends one request on the current connection and waits for its answer, without retry. A
// refused request returns its *protocol.Error. It is for methods the Client does not manage.
func (c *Client) Call(ctx context.Context, method string, params any) (json.RawMessage, error) {
	var cc *clientConn
	if err := c.wait(ctx, func() (bool, time.Time) { return c.conn != nil, time.Time{} }); err != nil {
		return nil, err
	}
	cc = c.conn
	c.mu.Unlock()
	f, err := cc.call(ctx, c.w.id(), method, params)
	if err != nil {
		return nil, err
	}
	if !f.OK {
		return nil, f.Error
	}
	return f.Payload, nil
}

// fail stops the client with a terminal error and fails every queued commit.
func (c *Client) fail(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err == nil {
		c.err = err
	}
	for _, pc := range c.commits {
		pc.err = c.err
		close(pc.done)
	}
	c.commits = nil
	c.notifyLocked()
}

func (c *Client) run() {
	defer close(c.done)
	defer c.fail(ErrClientClosed)
	bo := backoff.Backoff{Min: c.cfg.BackoffMin, Max: c.cfg.BackoffMax, Clock: c.cfg.Clock}
	for {
		admitted, err := c.session(c.ctx)
		if c.ctx.Err() != nil {
			return
		}
		var ae *AdmissionError
		var pe *protocol.Error
		switch {
		case errors.Is(err, errShutdown):
			c.fail(err)
			return
		case errors.As(err, &ae) && ae.Permanent():
			c.fail(err)
			return
		case errors.As(err, &pe) && fatal(pe.Code):
			c.fail(err)
			return
		}
		if c.Err() != nil {
			return
		}
		if admitted {
			bo.Reset()
		}
		d := bo.Next()
		c.w.log.Info("gateway connection lost; reconnecting", "err", err, "in", d)
		if bo.Sleep(c.ctx, d) != nil {
			return
		}
	}
}

// fatal reports whether an answer with code ends the client: the session is no longer its to write.
func fatal(code protocol.Code) bool {
	switch code {
	case protocol.CodeEpochMismatch, protocol.CodeSessionNotAttached, protocol.CodeMethodNotAllowed:
		return true
	}
	return false
}

// retryable reports whether an answer with e is worth resending after e's retryAfterMs.
func retryable(e *protocol.Error) bool {
	return e.Code == protocol.CodeCapacityExceeded || e.Retryable
}

func retryAfter(e *protocol.Error) time.Duration {
	if e.RetryAfterMs > 0 {
		return time.Duration(e.RetryAfterMs) * time.Millisecond
	}
	return 100 * time.Millisecond
}

// session runs one admitted connection: resume, then the senders, until the connection ends.
func (c *Client) session(ctx context.Context) (admitted bool, err error) {
	ws, cr, err := c.w.admit(ctx)
	if err != nil {
		return false, err
	}
	defer ws.CloseNow()
	cc := &clientConn{ws: ws, handler: map[string]func(protocol.Frame){}, lost: make(chan struct{}), onEvent: c.inferenceEvent}
	interval := heartbeatInterval(cr)
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return cc.readLoop(gctx, 3*interval+time.Second) })
	g.Go(func() error {
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-gctx.Done():
				return gctx.Err()
			case <-t.C:
			}
			if err := cc.send(gctx, c.w.id(), protocol.MethodHeartbeat, nil, nil); err != nil {
				return err
			}
		}
	})
	g.Go(func() error {
		if err := c.resume(gctx, cc); err != nil {
			return err
		}
		sg, sctx := errgroup.WithContext(gctx)
		sg.Go(func() error { return c.liveSender(sctx, cc) })
		sg.Go(func() error { return c.commitSender(sctx, cc) })
		return sg.Wait()
	})
	err = g.Wait()
	c.mu.Lock()
	if c.conn == cc {
		c.conn = nil
		c.notifyLocked()
	}
	c.mu.Unlock()
	if errors.Is(err, errShutdown) {
		_ = ws.Close(websocket.StatusNormalClosure, "shutdown")
	}
	return true, err
}

// resume asks the gateway for its cursors and lines the outbox up with them.
func (c *Client) resume(ctx context.Context, cc *clientConn) error {
	f, err := cc.call(ctx, c.w.id(), protocol.MethodResume, protocol.ResumeParams{SessionID: c.cfg.SessionID, OwnerEpoch: c.cfg.OwnerEpoch})
	if err != nil {
		return err
	}
	if !f.OK {
		return f.Error
	}
	var r protocol.ResumeResult
	if err := protocol.DecodeParams(f.Payload, &r); err != nil {
		return fmt.Errorf("resume response: %w", err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	var liveAcked, committed uint64
	if r.LiveAcked.RunEpoch == c.cfg.RunEpoch {
		liveAcked = r.LiveAcked.Seq
	}
	if r.LastCommitted.RunEpoch == c.cfg.RunEpoch {
		committed = r.LastCommitted.Seq
	}
	if !c.resumed {
		// A fresh client continues after whatever this run already wrote.
		c.liveAcked, c.commitNext, c.leaf = liveAcked, committed+1, r.LeafID
		c.resumed = true
	} else if liveAcked > c.liveAcked {
		drop := min(liveAcked-c.liveAcked, uint64(len(c.outbox)))
		c.outbox = c.outbox[drop:]
		c.liveAcked += drop
	}
	c.sendFrom = c.liveAcked + 1
	c.gen++
	c.conn = cc
	c.stats.Connects++
	c.notifyLocked()
	c.w.log.Info("resumed", "session", c.cfg.SessionID, "leaf", r.LeafID, "liveAcked", liveAcked, "committed", committed)
	return nil
}

func (c *Client) liveSender(ctx context.Context, cc *clientConn) error {
	for {
		var seq, gen, acked uint64
		var ev json.RawMessage
		gone := false
		if err := c.wait(ctx, func() (bool, time.Time) {
			if c.conn != cc {
				gone = true
				return true, time.Time{}
			}
			if now := time.Now(); now.Before(c.livePause) {
				return false, c.livePause
			}
			inflight := c.sendFrom - 1 - c.liveAcked
			return c.sendFrom <= c.liveAcked+uint64(len(c.outbox)) && inflight < uint64(c.cfg.LiveWindow), time.Time{}
		}); err != nil {
			return err
		}
		if gone {
			c.mu.Unlock()
			return nil
		}
		seq, gen, acked = c.sendFrom, c.gen, c.liveAcked
		ev = c.outbox[seq-c.liveAcked-1]
		c.sendFrom++
		c.stats.LiveSent++
		c.mu.Unlock()
		p := protocol.LiveEventParams{Scope: c.scope(protocol.StreamLive, seq), LastAckedSeq: acked, Event: ev}
		if err := cc.send(ctx, c.w.id(), protocol.MethodLiveEvent, p, func(f protocol.Frame) { c.liveAnswer(gen, f) }); err != nil {
			return err
		}
	}
}

func (c *Client) scope(kind protocol.StreamKind, seq uint64) protocol.Scope {
	return protocol.Scope{SessionID: c.cfg.SessionID, RunID: c.cfg.RunID, OwnerEpoch: c.cfg.OwnerEpoch,
		StreamKind: kind, RunEpoch: c.cfg.RunEpoch, Seq: seq}
}

// liveAnswer applies the gateway's answer to a live event sent in generation gen.
func (c *Client) liveAnswer(gen uint64, f protocol.Frame) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if f.OK {
		var r protocol.LiveEventResult
		if err := protocol.DecodeParams(f.Payload, &r); err != nil {
			c.w.log.Warn("bad live-event answer", "err", err)
			return
		}
		c.ackLocked(r.AckedSeq)
		return
	}
	e := f.Error
	switch {
	case e.Code == protocol.CodeResyncRequired:
		c.ackLocked(e.AckedSeq)
		if gen == c.gen {
			c.sendFrom = c.liveAcked + 1
			c.gen++
			c.stats.Resyncs++
		}
	case retryable(e):
		if gen == c.gen {
			c.sendFrom = c.liveAcked + 1
			c.gen++
			c.livePause = time.Now().Add(retryAfter(e))
			c.stats.CapacityRetries++
		}
	default:
		// epoch-mismatch, session-not-attached, invalid-frame: this stream cannot go on.
		if c.err == nil {
			c.err = e
		}
	}
	c.notifyLocked()
}

func (c *Client) ackLocked(acked uint64) {
	if acked <= c.liveAcked {
		return
	}
	drop := min(acked-c.liveAcked, uint64(len(c.outbox)))
	c.outbox = c.outbox[drop:]
	c.liveAcked += drop
	if c.sendFrom <= c.liveAcked {
		c.sendFrom = c.liveAcked + 1
	}
	c.notifyLocked()
}

func (c *Client) commitSender(ctx context.Context, cc *clientConn) error {
	var pause time.Time
	for {
		gone := false
		if err := c.wait(ctx, func() (bool, time.Time) {
			if c.conn != cc {
				gone = true
				return true, time.Time{}
			}
			if time.Now().Before(pause) {
				return false, pause
			}
			return len(c.commits) > 0, time.Time{}
		}); err != nil {
			return err
		}
		if gone {
			c.mu.Unlock()
			return nil
		}
		pc, leaf := c.commits[0], c.leaf
		c.mu.Unlock()
		p := protocol.TranscriptCommitParams{Scope: c.scope(protocol.StreamTranscript, pc.seq), BaseLeafID: leaf, Messages: pc.msgs}
		f, err := cc.call(ctx, c.w.id(), protocol.MethodTranscriptCommit, p)
		if err != nil {
			c.mu.Lock()
			c.stats.CommitRetries++ // resent on the next connection
			c.mu.Unlock()
			return err
		}
		c.mu.Lock()
		switch {
		case f.OK:
			if err := protocol.DecodeParams(f.Payload, &pc.res); err != nil {
				pc.err = fmt.Errorf("commit answer: %w", err)
			} else {
				c.leaf = pc.res.NewLeafID
			}
		case retryable(f.Error):
			c.stats.CommitRetries++
			pause = time.Now().Add(retryAfter(f.Error))
			c.mu.Unlock()
			continue
		default:
			pc.err = f.Error
			if fatal(f.Error.Code) && c.err == nil {
				c.err = f.Error
			}
		}
		c.commits = c.commits[1:]
		close(pc.done)
		c.notifyLocked()
		c.mu.Unlock()
	}
}

// clientConn is one admitted connection of a Client.
type clientConn struct {
	ws *websocket.Conn

	mu      sync.Mutex
	handler map[string]func(protocol.Frame) // request id → what to do with its answer
	lost    chan struct{}                   // closed when the read loop ends
	// onEvent receives the gateway's event frames other than worker.shutdown, on the read loop.
	onEvent func(protocol.Frame)
}

// send writes a request; on its answer, onAnswer (if not nil) runs on the read loop.
func (cc *clientConn) send(ctx context.Context, id, method string, params any, onAnswer func(protocol.Frame)) error {
	req, err := protocol.Request(id, method, params)
	if err != nil {
		return err
	}
	if onAnswer != nil {
		cc.mu.Lock()
		cc.handler[id] = onAnswer
		cc.mu.Unlock()
	}
	if err := writeFrame(ctx, cc.ws, req); err != nil {
		return fmt.Errorf("send %s: %w", method, err)
	}
	return nil
}

// call sends a request and waits for its answer or the connection's end.
func (cc *clientConn) call(ctx context.Context, id, method string, params any) (protocol.Frame, error) {
	ch := make(chan protocol.Frame, 1)
	if err := cc.send(ctx, id, method, params, func(f protocol.Frame) { ch <- f }); err != nil {
		return protocol.Frame{}, err
	}
	select {
	case f := <-ch:
		return f, nil
	case <-cc.lost:
		return protocol.Frame{}, errConnLost
	case <-ctx.Done():
		return protocol.Frame{}, ctx.Err()
	}
}

func (cc *clientConn) readLoop(ctx context.Context, silence time.Duration) error {
	defer close(cc.lost)
	for {
		rctx, cancel := context.WithTimeout(ctx, silence)
		f, err := readFrame(rctx, cc.ws)
		cancel()
		if err != nil {
			return fmt.Errorf("read from gateway: %w", err)
		}
		switch f.Type {
		case protocol.TypeEvent:
			if f.Event == protocol.MethodShutdown {
				return errShutdown
			}
			if cc.onEvent != nil {
				cc.onEvent(f)
			}
		case protocol.TypeReq:
			if f.Method == protocol.MethodShutdown {
				res, _ := protocol.Response(f.ID, struct{}{})
				_ = writeFrame(ctx, cc.ws, res)
				return errShutdown
			}
			e := protocol.Errorf(protocol.CodeMethodNotAllowed, "worker does not serve %.128q", f.Method)
			if err := writeFrame(ctx, cc.ws, protocol.ErrorResponse(f.ID, e)); err != nil {
				return err
			}
		case protocol.TypeRes:
			cc.mu.Lock()
			h := cc.handler[f.ID]
			delete(cc.handler, f.ID)
			cc.mu.Unlock()
			if h != nil {
				h(f)
			}
		}
	}
}

package remote

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/openclaw/cloudworkers/internal/clock"
	"github.com/openclaw/cloudworkers/protocol"
)

// Defaults of ClientConfig.
const (
	DefaultLiveWindow           = 64
	DefaultOutboxLimit          = 4096
	DefaultLiveCoalesceBytes    = 16 << 10
	DefaultLiveCoalesceInflight = 2
	DefaultLiveCoalesceDelay    = 40 * time.Millisecond
)

// ErrClientClosed is returned by a Client's methods after Close.
var ErrClientClosed = errors.New("worker client closed")

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
	// LiveCoalesceBytes bounds the delta of one live event: consecutive text_delta (or
	// thinking_delta) events that were never sent merge into one while their deltas fit
	// (default 16 KiB; a single bigger delta goes alone). Negative: every event goes alone.
	LiveCoalesceBytes int
	// LiveCoalesceInflight: while at least this many live events are unacknowledged, a delta
	// at the tail of the outbox is held so that the deltas after it merge into it, like Nagle's
	// algorithm (default 2). It goes as soon as fewer are in flight, it reaches
	// LiveCoalesceBytes, another event follows it or WaitLiveAcked asks for it. Negative: never
	// held.
	LiveCoalesceInflight int
	// LiveCoalesceDelay: a delta at the tail of the outbox waits up to this long after it was
	// queued, so that the deltas of the next few tokens merge into it (default 40ms: a viewer sees
	// text at up to 25 updates a second, and a model streaming 50 tokens a second costs the gateway
	// a live event per two or three tokens instead of one per token). It goes earlier when it
	// reaches LiveCoalesceBytes, another event follows it or WaitLiveAcked asks for it. Negative:
	// never held for time.
	LiveCoalesceDelay time.Duration
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
	if c.LiveCoalesceBytes == 0 {
		c.LiveCoalesceBytes = DefaultLiveCoalesceBytes
	}
	c.LiveCoalesceBytes = min(c.LiveCoalesceBytes, protocol.MaxLiveEventBytes) // a merged delta stays one valid event
	if c.LiveCoalesceInflight == 0 {
		c.LiveCoalesceInflight = DefaultLiveCoalesceInflight
	}
	if c.LiveCoalesceDelay == 0 {
		c.LiveCoalesceDelay = DefaultLiveCoalesceDelay
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
	LiveMerged      int // deltas merged into the live event before them (Live returned its seq)
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
// capacity-exceeded rewind to the ACK cursor). Consecutive deltas that were never sent merge into
// one event (see LiveCoalesceBytes and LiveCoalesceInflight); an event once sent never changes, so
// a resend carries the same content under the same seq. Transcript commits go one at a time,
// because each commit's base leaf is the previous commit's new leaf.
type Client struct {
	cfg    ClientConfig
	w      *worker
	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}

	mu      sync.Mutex
	changed chan struct{} // closed and replaced on every state change
	conn    *conn         // the connection senders use; nil while disconnected or not resumed
	err     error         // terminal: fenced, refused, shut down or closed
	resumed bool          // seqs and leaf initialised from the gateway's cursors
	stats   ClientStats

	// live stream: outbox[i] has seq liveAcked+1+i
	outbox    []protocol.LiveEvent
	liveAcked uint64
	sendFrom  uint64    // next seq to send on the current connection
	liveSent  uint64    // highest seq ever sent on any connection: it and those before it never change
	liveFlush uint64    // WaitLiveAcked asked for seqs up to this one: none of them is held
	tailAt    time.Time // when the outbox's last event was queued (LiveCoalesceDelay runs from it)
	gen       uint64    // bumped on every rewind; answers to frames of older generations are ignored
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
		var t clock.Timer
		if !until.IsZero() {
			t = c.cfg.Clock.NewTimer(until.Sub(c.w.now()))
			timer = t.C()
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

// Live queues one live event and returns its seq: a delta that merged into the never-sent delta
// before it returns that event's seq. It waits while the outbox is full. The event is acknowledged
// later; see WaitLiveAcked.
func (c *Client) Live(ctx context.Context, ev protocol.LiveEvent) (uint64, error) {
	if _, err := json.Marshal(ev); err != nil {
		return 0, fmt.Errorf("encode live event: %w", err)
	}
	merge := false
	if err := c.wait(ctx, func() (bool, time.Time) {
		merge = c.resumed && c.mergesLocked(ev)
		return c.resumed && (merge || len(c.outbox) < c.cfg.OutboxLimit), time.Time{}
	}); err != nil {
		return 0, err
	}
	defer c.mu.Unlock()
	if merge {
		c.outbox[len(c.outbox)-1].Delta += ev.Delta
		c.stats.LiveMerged++
	} else {
		c.outbox = append(c.outbox, ev)
		c.tailAt = c.w.now()
	}
	seq := c.liveAcked + uint64(len(c.outbox))
	c.notifyLocked()
	return seq, nil
}

// deltaOnly reports whether ev is a text or thinking delta with nothing else set: one that may
// merge with its neighbours.
func deltaOnly(ev protocol.LiveEvent) bool {
	return (ev.Type == protocol.LiveTextDelta || ev.Type == protocol.LiveThinkingDelta) && ev.Delta != "" &&
		ev.ToolCallID == "" && ev.ToolName == "" && len(ev.Args) == 0 && len(ev.PartialResult) == 0 &&
		len(ev.Result) == 0 && !ev.IsError && ev.Error == ""
}

// mergesLocked reports whether ev merges into the outbox's last event: both deltas of one type,
// that event never sent, and their deltas within LiveCoalesceBytes.
func (c *Client) mergesLocked(ev protocol.LiveEvent) bool {
	n := len(c.outbox)
	if c.cfg.LiveCoalesceBytes < 0 || n == 0 || c.liveAcked+uint64(n) <= c.liveSent || !deltaOnly(ev) {
		return false
	}
	tail := c.outbox[n-1]
	return tail.Type == ev.Type && deltaOnly(tail) && len(tail.Delta)+len(ev.Delta) <= c.cfg.LiveCoalesceBytes
}

// holdLocked reports whether the event at sendFrom waits for deltas to merge into it: it is the
// outbox's last event, a delta never sent with room left, and either LiveCoalesceInflight events are
// in flight (their ACK sends it; until is zero) or it was queued less than LiveCoalesceDelay ago
// (until is when that ends).
func (c *Client) holdLocked(inflight uint64) (hold bool, until time.Time) {
	n := len(c.outbox)
	if c.cfg.LiveCoalesceBytes < 0 || n == 0 || c.sendFrom != c.liveAcked+uint64(n) || c.sendFrom <= c.liveSent ||
		c.sendFrom <= c.liveFlush {
		return false, time.Time{}
	}
	if tail := c.outbox[n-1]; !deltaOnly(tail) || len(tail.Delta) >= c.cfg.LiveCoalesceBytes {
		return false, time.Time{}
	}
	if c.cfg.LiveCoalesceInflight >= 0 && inflight >= uint64(c.cfg.LiveCoalesceInflight) {
		return true, time.Time{}
	}
	if end := c.tailAt.Add(c.cfg.LiveCoalesceDelay); c.cfg.LiveCoalesceDelay > 0 && c.w.now().Before(end) {
		return true, end
	}
	return false, time.Time{}
}

// WaitLiveAcked waits until the gateway has acknowledged every live event up to seq. A delta held
// for merging (LiveCoalesceInflight) among them goes at once.
func (c *Client) WaitLiveAcked(ctx context.Context, seq uint64) error {
	c.mu.Lock()
	if seq > c.liveFlush {
		c.liveFlush = seq
		c.notifyLocked()
	}
	c.mu.Unlock()
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
	var cc *conn
	if err := c.wait(ctx, func() (bool, time.Time) { return c.conn != nil, time.Time{} }); err != nil {
		return nil, err
	}
	cc = c.conn
	c.mu.Unlock()
	f, err := cc.call(ctx, method, params)
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
	opts := connOptions{onEvent: c.inferenceEvent, work: c.serve}
	_ = c.w.reconnect(c.ctx, slog.LevelInfo, func(ctx context.Context) (bool, error) { return c.w.connect(ctx, opts) },
		func(err error) bool {
			if c.ctx.Err() != nil {
				return true
			}
			var ae *AdmissionError
			var pe *protocol.Error
			if errors.Is(err, errShutdown) || errors.As(err, &ae) && ae.Permanent() || errors.As(err, &pe) && fatal(pe.Code) {
				c.fail(err)
				return true
			}
			return c.Err() != nil
		})
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

// serve is the Client's work on one admitted connection: resume, then the senders, until the
// connection ends.
func (c *Client) serve(ctx context.Context, cc *conn) error {
	defer func() {
		c.mu.Lock()
		if c.conn == cc {
			c.conn = nil
			c.notifyLocked()
		}
		c.mu.Unlock()
	}()
	if err := c.resume(ctx, cc); err != nil {
		return err
	}
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return c.liveSender(gctx, cc) })
	g.Go(func() error { return c.commitSender(gctx, cc) })
	return g.Wait()
}

// resume asks the gateway for its cursors and lines the outbox up with them.
func (c *Client) resume(ctx context.Context, cc *conn) error {
	f, err := cc.call(ctx, protocol.MethodResume, protocol.ResumeParams{SessionID: c.cfg.SessionID, OwnerEpoch: c.cfg.OwnerEpoch})
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

func (c *Client) liveSender(ctx context.Context, cc *conn) error {
	for {
		var seq, gen, acked uint64
		var ev protocol.LiveEvent
		gone := false
		if err := c.wait(ctx, func() (bool, time.Time) {
			if c.conn != cc {
				gone = true
				return true, time.Time{}
			}
			if now := c.w.now(); now.Before(c.livePause) {
				return false, c.livePause
			}
			inflight := c.sendFrom - 1 - c.liveAcked
			if c.sendFrom > c.liveAcked+uint64(len(c.outbox)) || inflight >= uint64(c.cfg.LiveWindow) {
				return false, time.Time{}
			}
			hold, until := c.holdLocked(inflight)
			return !hold, until
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
		c.liveSent = max(c.liveSent, seq)
		c.stats.LiveSent++
		c.mu.Unlock()
		p := protocol.LiveEventParams{Scope: c.scope(protocol.StreamLive, seq), LastAckedSeq: acked, Event: ev}
		if err := cc.send(ctx, protocol.MethodLiveEvent, p, func(f protocol.Frame) { c.liveAnswer(gen, f) }); err != nil {
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
			c.livePause = c.w.now().Add(retryAfter(e))
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

func (c *Client) commitSender(ctx context.Context, cc *conn) error {
	var pause time.Time
	for {
		gone := false
		if err := c.wait(ctx, func() (bool, time.Time) {
			if c.conn != cc {
				gone = true
				return true, time.Time{}
			}
			if c.w.now().Before(pause) {
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
		f, err := cc.call(ctx, protocol.MethodTranscriptCommit, p)
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
			pause = c.w.now().Add(retryAfter(f.Error))
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

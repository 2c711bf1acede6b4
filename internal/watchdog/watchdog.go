// Package watchdog bounds the reads and writes of WebSocket connections with one sweeper and two
// time stamps per connection, instead of a timeout context (and its timer) per frame.
package watchdog

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"

	"github.com/openclaw/cloudworkers/internal/clock"
)

// Config says how long a connection's read may wait and its write may be blocked.
type Config struct {
	// ReadTimeout cuts a connection whose read has waited this long for a frame; 0: reads are
	// not bounded.
	ReadTimeout time.Duration
	// WriteTimeout cuts a connection whose write has been blocked this long (a peer that stopped
	// reading); 0: writes are not bounded.
	WriteTimeout time.Duration
	// Clock runs the deadlines; the real clock when nil.
	Clock clock.Clock
}

// TimeoutError is why the watchdog cut a connection. It is a context.DeadlineExceeded.
type TimeoutError struct {
	Op      string // "read" or "write"
	Timeout time.Duration
}

func (e *TimeoutError) Error() string {
	if e.Op == "write" {
		return fmt.Sprintf("a write blocked for %s (the peer stopped reading)", e.Timeout)
	}
	return fmt.Sprintf("nothing read for %s", e.Timeout)
}

// Unwrap makes a cut connection's error a context.DeadlineExceeded, like the per-frame timeout it
// replaces.
func (e *TimeoutError) Unwrap() error { return context.DeadlineExceeded }

// Sweeper watches connections. Run it; Watch registers a connection.
type Sweeper struct {
	cfg  Config
	base time.Time
	// every is the longest the sweeper sleeps: no deadline can appear that is closer than the
	// shortest timeout, so waking at the earliest known deadline or after every misses none.
	every time.Duration

	mu    sync.Mutex
	conns map[*Conn]struct{}
	cuts  sync.WaitGroup // connections being closed
}

// New returns a Sweeper for cfg; it cuts nothing until Run.
func New(cfg Config) *Sweeper {
	cfg.Clock = clock.Or(cfg.Clock)
	s := &Sweeper{cfg: cfg, base: cfg.Clock.Now(), conns: map[*Conn]struct{}{}}
	for _, d := range []time.Duration{cfg.ReadTimeout, cfg.WriteTimeout} {
		if d > 0 && (s.every == 0 || d < s.every) {
			s.every = d
		}
	}
	return s
}

// Run sweeps until ctx ends, then waits for the connections it is closing.
func (s *Sweeper) Run(ctx context.Context) {
	defer s.cuts.Wait()
	if s.every == 0 {
		<-ctx.Done()
		return
	}
	for {
		if clock.Sleep(ctx, s.cfg.Clock, s.sweep()) != nil {
			return
		}
	}
}

// stamp is the time on the sweeper's clock, in nanoseconds after its start, plus one: 0 is "none".
func (s *Sweeper) stamp() int64 { return int64(s.cfg.Clock.Now().Sub(s.base)) + 1 }

// sweep cuts every connection past a deadline and returns how long until the next one.
func (s *Sweeper) sweep() time.Duration {
	now := s.stamp()
	next := s.every
	s.mu.Lock()
	defer s.mu.Unlock()
	for c := range s.conns {
		left, err := c.check(now)
		if err != nil {
			delete(s.conns, c)
			c.cut(err)
			continue
		}
		if left < next {
			next = left
		}
	}
	return next
}

// check returns how long until c's earliest deadline, or why it is past one.
func (c *Conn) check(now int64) (time.Duration, error) {
	read, ok := due(c.readSince.Load(), c.s.cfg.ReadTimeout, now)
	if !ok {
		return 0, &TimeoutError{Op: "read", Timeout: c.s.cfg.ReadTimeout}
	}
	write, ok := due(c.writeSince.Load(), c.s.cfg.WriteTimeout, now)
	if !ok {
		return 0, &TimeoutError{Op: "write", Timeout: c.s.cfg.WriteTimeout}
	}
	return min(read, write), nil
}

// due returns how long an operation begun at since (0: none) has left of timeout (0: unbounded),
// false when it has none left.
func due(since int64, timeout time.Duration, now int64) (time.Duration, bool) {
	if since == 0 || timeout <= 0 {
		return time.Duration(1<<63 - 1), true
	}
	left := time.Duration(since-now) + timeout
	return left, left > 0
}

// cut records why c ends and closes it without waiting for the peer (CloseNow may wait for the
// connection's own goroutines, so it does not hold up the sweep of the others).
func (c *Conn) cut(err error) {
	c.cause.Store(&err)
	c.s.cuts.Add(1)
	go func() {
		defer c.s.cuts.Done()
		_ = c.ws.CloseNow()
	}()
}

// Conn is one watched connection. Its reads and writes go through BeginRead/EndRead and Write
// and run on a context that never ends: the sweeper, not a context, bounds them.
type Conn struct {
	s     *Sweeper
	ws    *websocket.Conn
	wlock chan struct{} // one write at a time, so the write in progress is the one timed
	// readSince and writeSince are the stamps of the read waiting and the write in progress (0: none).
	readSince, writeSince atomic.Int64
	cause                 atomic.Pointer[error]
}

// Watch registers ws; call Release when the connection ends.
func (s *Sweeper) Watch(ws *websocket.Conn) *Conn {
	c := &Conn{s: s, ws: ws, wlock: make(chan struct{}, 1)}
	s.mu.Lock()
	s.conns[c] = struct{}{}
	s.mu.Unlock()
	return c
}

// Release stops watching c.
func (c *Conn) Release() {
	c.s.mu.Lock()
	delete(c.s.conns, c)
	c.s.mu.Unlock()
}

// Background is the context of every read and write on a watched connection: it never ends, so
// the websocket library arms no timer or callback for it.
var Background = context.Background()

// BeginRead starts the read deadline: the connection is cut if EndRead does not follow within
// ReadTimeout.
func (c *Conn) BeginRead() { c.readSince.Store(c.s.stamp()) }

// EndRead stops the read deadline.
func (c *Conn) EndRead() { c.readSince.Store(0) }

// Write sends one message. Writes are serialized; ctx bounds only the wait for the writes ahead
// and is checked before the message goes out, after which the message is written whole or the
// connection is cut (by WriteTimeout, or by whoever closes it). Waiting for the writes ahead is
// bounded by WriteTimeout too: a peer that reads just often enough for each write to finish
// within it cannot make a queue of writers wait without end; the connection is cut instead.
func (c *Conn) Write(ctx context.Context, typ websocket.MessageType, p []byte) error {
	if err := c.lockWrite(ctx); err != nil {
		return err
	}
	defer func() { <-c.wlock }()
	if err := ctx.Err(); err != nil {
		return err
	}
	c.writeSince.Store(c.s.stamp())
	err := c.ws.Write(Background, typ, p)
	c.writeSince.Store(0)
	return c.Err(err)
}

// lockWrite takes the write lock. When it is not free at once, the wait is timed on the sweeper's
// clock (a timer only then, so an uncontended write arms none) and past WriteTimeout the
// connection is cut.
func (c *Conn) lockWrite(ctx context.Context) error {
	select {
	case c.wlock <- struct{}{}:
		return nil
	default:
	}
	var expired <-chan time.Time
	if d := c.s.cfg.WriteTimeout; d > 0 {
		t := c.s.cfg.Clock.NewTimer(d)
		defer t.Stop()
		expired = t.C()
	}
	select {
	case c.wlock <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-expired:
		err := error(&TimeoutError{Op: "write", Timeout: c.s.cfg.WriteTimeout})
		c.s.mu.Lock()
		if _, watched := c.s.conns[c]; watched {
			delete(c.s.conns, c)
			c.cut(err)
		}
		c.s.mu.Unlock()
		return c.Err(err)
	}
}

// Err returns err, or the watchdog's *TimeoutError when err came from the watchdog cutting the
// connection.
func (c *Conn) Err(err error) error {
	if err == nil {
		return nil
	}
	if cause := c.cause.Load(); cause != nil {
		return *cause
	}
	return err
}

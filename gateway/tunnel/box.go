package tunnel

import (
	"context"
	"net"
	"sync/atomic"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/openclaw/cloudworkers/internal/clock"
)

// KeepaliveConfig is the keepalive of a box connection that is not a tunnel (the sync and
// bootstrap connection). Zero values take the tunnel's defaults (10s, 30s).
type KeepaliveConfig struct {
	Interval time.Duration
	Timeout  time.Duration
	// Clock drives the keepalives; the real clock when nil.
	Clock clock.Clock
}

func (k KeepaliveConfig) withDefaults() KeepaliveConfig {
	if k.Interval <= 0 {
		k.Interval = 10 * time.Second
	}
	if k.Timeout <= 0 {
		k.Timeout = 30 * time.Second
	}
	if k.Clock == nil {
		k.Clock = clock.Real
	}
	return k
}

// DialBox is Dial for a connection that carries box commands and bulk transfer: it also sends
// keepalives on it, and closes it when one goes unanswered past ka.Timeout while nothing at all
// came from the box either, so that a box that stops answering fails every call on the
// connection instead of holding it. A keepalive reply queued behind a bulk upload is late, but
// the box's window adjustments show it alive. The keepalive ends with the connection.
func DialBox(ctx context.Context, t Target, timeout time.Duration, ka KeepaliveConfig) (*ssh.Client, error) {
	ka = ka.withDefaults()
	rt := &readTracker{clk: ka.Clock}
	c, err := dial(ctx, t, timeout, func(nc net.Conn) net.Conn { rt.Conn = nc; rt.touch(); return rt })
	if err != nil {
		return nil, err
	}
	kctx, cancel := context.WithCancel(context.Background())
	go func() {
		_ = c.Wait()
		cancel()
	}()
	go func() {
		_ = keepalive(kctx, ka.Clock, c, ka.Interval, ka.Timeout, func() bool { return rt.readWithin(ka.Timeout) })
	}()
	return c, nil
}

// readTracker is a connection that remembers when it last read anything.
type readTracker struct {
	net.Conn
	clk  clock.Clock
	last atomic.Int64 // unix nanoseconds of the last read of at least one byte
}

func (r *readTracker) Read(p []byte) (int, error) {
	n, err := r.Conn.Read(p)
	if n > 0 {
		r.touch()
	}
	return n, err
}

func (r *readTracker) touch() { r.last.Store(r.clk.Now().UnixNano()) }

func (r *readTracker) readWithin(d time.Duration) bool {
	return r.clk.Now().Sub(time.Unix(0, r.last.Load())) < d
}

// CloseOnDone closes c as soon as ctx ends, until stop is called: every blocking call on the
// connection (a channel open the box never answers, a read of a command that never ends) then
// returns. A caller must not use c after its ctx ended.
func CloseOnDone(ctx context.Context, c *ssh.Client) (stop func() bool) {
	return context.AfterFunc(ctx, func() { _ = c.Close() })
}

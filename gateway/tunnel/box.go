package tunnel

import (
	"context"
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
// keepalives on it, and closes it when one goes unanswered past ka.Timeout, so that a box that
// stops answering fails every call on the connection instead of holding it. The keepalive ends
// with the connection.
func DialBox(ctx context.Context, t Target, timeout time.Duration, ka KeepaliveConfig) (*ssh.Client, error) {
	c, err := Dial(ctx, t, timeout)
	if err != nil {
		return nil, err
	}
	ka = ka.withDefaults()
	kctx, cancel := context.WithCancel(context.Background())
	go func() {
		_ = c.Wait()
		cancel()
	}()
	go func() { _ = keepalive(kctx, ka.Clock, c, ka.Interval, ka.Timeout) }()
	return c, nil
}

// CloseOnDone closes c as soon as ctx ends, until stop is called: every blocking call on the
// connection (a channel open the box never answers, a read of a command that never ends) then
// returns. A caller must not use c after its ctx ended.
func CloseOnDone(ctx context.Context, c *ssh.Client) (stop func() bool) {
	return context.AfterFunc(ctx, func() { _ = c.Close() })
}

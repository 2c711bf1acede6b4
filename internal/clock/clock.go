// Package clock is the time source that components take by injection, so tests advance time
// instead of sleeping.
package clock

import (
	"context"
	"sync"
	"time"
)

// Clock tells the time and makes timers and tickers.
type Clock interface {
	Now() time.Time
	NewTimer(d time.Duration) Timer
	// NewTicker returns a ticker that sends on C every d; like time.Ticker, it drops the ticks
	// a slow reader misses. d must be positive.
	NewTicker(d time.Duration) Ticker
}

// Ticker is a periodic timer of a Clock.
type Ticker interface {
	C() <-chan time.Time
	Stop()
}

// Timer is a one-shot timer of a Clock.
type Timer interface {
	C() <-chan time.Time
	// Stop prevents the timer from firing; false when it had fired or been stopped already.
	Stop() bool
}

// Real is the system clock.
var Real Clock = realClock{}

type realClock struct{}

func (realClock) Now() time.Time                 { return time.Now() }
func (realClock) NewTimer(d time.Duration) Timer { return realTimer{time.NewTimer(d)} }
func (realClock) NewTicker(d time.Duration) Ticker {
	return realTicker{time.NewTicker(d)}
}

type realTimer struct{ t *time.Timer }

func (t realTimer) C() <-chan time.Time { return t.t.C }
func (t realTimer) Stop() bool          { return t.t.Stop() }

type realTicker struct{ t *time.Ticker }

func (t realTicker) C() <-chan time.Time { return t.t.C }
func (t realTicker) Stop()               { t.t.Stop() }

// Or returns c, or Real when c is nil: for Config fields whose zero value means the real clock.
func Or(c Clock) Clock {
	if c == nil {
		return Real
	}
	return c
}

// Sleep waits d on c, or until ctx ends, when it returns ctx's error.
func Sleep(ctx context.Context, c Clock, d time.Duration) error {
	t := Or(c).NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C():
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// AfterFunc calls f in its own goroutine once d has passed on c, unless the returned stop is
// called first; stop reports whether it prevented the call.
func AfterFunc(c Clock, d time.Duration, f func()) (stop func() bool) {
	t := Or(c).NewTimer(d)
	cancel := make(chan struct{})
	var once sync.Once
	go func() {
		select {
		case <-t.C():
			f()
		case <-cancel:
		}
	}()
	return func() bool {
		stopped := t.Stop()
		once.Do(func() { close(cancel) })
		return stopped
	}
}

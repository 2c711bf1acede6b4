package tunnel

import (
	"math/rand/v2"
	"time"
)

// Clock is the time source of keepalives and reconnect backoff; tests may substitute their own.
type Clock interface {
	NewTimer(d time.Duration) Timer
}

// Timer is a one-shot timer of a Clock.
type Timer interface {
	C() <-chan time.Time
	Stop() bool
}

type realClock struct{}

func (realClock) NewTimer(d time.Duration) Timer { return realTimer{time.NewTimer(d)} }

type realTimer struct{ t *time.Timer }

func (t realTimer) C() <-chan time.Time { return t.t.C }
func (t realTimer) Stop() bool          { return t.t.Stop() }

// backoff yields capped exponential delays with jitter: the n-th delay after a reset is drawn
// uniformly from [d/2, d] where d = min(max, min·2ⁿ).
type backoff struct {
	min, max time.Duration
	n        int
	rand     func(n int64) int64 // uniform in [0, n); rand.Int64N unless a test sets it
}

func (b *backoff) reset() { b.n = 0 }

func (b *backoff) next() time.Duration {
	d := b.min
	for i := 0; i < b.n && d < b.max; i++ {
		d *= 2
	}
	d = min(d, b.max)
	if b.n < 62 {
		b.n++
	}
	half := d / 2
	if half <= 0 {
		return d
	}
	r := b.rand
	if r == nil {
		r = rand.Int64N
	}
	return half + time.Duration(r(int64(d-half)+1))
}

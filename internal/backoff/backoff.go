// Package backoff paces retries with capped, jittered, doubling delays on an injected clock.
package backoff

import (
	"context"
	"math/rand/v2"
	"time"

	"github.com/openclaw/cloudworkers/internal/clock"
)

// Backoff yields capped exponential delays with jitter: the n-th delay after a Reset (n from 0)
// is drawn uniformly from [d/2, d] where d = min(Max, Min·2ⁿ). The zero value of Clock and Rand
// means the real clock and math/rand/v2. Not safe for concurrent use.
type Backoff struct {
	Min, Max time.Duration
	Clock    clock.Clock
	Rand     func(n int64) int64 // uniform in [0, n)
	n        int
}

// Reset makes the next delay the shortest again, after a success.
func (b *Backoff) Reset() { b.n = 0 }

// Next returns the next delay and counts it.
func (b *Backoff) Next() time.Duration {
	d := b.Min
	for i := 0; i < b.n && d < b.Max; i++ {
		d *= 2
	}
	d = min(d, b.Max)
	if b.n < 62 {
		b.n++
	}
	half := d / 2
	if half <= 0 {
		return d
	}
	r := b.Rand
	if r == nil {
		r = rand.Int64N
	}
	return half + time.Duration(r(int64(d-half)+1))
}

// Wait waits the next delay, or until ctx ends, when it returns ctx's error.
func (b *Backoff) Wait(ctx context.Context) error { return b.Sleep(ctx, b.Next()) }

// Sleep waits d (a delay Next returned, once it has been logged) on the backoff's clock.
func (b *Backoff) Sleep(ctx context.Context, d time.Duration) error {
	return clock.Sleep(ctx, b.Clock, d)
}

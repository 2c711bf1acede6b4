package clock

import (
	"context"
	"slices"
	"sync"
	"time"
)

// Manual is a Clock for tests: time stands still until Advance moves it, and WaitTimers lets a
// test wait until the code under test is waiting on the clock instead of sleeping.
type Manual struct {
	mu      sync.Mutex
	now     time.Time
	timers  []*manualTimer
	changed chan struct{} // closed and replaced whenever the set of pending timers changes
}

var _ Clock = (*Manual)(nil)

// NewManual returns a Manual clock that reads now.
func NewManual(now time.Time) *Manual {
	return &Manual{now: now, changed: make(chan struct{})}
}

// Now returns the clock's time.
func (m *Manual) Now() time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.now
}

// NewTimer returns a timer that fires once Advance has moved the clock d past now; at once when
// d <= 0.
func (m *Manual) NewTimer(d time.Duration) Timer {
	m.mu.Lock()
	defer m.mu.Unlock()
	t := &manualTimer{m: m, at: m.now.Add(d), c: make(chan time.Time, 1)}
	if d <= 0 {
		t.c <- m.now
		return t
	}
	m.timers = append(m.timers, t)
	m.signalLocked()
	return t
}

// NewTicker returns a ticker that fires each time Advance moves the clock past its next tick.
// Like time.Ticker, a tick the reader has not taken yet absorbs later ones.
func (m *Manual) NewTicker(d time.Duration) Ticker {
	if d <= 0 {
		panic("clock: non-positive ticker period")
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	t := &manualTimer{m: m, at: m.now.Add(d), period: d, c: make(chan time.Time, 1)}
	m.timers = append(m.timers, t)
	m.signalLocked()
	return manualTicker{t}
}

// Advance moves the clock forward by d and fires, in order, every timer that is then due; a
// ticker stays pending with its next tick after the new time.
func (m *Manual) Advance(d time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.now = m.now.Add(d)
	slices.SortStableFunc(m.timers, func(a, b *manualTimer) int { return a.at.Compare(b.at) })
	kept := m.timers[:0]
	fired := false
	for _, t := range m.timers {
		if t.at.After(m.now) {
			kept = append(kept, t)
			continue
		}
		fired = true
		select {
		case t.c <- m.now: // buffered: a timer fires once, a ticker drops what is not read
		default:
		}
		if t.period > 0 {
			for !t.at.After(m.now) {
				t.at = t.at.Add(t.period)
			}
			kept = append(kept, t)
		}
	}
	m.timers = kept
	if fired {
		m.signalLocked()
	}
}

// Pending returns how many timers and tickers wait to fire.
func (m *Manual) Pending() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.timers)
}

// Next returns how long until the earliest pending timer fires; false when none is pending.
func (m *Manual) Next() (time.Duration, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.timers) == 0 {
		return 0, false
	}
	at := m.timers[0].at
	for _, t := range m.timers[1:] {
		if t.at.Before(at) {
			at = t.at
		}
	}
	return at.Sub(m.now), true
}

// WaitTimers blocks until at least n timers are pending or ctx ends.
func (m *Manual) WaitTimers(ctx context.Context, n int) error {
	for {
		m.mu.Lock()
		pending, changed := len(m.timers), m.changed
		m.mu.Unlock()
		if pending >= n {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (m *Manual) signalLocked() {
	close(m.changed)
	m.changed = make(chan struct{})
}

type manualTimer struct {
	m      *Manual
	at     time.Time
	period time.Duration // > 0 for a ticker
	c      chan time.Time
}

type manualTicker struct{ t *manualTimer }

func (t manualTicker) C() <-chan time.Time { return t.t.c }
func (t manualTicker) Stop()               { t.t.Stop() }

func (t *manualTimer) C() <-chan time.Time { return t.c }

func (t *manualTimer) Stop() bool {
	t.m.mu.Lock()
	defer t.m.mu.Unlock()
	i := slices.Index(t.m.timers, t)
	if i < 0 {
		return false
	}
	t.m.timers = slices.Delete(t.m.timers, i, i+1)
	t.m.signalLocked()
	return true
}

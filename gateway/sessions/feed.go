package sessions

import (
	"errors"
	"sync"
)

// ErrLagged is the reason a subscription ends when its reader fell more than its buffer behind.
// The reader reconnects with the cursor of the last item it received.
var ErrLagged = errors.New("subscriber lagged: reconnect from the last cursor")

// ErrClosed is the reason a subscription ends when it or the store was closed.
var ErrClosed = errors.New("subscription closed")

// cursored is an item of a feed: it knows its feed-wide sequence number.
type cursored interface{ cursor() uint64 }

// feed is a bounded ring of the newest items plus a set of subscribers. Publishing never blocks: a
// subscriber whose buffer is full is dropped with ErrLagged.
type feed[T cursored] struct {
	mu        sync.Mutex
	ring      []T // circular, len <= retention
	start     int // index of the oldest item in ring
	retention int
	buffer    int    // per-subscriber headroom beyond its replay
	last      uint64 // cursor of the newest item published (or restored)
	subs      map[*Subscription[T]]struct{}
	closed    bool
}

func newFeed[T cursored](retention, buffer int, last uint64) *feed[T] {
	return &feed[T]{retention: retention, buffer: buffer, last: last, subs: map[*Subscription[T]]struct{}{}}
}

// Subscription receives the items of a feed after a cursor, in order, each once.
type Subscription[T any] struct {
	ch chan T
	// Missed is how many items after the requested cursor were no longer retained when subscribing.
	Missed uint64
	mu     sync.Mutex
	err    error
	detach func(*Subscription[T])
}

// C delivers items. It is closed when the subscription ends; Err then says why.
func (s *Subscription[T]) C() <-chan T { return s.ch }

// Err is nil while the subscription is live, then ErrLagged or ErrClosed.
func (s *Subscription[T]) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// Close ends the subscription; it is safe to call more than once.
func (s *Subscription[T]) Close() { s.detach(s) }

// end records the reason and closes the channel; the feed's lock is held.
func (s *Subscription[T]) end(err error) {
	s.mu.Lock()
	s.err = err
	s.mu.Unlock()
	close(s.ch)
}

// publish appends item (whose cursor must be last+1) and hands it to every subscriber without blocking.
func (f *feed[T]) publish(item T) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.publishLocked(item)
}

// publishNext publishes the item mk builds for the next cursor.
func (f *feed[T]) publishNext(mk func(cursor uint64) T) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.publishLocked(mk(f.last + 1))
}

func (f *feed[T]) publishLocked(item T) {
	f.last = item.cursor()
	if len(f.ring) < f.retention {
		f.ring = append(f.ring, item)
	} else {
		f.ring[f.start] = item
		f.start = (f.start + 1) % len(f.ring)
	}
	for s := range f.subs {
		select {
		case s.ch <- item:
		default:
			delete(f.subs, s)
			s.end(ErrLagged)
		}
	}
}

// subscribe returns a subscription that first replays the retained items after from, then follows.
func (f *feed[T]) subscribe(from uint64) *Subscription[T] {
	f.mu.Lock()
	defer f.mu.Unlock()
	var replay []T
	for i := range f.ring {
		it := f.ring[(f.start+i)%len(f.ring)]
		if it.cursor() > from {
			replay = append(replay, it)
		}
	}
	s := &Subscription[T]{ch: make(chan T, len(replay)+f.buffer), detach: f.unsubscribe}
	if f.last > from {
		s.Missed = f.last - from - uint64(len(replay))
	}
	for _, it := range replay {
		s.ch <- it
	}
	if f.closed {
		s.end(ErrClosed)
		return s
	}
	f.subs[s] = struct{}{}
	return s
}

func (f *feed[T]) unsubscribe(s *Subscription[T]) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.subs[s]; ok {
		delete(f.subs, s)
		s.end(ErrClosed)
	}
}

// close ends every subscription; later subscriptions end at once after their replay.
func (f *feed[T]) close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closed = true
	for s := range f.subs {
		delete(f.subs, s)
		s.end(ErrClosed)
	}
}

func (f *feed[T]) lastCursor() uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.last
}

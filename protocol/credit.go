package protocol

import (
	"context"
	"errors"
	"fmt"
	"sync"
)

// ErrWindowClosed is returned by CreditWindow.Wait after Close.
var ErrWindowClosed = errors.New("credit window closed")

// CreditWindow is the sender's side of per-stream flow control. Credit is a cumulative byte offset,
// like QUIC's MAX_STREAM_DATA: the receiver grants "you may send up to offset N", never "N more
// bytes", so a duplicated, stale or reordered grant is harmless (Grant only ever raises the limit).
// The zero value has no credit; it is safe for concurrent use.
type CreditWindow struct {
	mu       sync.Mutex
	limit    uint64 // highest offset granted
	consumed uint64 // offset sent so far
	closed   bool
	changed  chan struct{} // closed and replaced when limit grows or the window closes
}

// NewCreditWindow returns a window with an initial grant of limit bytes.
func NewCreditWindow(limit uint64) *CreditWindow { return &CreditWindow{limit: limit} }

// Grant raises the limit to limit and reports whether it grew. A grant at or below the current
// limit (a duplicate or a late, reordered one) changes nothing.
func (w *CreditWindow) Grant(limit uint64) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if limit <= w.limit {
		return false
	}
	w.limit = limit
	w.notifyLocked()
	return true
}

// Consume takes n bytes of credit if available, without waiting.
func (w *CreditWindow) Consume(n uint64) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.consumeLocked(n)
}

func (w *CreditWindow) consumeLocked(n uint64) bool {
	if w.closed || n > w.limit-w.consumed {
		return false
	}
	w.consumed += n
	return true
}

// TryTake takes n bytes of credit if they are there, without waiting.
func (w *CreditWindow) TryTake(n uint64) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.consumeLocked(n)
}

// Wait takes n bytes of credit, waiting for grants until ctx ends or the window closes. n larger
// than any window the receiver will grant waits forever; callers split their writes.
func (w *CreditWindow) Wait(ctx context.Context, n uint64) error {
	for {
		w.mu.Lock()
		if w.consumeLocked(n) {
			w.mu.Unlock()
			return nil
		}
		if w.closed {
			w.mu.Unlock()
			return ErrWindowClosed
		}
		if w.changed == nil {
			w.changed = make(chan struct{})
		}
		ch := w.changed
		w.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("wait for %d bytes of credit: %w", n, ctx.Err())
		}
	}
}

// Available is the credit left: limit minus consumed.
func (w *CreditWindow) Available() uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.limit - w.consumed
}

// Offsets returns the bytes consumed and the limit granted so far.
func (w *CreditWindow) Offsets() (consumed, limit uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.consumed, w.limit
}

// Close wakes every waiter with ErrWindowClosed; later calls consume nothing. It is idempotent.
func (w *CreditWindow) Close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.closed {
		w.closed = true
		w.notifyLocked()
	}
}

func (w *CreditWindow) notifyLocked() {
	if w.changed != nil {
		close(w.changed)
		w.changed = nil
	}
}

// ReceiveWindow is the receiver's side: it accounts bytes received against the limit it granted and
// says when to send a new grant (once half the window has been consumed by the application).
type ReceiveWindow struct {
	mu       sync.Mutex
	size     uint64 // window size: how far past the consumed offset the receiver grants
	received uint64
	consumed uint64
	granted  uint64
}

// ErrFlowControl is a peer that sent past the credit it was granted.
var ErrFlowControl = errors.New("flow control violation: data beyond the granted offset")

// NewReceiveWindow returns a receive window of size bytes; its initial grant is size.
func NewReceiveWindow(size uint64) *ReceiveWindow {
	return &ReceiveWindow{size: size, granted: size}
}

// Limit is the offset granted so far (the first grant is the window size).
func (r *ReceiveWindow) Limit() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.granted
}

// Receive accounts n bytes that arrived; beyond the granted limit it is ErrFlowControl.
func (r *ReceiveWindow) Receive(n uint64) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if n > r.granted-r.received {
		return fmt.Errorf("%w: %d bytes at offset %d, limit %d", ErrFlowControl, n, r.received, r.granted)
	}
	r.received += n
	return nil
}

// Release marks n received bytes as consumed by the application. When the remaining credit falls
// below half the window it returns the new limit to grant (ok true); the caller sends it as is.
func (r *ReceiveWindow) Release(n uint64) (limit uint64, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.consumed = min(r.consumed+n, r.received)
	if r.granted-r.consumed >= r.size/2 {
		return 0, false
	}
	r.granted = r.consumed + r.size
	return r.granted, true
}

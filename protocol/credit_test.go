package protocol

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

func TestCreditWindowGrantsAreCumulative(t *testing.T) {
	w := NewCreditWindow(10)
	if !w.Consume(6) || w.Consume(5) || !w.Consume(4) || w.Consume(1) {
		t.Fatal("consume did not respect the initial limit")
	}
	for _, tc := range []struct {
		grant uint64
		grew  bool
		avail uint64
	}{
		{20, true, 10},
		{20, false, 10}, // duplicate
		{15, false, 10}, // stale, arrives reordered after 20
		{12, false, 10},
		{30, true, 20},
	} {
		if got := w.Grant(tc.grant); got != tc.grew {
			t.Fatalf("Grant(%d) = %v, want %v", tc.grant, got, tc.grew)
		}
		if got := w.Available(); got != tc.avail {
			t.Fatalf("after Grant(%d): available %d, want %d", tc.grant, got, tc.avail)
		}
	}
	if c, l := w.Offsets(); c != 10 || l != 30 {
		t.Fatalf("offsets %d/%d", c, l)
	}
}

func TestCreditWindowWait(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	w := NewCreditWindow(0)
	done := make(chan error, 1)
	go func() { done <- w.Wait(ctx, 8) }()
	w.Grant(4) // not enough
	select {
	case err := <-done:
		t.Fatalf("Wait returned %v with 4 of 8 bytes granted", err)
	default:
	}
	w.Grant(8)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if w.Available() != 0 {
		t.Fatalf("available %d after consuming the grant", w.Available())
	}

	short, cancelShort := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancelShort()
	if err := w.Wait(short, 1); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait without credit = %v, want deadline", err)
	}

	go func() { done <- w.Wait(ctx, 1) }()
	w.Close()
	w.Close()
	if err := <-done; !errors.Is(err, ErrWindowClosed) {
		t.Fatalf("Wait after Close = %v", err)
	}
	if w.Consume(0) {
		t.Fatal("closed window consumed")
	}
}

// Many senders share a window while grants arrive duplicated and out of order: exactly the granted
// bytes are consumed, never more.
func TestCreditWindowConcurrentReorderedGrants(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	w := NewCreditWindow(0)
	const senders, each = 8, 100
	var wg sync.WaitGroup
	for range senders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range each {
				if err := w.Wait(ctx, 1); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	for limit := uint64(10); limit <= senders*each; limit += 10 {
		w.Grant(limit)
		w.Grant(limit - 5) // stale
		w.Grant(limit)     // duplicate
	}
	wg.Wait()
	if c, l := w.Offsets(); c != senders*each || l != senders*each {
		t.Fatalf("consumed %d of limit %d", c, l)
	}
}

func TestReceiveWindow(t *testing.T) {
	r := NewReceiveWindow(100)
	if r.Limit() != 100 {
		t.Fatalf("initial limit %d", r.Limit())
	}
	if err := r.Receive(60); err != nil {
		t.Fatal(err)
	}
	if _, ok := r.Release(40); ok {
		t.Fatal("granted with 60 of 100 bytes of credit left")
	}
	limit, ok := r.Release(20)
	if !ok || limit != 160 {
		t.Fatalf("Release = %d %v, want 160 true", limit, ok)
	}
	if err := r.Receive(100); err != nil {
		t.Fatal(err)
	}
	if err := r.Receive(1); !errors.Is(err, ErrFlowControl) {
		t.Fatalf("receive past the limit = %v", err)
	}
	// The sender's window, fed the grants, never lets it overrun the receiver.
	w := NewCreditWindow(r.Limit())
	w.Grant(limit)
	if c, l := w.Offsets(); c != 0 || l != 160 {
		t.Fatalf("sender offsets %d/%d", c, l)
	}
}

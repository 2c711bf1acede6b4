package backoff

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/openclaw/cloudworkers/internal/clock"
)

func TestNextDoublesToTheCapWithJitterAndResets(t *testing.T) {
	tests := []struct {
		name string
		rand func(int64) int64
		want []time.Duration
	}{
		{"lowest jitter", func(int64) int64 { return 0 },
			[]time.Duration{50, 100, 200, 400, 500, 500}},
		{"highest jitter", func(n int64) int64 { return n - 1 },
			[]time.Duration{100, 200, 400, 800, 1000, 1000}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := Backoff{Min: 100 * time.Millisecond, Max: time.Second, Rand: tt.rand}
			for i, w := range tt.want {
				if got := b.Next(); got != w*time.Millisecond {
					t.Fatalf("delay %d = %v, want %v", i, got, w*time.Millisecond)
				}
			}
			b.Reset()
			if got := b.Next(); got != tt.want[0]*time.Millisecond {
				t.Fatalf("after reset = %v, want %v", got, tt.want[0]*time.Millisecond)
			}
		})
	}
}

func TestNextStaysWithinBoundsWithRealJitter(t *testing.T) {
	b := Backoff{Min: time.Millisecond, Max: 30 * time.Second}
	for i := range 200 {
		if d := b.Next(); d <= 0 || d > 30*time.Second {
			t.Fatalf("delay %d = %v, out of (0, 30s]", i, d)
		}
	}
	// deep in the sequence the delay is at the cap: within [Max/2, Max]
	if d := b.Next(); d < 15*time.Second {
		t.Fatalf("capped delay %v below Max/2", d)
	}
}

func TestWaitRunsOnTheInjectedClock(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := clock.NewManual(time.Unix(0, 0))
	b := Backoff{Min: time.Minute, Max: time.Hour, Clock: c, Rand: func(n int64) int64 { return n - 1 }}
	done := make(chan error, 1)
	go func() { done <- b.Wait(ctx) }()
	if err := c.WaitTimers(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if d, _ := c.Next(); d != time.Minute {
		t.Fatalf("first wait = %v, want 1m", d)
	}
	c.Advance(time.Minute - time.Nanosecond)
	select {
	case err := <-done:
		t.Fatalf("Wait returned (%v) before its delay", err)
	default:
	}
	c.Advance(time.Nanosecond)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	go func() { done <- b.Wait(ctx) }()
	if err := c.WaitTimers(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if d, _ := c.Next(); d != 2*time.Minute {
		t.Fatalf("second wait = %v, want 2m", d)
	}
	c.Advance(2 * time.Minute)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestWaitEndsWithContext(t *testing.T) {
	c := clock.NewManual(time.Unix(0, 0))
	b := Backoff{Min: time.Hour, Max: time.Hour, Clock: c}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- b.Wait(ctx) }()
	if err := c.WaitTimers(context.Background(), 1); err != nil {
		t.Fatal(err)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Wait after cancel = %v, want context.Canceled", err)
	}
	if n := c.Pending(); n != 0 {
		t.Fatalf("%d timers left pending after Wait returned", n)
	}
}

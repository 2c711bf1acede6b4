package tunnel

import (
	"testing"
	"time"
)

func TestBackoff(t *testing.T) {
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
			b := backoff{min: 100 * time.Millisecond, max: time.Second, rand: tt.rand}
			for i, w := range tt.want {
				if got := b.next(); got != w*time.Millisecond {
					t.Fatalf("delay %d = %v, want %v", i, got, w*time.Millisecond)
				}
			}
			b.reset()
			if got := b.next(); got != tt.want[0]*time.Millisecond {
				t.Fatalf("after reset = %v, want %v", got, tt.want[0]*time.Millisecond)
			}
		})
	}
	real := backoff{min: time.Millisecond, max: 30 * time.Second}
	for range 100 {
		if d := real.next(); d <= 0 || d > 30*time.Second {
			t.Fatalf("delay %v out of bounds", d)
		}
	}
}

func TestStatusMoves(t *testing.T) {
	for _, tt := range []struct {
		from, to Status
		ok       bool
	}{
		{StatusConnecting, StatusConnected, true},
		{StatusConnected, StatusReconnecting, true},
		{StatusReconnecting, StatusConnected, true},
		{StatusConnected, StatusStopped, true},
		{StatusStopped, StatusConnecting, false},
		{StatusStopped, StatusConnected, false},
		{StatusConnecting, StatusReconnecting, false},
	} {
		if got := tt.from.canMoveTo(tt.to); got != tt.ok {
			t.Errorf("%s -> %s allowed = %v, want %v", tt.from, tt.to, got, tt.ok)
		}
	}
}

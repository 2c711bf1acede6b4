package clock

import (
	"context"
	"testing"
	"time"
)

func fired(tm Timer) bool {
	select {
	case <-tm.C():
		return true
	default:
		return false
	}
}

func TestManualFiresTimersWhenAdvancedPastThem(t *testing.T) {
	start := time.Unix(1000, 0)
	c := NewManual(start)
	late, early := c.NewTimer(2*time.Second), c.NewTimer(time.Second)
	c.Advance(999 * time.Millisecond)
	if fired(early) || fired(late) {
		t.Fatal("a timer fired before its time")
	}
	c.Advance(time.Millisecond)
	if !fired(early) || fired(late) {
		t.Fatal("after 1s: want only the 1s timer fired")
	}
	c.Advance(5 * time.Second)
	if !fired(late) {
		t.Fatal("2s timer not fired after 6s")
	}
	if got := c.Now(); !got.Equal(start.Add(6 * time.Second)) {
		t.Fatalf("Now = %v, want start+6s", got)
	}
	if c.Pending() != 0 {
		t.Fatalf("pending = %d after all fired", c.Pending())
	}
}

func TestManualStop(t *testing.T) {
	c := NewManual(time.Unix(0, 0))
	tm := c.NewTimer(time.Second)
	if !tm.Stop() {
		t.Fatal("Stop of a pending timer = false")
	}
	if tm.Stop() {
		t.Fatal("second Stop = true")
	}
	c.Advance(time.Hour)
	if fired(tm) {
		t.Fatal("stopped timer fired")
	}
	if now := c.NewTimer(0); !fired(now) {
		t.Fatal("zero-duration timer did not fire at once")
	}
}

func TestManualWaitTimers(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := NewManual(time.Unix(0, 0))
	done := make(chan error, 1)
	go func() { done <- Sleep(ctx, c, time.Minute) }()
	if err := c.WaitTimers(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if d, ok := c.Next(); !ok || d != time.Minute {
		t.Fatalf("Next = %v %v, want 1m", d, ok)
	}
	c.Advance(time.Minute)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	short, stop := context.WithCancel(ctx)
	stop()
	if err := c.WaitTimers(short, 1); err == nil {
		t.Fatal("WaitTimers with no timer and an ended context returned nil")
	}
}

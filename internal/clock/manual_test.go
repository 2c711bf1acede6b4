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

func TestManualTickerTicksEachPeriodAndDropsUnreadTicks(t *testing.T) {
	c := NewManual(time.Unix(0, 0))
	tk := c.NewTicker(time.Second)
	c.Advance(999 * time.Millisecond)
	select {
	case <-tk.C():
		t.Fatal("ticked before its period")
	default:
	}
	c.Advance(time.Millisecond)
	if got := <-tk.C(); !got.Equal(time.Unix(1, 0)) {
		t.Fatalf("first tick at %v, want 1s", got)
	}
	c.Advance(5 * time.Second) // five periods, one unread tick kept
	<-tk.C()
	select {
	case <-tk.C():
		t.Fatal("a ticker kept more than one unread tick")
	default:
	}
	if c.Pending() != 1 {
		t.Fatalf("pending = %d, want the ticker still pending", c.Pending())
	}
	c.Advance(time.Second)
	<-tk.C()
	tk.Stop()
	c.Advance(time.Hour)
	select {
	case <-tk.C():
		t.Fatal("a stopped ticker ticked")
	default:
	}
	if c.Pending() != 0 {
		t.Fatalf("pending = %d after Stop", c.Pending())
	}
}

func TestAfterFuncRunsOnceUnlessStopped(t *testing.T) {
	c := NewManual(time.Unix(0, 0))
	ran := make(chan struct{}, 2)
	AfterFunc(c, time.Second, func() { ran <- struct{}{} })
	stop := AfterFunc(c, time.Second, func() { ran <- struct{}{} })
	if err := c.WaitTimers(context.Background(), 2); err != nil {
		t.Fatal(err)
	}
	if !stop() {
		t.Fatal("stop of a pending AfterFunc = false")
	}
	c.Advance(time.Second)
	<-ran
	select {
	case <-ran:
		t.Fatal("a stopped AfterFunc ran")
	case <-time.After(50 * time.Millisecond): // the stopped one would already have been sent
	}
}

package watchdog_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/openclaw/cloudworkers/internal/clock"
	"github.com/openclaw/cloudworkers/internal/watchdog"
)

// run starts a sweeper on a manual clock and stops it when the test ends.
func run(t *testing.T, cfg watchdog.Config) (*watchdog.Sweeper, *clock.Manual) {
	t.Helper()
	clk := clock.NewManual(time.Unix(0, 0))
	cfg.Clock = clk
	s := watchdog.New(cfg)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return s, clk
}

// advanceUntil advances clk by step, each time the sweeper waits on it, until stop reports true;
// it returns the time advanced.
func advanceUntil(t *testing.T, clk *clock.Manual, step time.Duration, stop func() bool) time.Duration {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var total time.Duration
	for !stop() {
		if err := clk.WaitTimers(ctx, 1); err != nil {
			t.Fatal("the sweeper stopped waiting on its clock:", err)
		}
		clk.Advance(step)
		total += step
	}
	return total
}

// A write to a peer that stopped reading is cut once it has been blocked for WriteTimeout on the
// sweeper's clock, and returns a *TimeoutError that is a context.DeadlineExceeded.
func TestBlockedWriteIsCut(t *testing.T) {
	s, clk := run(t, watchdog.Config{WriteTimeout: 10 * time.Second})
	c := s.Watch(watchdog.IdlePeer(t))
	defer c.Release()
	written := make(chan error, 1)
	go func() {
		written <- c.Write(context.Background(), websocket.MessageBinary, []byte(strings.Repeat("x", 8<<20)))
	}()
	var err error
	waited := advanceUntil(t, clk, time.Second, func() bool {
		select {
		case err = <-written:
			return true
		default:
			return false
		}
	})
	var te *watchdog.TimeoutError
	if !errors.As(err, &te) || te.Op != "write" || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("blocked write returned %v, want the watchdog's write timeout", err)
	}
	if waited < 10*time.Second {
		t.Fatalf("write cut after %v, before the write timeout", waited)
	}
	if err := c.Write(context.Background(), websocket.MessageText, []byte("x")); !errors.As(err, &te) {
		t.Fatalf("write after the cut returned %v, want the cut's cause", err)
	}
}

// A read that waits for a frame that never comes is cut after ReadTimeout; no read in progress
// (between EndRead and BeginRead) is never cut.
func TestSilentReadIsCut(t *testing.T) {
	s, clk := run(t, watchdog.Config{ReadTimeout: 30 * time.Second, WriteTimeout: 10 * time.Second})
	ws := watchdog.IdlePeer(t)
	c := s.Watch(ws)
	defer c.Release()
	// Not reading: however long the clock runs, nothing is cut.
	advanceUntil(t, clk, 10*time.Second, func() bool { return clk.Now().Sub(time.Unix(0, 0)) >= time.Minute })
	c.BeginRead()
	read := make(chan error, 1)
	go func() {
		_, _, err := ws.Read(watchdog.Background)
		c.EndRead()
		read <- c.Err(err)
	}()
	var err error
	waited := advanceUntil(t, clk, time.Second, func() bool {
		select {
		case err = <-read:
			return true
		default:
			return false
		}
	})
	var te *watchdog.TimeoutError
	if !errors.As(err, &te) || te.Op != "read" {
		t.Fatalf("silent read returned %v, want the watchdog's read timeout", err)
	}
	if waited < 30*time.Second {
		t.Fatalf("read cut after %v, before the read timeout", waited)
	}
}

// Write honours ctx while it waits for the write ahead, and sends nothing once ctx has ended.
func TestWriteHonoursContextBeforeSending(t *testing.T) {
	s, _ := run(t, watchdog.Config{WriteTimeout: 10 * time.Second})
	c := s.Watch(watchdog.IdlePeer(t))
	defer c.Release()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := c.Write(ctx, websocket.MessageText, []byte("x")); !errors.Is(err, context.Canceled) {
		t.Fatalf("write on an ended context returned %v, want context.Canceled", err)
	}
	if err := c.Write(context.Background(), websocket.MessageText, []byte("x")); err != nil {
		t.Fatalf("write after a refused one: %v", err)
	}
}

package watchdog

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/openclaw/cloudworkers/internal/clock"
)

// IdlePeer is idlePeer for the package's external tests.
var IdlePeer = idlePeer

// idlePeer returns a client connection to a loopback server whose side does nothing: it neither
// reads nor writes until the test ends.
func idlePeer(t *testing.T) *websocket.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	held := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ws, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer ws.CloseNow()
		<-held
	}))
	t.Cleanup(func() {
		close(held)
		srv.Close()
	})
	c, _, err := websocket.Dial(ctx, srv.URL, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.CloseNow() })
	return c
}

// A writer queued behind a write that does not finish is bounded by WriteTimeout too: a peer
// that reads just often enough for each write to end within the timeout cannot make the writes
// queued behind it wait without end. Past the bound the connection is cut.
func TestWaitingForTheWritesAheadIsBounded(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ws := idlePeer(t)

	clk := clock.NewManual(time.Unix(0, 0))
	s := New(Config{WriteTimeout: 10 * time.Second, Clock: clk}) // not run: only the queued writer's bound acts
	c := s.Watch(ws)
	defer c.Release()
	c.wlock <- struct{}{} // a write ahead that does not finish

	done := make(chan error, 1)
	go func() { done <- c.Write(ctx, websocket.MessageText, []byte("queued")) }()
	if err := clk.WaitTimers(ctx, 1); err != nil {
		t.Fatal("the queued write armed no timer:", err)
	}
	clk.Advance(10*time.Second - time.Millisecond)
	select {
	case err := <-done:
		t.Fatalf("the queued write ended before its bound: %v", err)
	default:
	}
	clk.Advance(time.Millisecond)
	var werr error
	select {
	case werr = <-done:
	case <-ctx.Done():
		t.Fatal("the queued write was not cut at WriteTimeout")
	}
	var te *TimeoutError
	if !errors.As(werr, &te) || te.Op != "write" || !errors.Is(werr, context.DeadlineExceeded) {
		t.Fatalf("queued write = %v, want a write TimeoutError", werr)
	}
	s.cuts.Wait()
	if err := ws.Ping(ctx); err == nil {
		t.Fatal("the connection is still open after the queued write was cut")
	}
}

// An uncontended write arms no timer.
func TestAFreeWriteArmsNoTimer(t *testing.T) {
	clk := clock.NewManual(time.Unix(0, 0))
	s := New(Config{WriteTimeout: 10 * time.Second, Clock: clk})
	c := &Conn{s: s, wlock: make(chan struct{}, 1)}
	if err := c.lockWrite(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := clk.Pending(); n != 0 {
		t.Fatalf("%d timers armed by a write whose lock was free", n)
	}
}

package watchdog_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/openclaw/cloudworkers/internal/watchdog"
)

// sink returns a client connection to a loopback server that reads and drops every message.
func sink(b *testing.B) *websocket.Conn {
	b.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ws, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer ws.CloseNow()
		for {
			if _, _, err := ws.Read(context.Background()); err != nil {
				return
			}
		}
	}))
	b.Cleanup(srv.Close)
	c, _, err := websocket.Dial(context.Background(), srv.URL, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.CloseNow() })
	return c
}

// frame is about the size of one token's worker.inference.event frame.
var frame = make([]byte, 200)

// BenchmarkWriteTimeoutPerFrame is what the hub and the worker did before the watchdog: a timeout
// context per frame, which coder/websocket also arms an AfterFunc for.
func BenchmarkWriteTimeoutPerFrame(b *testing.B) {
	c := sink(b)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	b.ReportAllocs()
	for b.Loop() {
		wctx, stop := context.WithTimeout(ctx, 10*time.Second)
		if err := c.Write(wctx, websocket.MessageText, frame); err != nil {
			b.Fatal(err)
		}
		stop()
	}
}

// BenchmarkWriteWatched is the same write through a watched connection.
func BenchmarkWriteWatched(b *testing.B) {
	s := watchdog.New(watchdog.Config{ReadTimeout: 30 * time.Second, WriteTimeout: 10 * time.Second})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go s.Run(ctx)
	c := s.Watch(sink(b))
	defer c.Release()
	b.ReportAllocs()
	for b.Loop() {
		if err := c.Write(ctx, websocket.MessageText, frame); err != nil {
			b.Fatal(err)
		}
	}
}

package remote_test

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/openclaw/cloudworkers/internal/clock"
	"github.com/openclaw/cloudworkers/protocol"
	"github.com/openclaw/cloudworkers/worker/remote"
)

// gateway is a scripted gateway on a unix socket: every connection's connect request goes to
// admit, and every admitted connection to the test through conns.
type gateway struct {
	sock     string
	attempts chan protocol.ConnectParams // every connect request, admitted or not
	conns    chan *gwConn
	admit    func(n int) *protocol.Error // nil admits attempt n (from 1)
}

type gwConn struct {
	ws     *websocket.Conn
	frames chan protocol.Frame // what the worker sent after admission
	end    chan error          // the read error that ended the connection (its close status)
}

func newGateway(t *testing.T, admit func(n int) *protocol.Error) *gateway {
	t.Helper()
	g := &gateway{sock: filepath.Join(t.TempDir(), "w.sock"), attempts: make(chan protocol.ConnectParams, 16),
		conns: make(chan *gwConn, 16), admit: admit}
	ln, err := net.Listen("unix", g.sock)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ws, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer ws.CloseNow()
		_, b, err := ws.Read(r.Context())
		if err != nil {
			return
		}
		f, err := protocol.Decode(b, protocol.DefaultFrameLimit)
		if err != nil {
			return
		}
		var p protocol.ConnectParams
		if err := protocol.DecodeParams(f.Params, &p); err != nil {
			return
		}
		n++
		g.attempts <- p
		if e := g.admit(n); e != nil {
			write(r.Context(), ws, protocol.ErrorResponse(f.ID, e))
			return
		}
		res, _ := protocol.Response(f.ID, protocol.ConnectResult{EnvironmentID: p.Admission.EnvironmentID, HeartbeatIntervalMs: 60_000})
		write(r.Context(), ws, res)
		c := &gwConn{ws: ws, frames: make(chan protocol.Frame, 16), end: make(chan error, 1)}
		g.conns <- c
		for {
			_, b, err := ws.Read(r.Context())
			if err != nil {
				c.end <- err
				return
			}
			if f, err := protocol.Decode(b, protocol.DefaultFrameLimit); err == nil {
				c.frames <- f
			}
		}
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return g
}

func write(ctx context.Context, ws *websocket.Conn, f protocol.Frame) {
	b, _ := json.Marshal(f)
	_ = ws.Write(ctx, websocket.MessageText, b)
}

func recv[T any](t *testing.T, ctx context.Context, what string, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-ctx.Done():
		t.Fatalf("waiting for %s: %v", what, ctx.Err())
		panic("unreachable")
	}
}

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// run starts remote.Run against g on clk and returns its result.
func run(t *testing.T, ctx context.Context, g *gateway, clk clock.Clock, handler func(context.Context, string, json.RawMessage) (any, *protocol.Error)) <-chan error {
	t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	done, finished := make(chan error, 1), make(chan struct{})
	go func() {
		defer close(finished)
		done <- remote.Run(ctx, remote.Config{SocketPath: g.sock, EnvironmentID: "env_1", Credential: "cred", BundleHash: "h",
			BackoffMin: time.Second, BackoffMax: time.Second, Clock: clk, Handler: handler})
	}()
	t.Cleanup(func() {
		cancel()
		<-finished
	})
	return done
}

// A refused admission that may succeed later is retried after the backoff, on the worker's clock:
// not before the clock moves, and at once after. A worker.shutdown event ends Run cleanly.
func TestRunRetriesAdmissionAfterBackoffOnItsClock(t *testing.T) {
	ctx := testContext(t)
	g := newGateway(t, func(n int) *protocol.Error {
		if n == 1 {
			return protocol.Errorf(protocol.CodeCapacityExceeded, "full")
		}
		return nil
	})
	clk := clock.NewManual(time.Unix(0, 0))
	done := run(t, ctx, g, clk, nil)
	recv(t, ctx, "the first attempt", g.attempts)
	if err := clk.WaitTimers(ctx, 1); err != nil {
		t.Fatal("the worker never waited on its clock after a refusal:", err)
	}
	select {
	case <-g.attempts:
		t.Fatal("the worker reconnected before its backoff elapsed")
	default:
	}
	d, _ := clk.Next()
	if d < 500*time.Millisecond || d > time.Second {
		t.Fatalf("backoff %v, want within [BackoffMin/2, BackoffMax]", d)
	}
	clk.Advance(d)
	recv(t, ctx, "the second attempt", g.attempts)
	c := recv(t, ctx, "the admitted connection", g.conns)
	ev, _ := protocol.NewEvent(protocol.MethodShutdown, 0, protocol.ShutdownPayload{})
	write(ctx, c.ws, ev)
	if err := recv(t, ctx, "Run to return", done); err != nil {
		t.Fatalf("Run after worker.shutdown = %v, want nil", err)
	}
	wantShutdownClose(t, ctx, c)
}

// A permanently refused admission ends Run with the refusal, without a second attempt.
func TestRunStopsOnPermanentRefusal(t *testing.T) {
	ctx := testContext(t)
	g := newGateway(t, func(int) *protocol.Error { return protocol.Errorf(protocol.CodeBundleMismatch, "not this binary") })
	done := run(t, ctx, g, clock.NewManual(time.Unix(0, 0)), nil)
	err := recv(t, ctx, "Run to return", done)
	var ae *remote.AdmissionError
	if !errors.As(err, &ae) || ae.Err.Code != protocol.CodeBundleMismatch || !ae.Permanent() {
		t.Fatalf("Run = %v, want a permanent bundle-mismatch AdmissionError", err)
	}
	recv(t, ctx, "the attempt", g.attempts)
	select {
	case <-g.attempts:
		t.Fatal("the worker tried again after a permanent refusal")
	default:
	}
}

// The admitted connection heartbeats on the worker's clock, serves the gateway's requests through
// Handler, refuses methods outside the gateway's set, and answers a worker.shutdown request before
// Run returns nil.
func TestRunHeartbeatsAndServesOnItsConnection(t *testing.T) {
	ctx := testContext(t)
	g := newGateway(t, func(int) *protocol.Error { return nil })
	clk := clock.NewManual(time.Unix(0, 0))
	served := make(chan string, 4)
	done := run(t, ctx, g, clk, func(_ context.Context, method string, _ json.RawMessage) (any, *protocol.Error) {
		served <- method
		return protocol.TurnStartResult{Accepted: true}, nil
	})
	c := recv(t, ctx, "the admitted connection", g.conns)
	if err := clk.WaitTimers(ctx, 1); err != nil {
		t.Fatal("no heartbeat timer on the worker's clock:", err)
	}
	clk.Advance(time.Minute)
	if f := recv(t, ctx, "a heartbeat", c.frames); f.Type != protocol.TypeReq || f.Method != protocol.MethodHeartbeat {
		t.Fatalf("after one interval the worker sent %+v, want a heartbeat", f)
	}

	start, _ := protocol.Request("g1", protocol.MethodTurnStart, map[string]any{})
	write(ctx, c.ws, start)
	if f := recv(t, ctx, "the turn.start answer", c.frames); f.ID != "g1" || !f.OK {
		t.Fatalf("turn.start answered %+v", f)
	}
	if m := recv(t, ctx, "the handler", served); m != protocol.MethodTurnStart {
		t.Fatalf("handler saw %q", m)
	}
	other, _ := protocol.Request("g2", protocol.MethodHeartbeat, nil)
	write(ctx, c.ws, other)
	if f := recv(t, ctx, "the refusal", c.frames); f.ID != "g2" || f.OK || f.Error.Code != protocol.CodeMethodNotAllowed {
		t.Fatalf("a worker method sent by the gateway was answered %+v, want method-not-allowed", f)
	}

	shutdown, _ := protocol.Request("g3", protocol.MethodShutdown, protocol.ShutdownPayload{})
	write(ctx, c.ws, shutdown)
	if f := recv(t, ctx, "the shutdown answer", c.frames); f.ID != "g3" || !f.OK {
		t.Fatalf("shutdown answered %+v", f)
	}
	if err := recv(t, ctx, "Run to return", done); err != nil {
		t.Fatalf("Run after a worker.shutdown request = %v, want nil", err)
	}
	wantShutdownClose(t, ctx, c)
}

// wantShutdownClose checks that the worker ended c with a normal closure saying "shutdown", so
// the gateway does not take a shutdown it asked for for a lost worker.
func wantShutdownClose(t *testing.T, ctx context.Context, c *gwConn) {
	t.Helper()
	err := recv(t, ctx, "the end of the connection", c.end)
	var ce websocket.CloseError
	if !errors.As(err, &ce) || ce.Code != websocket.StatusNormalClosure || ce.Reason != "shutdown" {
		t.Fatalf("after worker.shutdown the connection ended with %v, want a normal closure \"shutdown\"", err)
	}
}

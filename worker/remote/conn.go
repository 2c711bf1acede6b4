package remote

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/coder/websocket"
	"golang.org/x/sync/errgroup"

	"github.com/openclaw/cloudworkers/internal/clock"
	"github.com/openclaw/cloudworkers/internal/watchdog"
	"github.com/openclaw/cloudworkers/protocol"
)

// errConnLost fails a request whose connection ended before it was answered.
var errConnLost = errors.New("gateway connection lost")

// writeTimeout cuts a connection whose write to the gateway has been blocked this long.
const writeTimeout = 10 * time.Second

// connOptions are what the owner of a connection (Run's worker, or a Client) adds to it.
type connOptions struct {
	// serve answers the gateway's requests that protocol.IsGatewayMethod accepts, other than worker.shutdown; nil
	// answers them with method-not-allowed. It runs on the read loop, so it must not block.
	serve func(ctx context.Context, method string, params json.RawMessage) (any, *protocol.Error)
	// onEvent receives the gateway's event frames other than worker.shutdown, on the read loop; nil
	// ignores them.
	onEvent func(protocol.Frame)
	// primary marks the worker's own connection (Run's): it logs its admission and asks for a fresh
	// credential at half the current one's lifetime, when the gateway offers
	// worker.credential.refresh.
	primary bool
	// work, when not nil, runs beside the read loop and the heartbeat; the connection ends with it.
	work func(ctx context.Context, c *conn) error
}

// conn is one admitted connection to the gateway. Its read loop routes every frame the gateway
// sends; its heartbeat keeps the link alive and, when asked, refreshes the credential.
type conn struct {
	w        *worker
	ws       *websocket.Conn
	wd       *watchdog.Conn // bounds reads (silence) and writes (writeTimeout)
	opts     connOptions
	interval time.Duration
	lost     chan struct{} // closed when the read loop ends

	mu        sync.Mutex
	answers   map[string]func(protocol.Frame) // request id → what to do with its answer, on the read loop
	refreshAt time.Time                       // zero: no refresh scheduled
}

// connect runs one connection: dial and admission, then the read loop, the heartbeat and
// opts.work in one errgroup until one of them ends. admitted tells whether admission succeeded;
// the error is errShutdown when the gateway asked the worker to exit.
func (w *worker) connect(ctx context.Context, opts connOptions) (admitted bool, err error) {
	ws, cr, err := w.admit(ctx)
	if err != nil {
		return false, err
	}
	defer ws.CloseNow()
	c := &conn{w: w, ws: ws, opts: opts, interval: heartbeatInterval(cr), lost: make(chan struct{}),
		answers: map[string]func(protocol.Frame){}}
	if opts.primary {
		w.log.Info("admitted by gateway", "heartbeatInterval", c.interval, "features", cr.Features)
		for _, f := range cr.Features {
			if f == protocol.FeatureCredentialRefresh && cr.CredentialExpiresInMs > 0 {
				c.refreshAt = w.now().Add(time.Duration(cr.CredentialExpiresInMs) * time.Millisecond / 2)
			}
		}
	}
	// One watchdog per connection, instead of a timeout context per frame: the gateway answers
	// every heartbeat, so silence for three intervals means the link is dead.
	sw := watchdog.New(watchdog.Config{ReadTimeout: 3*c.interval + time.Second, WriteTimeout: writeTimeout,
		Clock: w.cfg.DeadlineClock})
	c.wd = sw.Watch(ws)
	g, gctx := errgroup.WithContext(ctx)
	// The read loop's reads are not cut by ctx (a cut read drops the link): when ctx ends, this
	// side closes the connection with a normal closure, which ends the read, so the gateway sees
	// the connection end rather than a lost worker. Any other end of the group closes the
	// connection at once, which ends the read.
	readCtx, stopRead := context.WithCancel(context.WithoutCancel(gctx))
	defer stopRead()
	closed := make(chan struct{})
	stopClose := context.AfterFunc(gctx, func() {
		defer close(closed)
		// A shutdown the gateway asked for, or this side closing, ends with a normal closure
		// (bounded by the library's close handshake timeouts), so the gateway does not see a
		// lost worker; errgroup cancels gctx with the error that ended the group.
		switch {
		case errors.Is(context.Cause(gctx), errShutdown):
			_ = ws.Close(websocket.StatusNormalClosure, "shutdown")
		case ctx.Err() != nil:
			_ = ws.Close(websocket.StatusNormalClosure, "closed")
		}
		stopRead()
		_ = ws.CloseNow()
	})
	g.Go(func() error {
		sw.Run(gctx)
		return nil
	})
	g.Go(func() error { return c.readLoop(readCtx) })
	g.Go(func() error { return c.heartbeatLoop(gctx) })
	if opts.work != nil {
		g.Go(func() error { return opts.work(gctx, c) })
	}
	err = g.Wait()
	if !stopClose() {
		<-closed
	}
	return true, err
}

func heartbeatInterval(cr protocol.ConnectResult) time.Duration {
	interval := time.Duration(cr.HeartbeatIntervalMs) * time.Millisecond
	if interval <= 0 {
		interval = 10 * time.Second
	}
	return interval
}

// admit dials the gateway and runs admission; the caller owns the returned connection.
func (w *worker) admit(ctx context.Context) (_ *websocket.Conn, _ protocol.ConnectResult, err error) {
	var cr protocol.ConnectResult
	dctx, cancel := context.WithTimeout(ctx, w.cfg.DialTimeout)
	defer cancel()
	ws, _, err := websocket.Dial(dctx, gatewayURL, &websocket.DialOptions{HTTPClient: w.client})
	if err != nil {
		return nil, cr, fmt.Errorf("dial gateway at %s: %w", w.cfg.SocketPath, err)
	}
	defer func() {
		if err != nil {
			ws.CloseNow()
		}
	}()
	ws.SetReadLimit(protocol.DefaultFrameLimit)

	cred := w.credential.Get()
	connectID := w.id()
	adm := protocol.Admission{
		EnvironmentID: w.cfg.EnvironmentID, Credential: cred, OwnerEpoch: w.cfg.OwnerEpoch, SessionID: w.cfg.SessionID,
		Handshake: protocol.Handshake{BundleHash: w.cfg.BundleHash, Version: w.cfg.ProtocolVersion,
			BuildVersion: w.cfg.Version, ProtocolFeatures: w.cfg.Features, Tools: w.cfg.Tools},
	}
	if w.cfg.Key != nil {
		protocol.SignAdmission(&adm, w.cfg.Key, time.Now())
	}
	req, err := protocol.Request(connectID, protocol.MethodConnect, protocol.ConnectParams{Role: protocol.RoleWorker, Admission: adm})
	if err != nil {
		return nil, cr, err
	}
	if err := writeFrame(dctx, ws, req); err != nil {
		return nil, cr, fmt.Errorf("send connect: %w", err)
	}
	res, err := readFrame(dctx, ws)
	if err != nil {
		return nil, cr, fmt.Errorf("read connect response: %w", err)
	}
	if res.Type != protocol.TypeRes || res.ID != connectID {
		return nil, cr, fmt.Errorf("connect: unexpected %s frame", res.Type)
	}
	if !res.OK {
		return nil, cr, &AdmissionError{Err: res.Error}
	}
	if err := protocol.DecodeParams(res.Payload, &cr); err != nil {
		return nil, cr, fmt.Errorf("connect response: %w", err)
	}
	return ws, cr, nil
}

// readLoop reads the gateway's frames until the connection fails, goes silent (the watchdog cuts
// it) or the gateway asks the worker to shut down (errShutdown).
func (c *conn) readLoop(ctx context.Context) error {
	defer close(c.lost)
	for {
		c.wd.BeginRead()
		f, err := readFrame(watchdog.Background, c.ws)
		c.wd.EndRead()
		if err != nil {
			return fmt.Errorf("read from gateway: %w", c.wd.Err(err))
		}
		switch f.Type {
		case protocol.TypeEvent:
			if f.Event == protocol.MethodShutdown {
				return errShutdown
			}
			if c.opts.onEvent != nil {
				c.opts.onEvent(f)
			} else {
				c.w.log.Debug("ignoring gateway event", "event", f.Event)
			}
		case protocol.TypeReq:
			if f.Method == protocol.MethodShutdown {
				res, _ := protocol.Response(f.ID, struct{}{})
				_ = c.write(ctx, res)
				return errShutdown
			}
			if err := c.write(ctx, c.answer(ctx, f)); err != nil {
				return err
			}
		case protocol.TypeRes:
			c.mu.Lock()
			h := c.answers[f.ID]
			delete(c.answers, f.ID)
			c.mu.Unlock()
			if h != nil {
				h(f)
			}
		}
	}
}

// answer serves one request of the gateway.
func (c *conn) answer(ctx context.Context, f protocol.Frame) protocol.Frame {
	serve := c.opts.serve
	if serve == nil || !protocol.IsGatewayMethod(f.Method) {
		return protocol.ErrorResponse(f.ID, protocol.Errorf(protocol.CodeMethodNotAllowed, "worker does not serve %.128q", f.Method))
	}
	out, e := serve(ctx, f.Method, f.Params)
	if e != nil {
		return protocol.ErrorResponse(f.ID, e)
	}
	res, err := protocol.Response(f.ID, out)
	if err != nil {
		return protocol.ErrorResponse(f.ID, protocol.Errorf(protocol.CodeMethodNotAllowed, "worker does not serve %.128q", f.Method))
	}
	return res
}

// heartbeatLoop sends a heartbeat every interval (the gateway's clock of liveness) and, when one is
// due, a credential refresh.
func (c *conn) heartbeatLoop(ctx context.Context) error {
	for {
		if err := clock.Sleep(ctx, c.w.cfg.Clock, c.interval); err != nil {
			return err
		}
		if err := c.send(ctx, protocol.MethodHeartbeat, nil, c.logRefusal(protocol.MethodHeartbeat)); err != nil {
			return err
		}
		c.mu.Lock()
		due := !c.refreshAt.IsZero() && !c.w.now().Before(c.refreshAt)
		if due {
			// Wait for the answer (or the next interval) before asking again.
			c.refreshAt = c.w.now().Add(c.interval)
		}
		c.mu.Unlock()
		if due {
			if err := c.send(ctx, protocol.MethodCredentialRefresh, nil, c.refreshed); err != nil {
				return err
			}
		}
	}
}

// logRefusal returns an answer handler that logs a refused request.
func (c *conn) logRefusal(method string) func(protocol.Frame) {
	return func(f protocol.Frame) {
		if !f.OK {
			c.w.log.Warn("gateway refused request", "method", method, "err", f.Error)
		}
	}
}

// refreshed applies the answer to worker.credential.refresh: the new credential replaces the old
// one for every later admission, and the next refresh is due at half its lifetime.
func (c *conn) refreshed(f protocol.Frame) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !f.OK {
		c.logRefusal(protocol.MethodCredentialRefresh)(f)
		if f.Error.Code == protocol.CodeMethodNotAllowed {
			c.refreshAt = time.Time{}
		}
		return
	}
	var r protocol.CredentialRefreshResult
	if err := protocol.DecodeParams(f.Payload, &r); err != nil || r.Credential == "" {
		c.w.log.Warn("bad credential refresh response", "err", err)
		return
	}
	c.w.credential.Set(r.Credential)
	c.refreshAt = time.Time{}
	if r.ExpiresInMs > 0 {
		c.refreshAt = c.w.now().Add(time.Duration(r.ExpiresInMs) * time.Millisecond / 2)
	}
	c.w.log.Info("worker credential refreshed")
}

// send writes a request; on its answer, onAnswer (if not nil) runs on the read loop.
func (c *conn) send(ctx context.Context, method string, params any, onAnswer func(protocol.Frame)) error {
	id := c.w.id()
	req, err := protocol.Request(id, method, params)
	if err != nil {
		return err
	}
	if onAnswer != nil {
		c.mu.Lock()
		c.answers[id] = onAnswer
		c.mu.Unlock()
	}
	if err := c.write(ctx, req); err != nil {
		return fmt.Errorf("send %s: %w", method, err)
	}
	return nil
}

// call sends a request and waits for its answer or the connection's end.
func (c *conn) call(ctx context.Context, method string, params any) (protocol.Frame, error) {
	ch := make(chan protocol.Frame, 1)
	if err := c.send(ctx, method, params, func(f protocol.Frame) { ch <- f }); err != nil {
		return protocol.Frame{}, err
	}
	select {
	case f := <-ch:
		return f, nil
	case <-c.lost:
		return protocol.Frame{}, errConnLost
	case <-ctx.Done():
		return protocol.Frame{}, ctx.Err()
	}
}

// write sends one frame on the admitted connection; the watchdog, not ctx, bounds the write once
// it has begun (ctx bounds the wait for the writes ahead).
func (c *conn) write(ctx context.Context, f protocol.Frame) error {
	b, err := f.Encode()
	if err != nil {
		return err
	}
	return c.wd.Write(ctx, websocket.MessageText, b)
}

// writeFrame sends one frame during admission, bounded by ctx (the dial timeout).
func writeFrame(ctx context.Context, ws *websocket.Conn, f protocol.Frame) error {
	b, err := f.Encode()
	if err != nil {
		return err
	}
	return ws.Write(ctx, websocket.MessageText, b)
}

func readFrame(ctx context.Context, ws *websocket.Conn) (protocol.Frame, error) {
	typ, b, err := ws.Read(ctx)
	if err != nil {
		return protocol.Frame{}, err
	}
	if typ != websocket.MessageText {
		return protocol.Frame{}, errors.New("binary message from gateway")
	}
	return protocol.Decode(b, protocol.DefaultFrameLimit)
}

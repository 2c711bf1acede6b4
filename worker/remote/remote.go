// Package remote is the box side of the worker protocol: it connects to the gateway through the
// tunnelled unix socket, gets admitted, heartbeats and reconnects until told to shut down.
package remote

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/coder/websocket"
	"golang.org/x/sync/errgroup"

	"github.com/openclaw/cloudworkers/internal/backoff"
	"github.com/openclaw/cloudworkers/internal/clock"
	"github.com/openclaw/cloudworkers/protocol"
)

// gatewayURL is the WebSocket URL dialled over the unix socket; the host is never resolved.
const gatewayURL = "ws://worker/worker"

// Config configures Run.
type Config struct {
	// SocketPath is the unix socket the gateway's tunnel forwards to its worker listener.
	SocketPath    string
	EnvironmentID string
	// Credential is the secret minted for this environment. Never logged.
	Credential string
	// Latest, when set, holds the newest credential instead: admissions read it and refreshes write
	// it, so every client made from this Config (the per-turn clients too) admits with the newest
	// one. The gateway revokes the credentials a refreshed one replaced once it is used.
	Latest     *Secret
	OwnerEpoch uint64
	SessionID  string
	// BundleHash is the hex sha256 of this worker's executable.
	BundleHash string
	// Version is the openclaw build version, reported for logs and audit.
	Version string
	// ProtocolVersion is the protocol version offered; 0 means protocol.ProtocolVersion. Tests only.
	ProtocolVersion int
	// Features are the protocol features offered; nil means protocol.Features.
	Features []string
	Log      *slog.Logger
	// BackoffMin and BackoffMax bound the jittered, doubling reconnect delay. Defaults 250ms and 30s.
	BackoffMin, BackoffMax time.Duration
	// Clock paces reconnects and capacity retries; the real clock when nil.
	Clock clock.Clock
	// DialTimeout bounds one connection attempt including admission. Default 30s.
	DialTimeout time.Duration
	// Handler answers the gateway's requests other than worker.shutdown (worker.turn.start, …) on
	// the connection Run keeps. It runs on the read loop, so it must not block: it starts work and
	// returns the answer. nil answers them with method-not-allowed.
	Handler func(ctx context.Context, method string, params json.RawMessage) (any, *protocol.Error)
}

func (c *Config) setDefaults() {
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	if c.ProtocolVersion == 0 {
		c.ProtocolVersion = protocol.ProtocolVersion
	}
	if c.Features == nil {
		c.Features = protocol.Features
	}
	if c.BackoffMin <= 0 {
		c.BackoffMin = 250 * time.Millisecond
	}
	if c.BackoffMax <= 0 {
		c.BackoffMax = 30 * time.Second
	}
	if c.BackoffMax < c.BackoffMin {
		c.BackoffMax = c.BackoffMin
	}
	if c.DialTimeout <= 0 {
		c.DialTimeout = 30 * time.Second
	}
	c.Clock = clock.Or(c.Clock)
}

// Validate reports a missing field.
func (c *Config) Validate() error {
	switch {
	case c.SocketPath == "":
		return errors.New("worker config: socket path is required")
	case c.EnvironmentID == "":
		return errors.New("worker config: environment id is required")
	case c.Credential == "":
		return errors.New("worker config: credential is required")
	case c.BundleHash == "":
		return errors.New("worker config: bundle hash is required")
	}
	return nil
}

// AdmissionError is a connect request the gateway refused.
type AdmissionError struct {
	Err *protocol.Error
}

func (e *AdmissionError) Error() string { return "admission rejected: " + e.Err.Error() }
func (e *AdmissionError) Unwrap() error { return e.Err }

// Permanent reports whether retrying with the same credential and binary cannot succeed.
func (e *AdmissionError) Permanent() bool { return e.Err.Code.PermanentAdmission() }

// errShutdown ends a session because the gateway asked the worker to exit.
var errShutdown = errors.New("gateway requested shutdown")

// Run connects to the gateway and stays admitted, reconnecting with capped, jittered backoff after
// a lost connection. It returns nil when the gateway sends worker.shutdown, an *AdmissionError
// when admission is refused permanently, and ctx's error when ctx ends.
func Run(ctx context.Context, cfg Config) error {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return err
	}
	w := newWorker(cfg)
	defer w.client.CloseIdleConnections()
	bo := backoff.Backoff{Min: cfg.BackoffMin, Max: cfg.BackoffMax, Clock: cfg.Clock}
	for {
		admitted, err := w.session(ctx)
		if err == nil {
			w.log.Info("worker shut down by gateway")
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		var ae *AdmissionError
		if errors.As(err, &ae) && ae.Permanent() {
			return err
		}
		if admitted {
			bo.Reset()
		}
		d := bo.Next()
		w.log.Warn("gateway connection lost; reconnecting", "err", err, "in", d)
		if err := bo.Sleep(ctx, d); err != nil {
			return err
		}
	}
}

func newWorker(cfg Config) *worker {
	latest := cfg.Latest
	if latest == nil {
		latest = NewSecret(cfg.Credential)
	}
	w := &worker{cfg: cfg, log: cfg.Log.With("subsystem", "worker", "env", cfg.EnvironmentID), credential: latest}
	w.client = &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", cfg.SocketPath)
		},
	}}
	return w
}

type worker struct {
	cfg    Config
	log    *slog.Logger
	client *http.Client

	mu         sync.Mutex
	credential *Secret // replaced by a successful refresh
	nextID     uint64
}

func (w *worker) id() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.nextID++
	return strconv.FormatUint(w.nextID, 10)
}

// session runs one connection: dial, admission, then heartbeats until the connection ends.
// It returns nil on a requested shutdown; admitted tells whether admission succeeded.
func (w *worker) session(ctx context.Context) (admitted bool, err error) {
	ws, cr, err := w.admit(ctx)
	if err != nil {
		return false, err
	}
	defer ws.CloseNow()
	interval := heartbeatInterval(cr)
	w.log.Info("admitted by gateway", "heartbeatInterval", interval, "features", cr.Features)

	s := &conn{w: w, ws: ws, interval: interval, pending: map[string]string{}}
	for _, f := range cr.Features {
		if f == protocol.FeatureCredentialRefresh && cr.CredentialExpiresInMs > 0 {
			s.refreshAt = time.Now().Add(time.Duration(cr.CredentialExpiresInMs) * time.Millisecond / 2)
		}
	}
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return s.readLoop(gctx) })
	g.Go(func() error { return s.heartbeatLoop(gctx) })
	err = g.Wait()
	if errors.Is(err, errShutdown) {
		_ = ws.Close(websocket.StatusNormalClosure, "shutdown")
		return true, nil
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
	req, err := protocol.Request(connectID, protocol.MethodConnect, protocol.ConnectParams{
		Role: protocol.RoleWorker,
		Admission: protocol.Admission{
			EnvironmentID: w.cfg.EnvironmentID, Credential: cred, OwnerEpoch: w.cfg.OwnerEpoch, SessionID: w.cfg.SessionID,
			Handshake: protocol.Handshake{BundleHash: w.cfg.BundleHash, Version: w.cfg.ProtocolVersion,
				BuildVersion: w.cfg.Version, ProtocolFeatures: w.cfg.Features},
		},
	})
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

// conn is the admitted part of one session.
type conn struct {
	w        *worker
	ws       *websocket.Conn
	interval time.Duration

	mu        sync.Mutex
	pending   map[string]string // request id → method, bounded by the read timeout
	refreshAt time.Time         // zero: no refresh scheduled
}

func (c *conn) readLoop(ctx context.Context) error {
	// The gateway answers every heartbeat, so silence for three intervals means the link is dead.
	silence := 3*c.interval + time.Second
	for {
		rctx, cancel := context.WithTimeout(ctx, silence)
		f, err := readFrame(rctx, c.ws)
		cancel()
		if err != nil {
			return fmt.Errorf("read from gateway: %w", err)
		}
		switch f.Type {
		case protocol.TypeEvent:
			if f.Event == protocol.MethodShutdown {
				return errShutdown
			}
			c.w.log.Debug("ignoring gateway event", "event", f.Event)
		case protocol.TypeReq:
			if f.Method == protocol.MethodShutdown {
				res, _ := protocol.Response(f.ID, struct{}{})
				_ = writeFrame(ctx, c.ws, res)
				return errShutdown
			}
			res := protocol.ErrorResponse(f.ID, protocol.Errorf(protocol.CodeMethodNotAllowed, "worker does not serve %.128q", f.Method))
			if h := c.w.cfg.Handler; h != nil && protocol.GatewayMethods[f.Method] {
				out, e := h(ctx, f.Method, f.Params)
				if e != nil {
					res = protocol.ErrorResponse(f.ID, e)
				} else if r, err := protocol.Response(f.ID, out); err == nil {
					res = r
				}
			}
			if err := writeFrame(ctx, c.ws, res); err != nil {
				return err
			}
		case protocol.TypeRes:
			c.handleResponse(f)
		}
	}
}

func (c *conn) handleResponse(f protocol.Frame) {
	c.mu.Lock()
	defer c.mu.Unlock()
	method, ok := c.pending[f.ID]
	delete(c.pending, f.ID)
	if !ok {
		return
	}
	if !f.OK {
		c.w.log.Warn("gateway refused request", "method", method, "err", f.Error)
		if method == protocol.MethodCredentialRefresh && f.Error.Code == protocol.CodeMethodNotAllowed {
			c.refreshAt = time.Time{}
		}
		return
	}
	if method != protocol.MethodCredentialRefresh {
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
		c.refreshAt = time.Now().Add(time.Duration(r.ExpiresInMs) * time.Millisecond / 2)
	}
	c.w.log.Info("worker credential refreshed")
}

func (c *conn) heartbeatLoop(ctx context.Context) error {
	t := time.NewTicker(c.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
		if err := c.send(ctx, protocol.MethodHeartbeat); err != nil {
			return err
		}
		c.mu.Lock()
		due := !c.refreshAt.IsZero() && !time.Now().Before(c.refreshAt)
		if due {
			// Wait for the answer (or the next interval) before asking again.
			c.refreshAt = time.Now().Add(c.interval)
		}
		c.mu.Unlock()
		if due {
			if err := c.send(ctx, protocol.MethodCredentialRefresh); err != nil {
				return err
			}
		}
	}
}

func (c *conn) send(ctx context.Context, method string) error {
	id := c.w.id()
	req, err := protocol.Request(id, method, nil)
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.pending[id] = method
	c.mu.Unlock()
	if err := writeFrame(ctx, c.ws, req); err != nil {
		return fmt.Errorf("send %s: %w", method, err)
	}
	return nil
}

func writeFrame(ctx context.Context, ws *websocket.Conn, f protocol.Frame) error {
	b, err := json.Marshal(f)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
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

// Secret holds a credential shared by the clients of one worker; safe for concurrent use.
type Secret struct {
	mu sync.Mutex
	v  string
}

// NewSecret returns a Secret holding v.
func NewSecret(v string) *Secret { return &Secret{v: v} }

// Get returns the credential.
func (s *Secret) Get() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.v
}

// Set replaces the credential.
func (s *Secret) Set(v string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.v = v
}

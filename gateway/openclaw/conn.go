package openclaw

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
	"github.com/openclaw/cloudworkers/internal/ids"
)

// operatorScopes are the scopes the operator token can grant: all of the protocol's operator scopes.
var operatorScopes = []string{"operator.admin", "operator.read", "operator.write", "operator.approvals",
	"operator.questions", "operator.pairing", "operator.talk", "operator.talk.secrets"}

// maxInflight bounds the long requests (agent, agent.wait) one connection has running.
const maxInflight = 16

// conn is one client connection.
type conn struct {
	srv *Server
	ws  *websocket.Conn
	req *http.Request // the upgrade request (headers only: its body is gone)
	// browser: the upgrade came with a signed-in browser session (no token needed)
	browser bool
	remote  string
	connID  string
	ctx     context.Context
	cancel  context.CancelFunc

	// out carries encoded frames to the writer; buffered counts their bytes (bounded by
	// MaxBufferedBytes: a client that does not read is cut, never queued without end).
	out      chan outMsg
	buffered atomic.Int64
	seq      atomic.Uint64
	once     sync.Once
	wg       sync.WaitGroup

	// set at connect
	scopes   []string
	client   client
	deviceID string // the device this connection proved it holds, when it sent one (written under srv.mu)
	claimed  string // the device whose connection cap this connection counts against (under srv.mu)

	mu      sync.Mutex
	subs    map[string]*follower // session id → its live-feed follower
	changes bool                 // sessions.subscribe: sessions.changed events
	// changesStarted: the change feed's relay runs (it stops with the connection)
	changesStarted bool
	aliases        map[string]string // our run id → the client's (its idempotency key)
	// pending: message-subscribed sessions that changed, for messageLoop (kick wakes it)
	pending  map[string]struct{}
	kick     chan struct{}
	inflight int
}

func newConn(s *Server, ws *websocket.Conn, r *http.Request) *conn {
	ctx, cancel := context.WithCancel(s.ctx)
	browser := s.cfg.SignedIn != nil && s.cfg.SignedIn(r)
	return &conn{srv: s, ws: ws, req: r, browser: browser, remote: r.RemoteAddr, connID: ids.Hex(8), ctx: ctx, cancel: cancel,
		out: make(chan outMsg, 1024), subs: map[string]*follower{},
		pending: map[string]struct{}{}, kick: make(chan struct{}, 1)}
}

// run serves the connection: the challenge, the connect handshake, then requests until the client
// leaves, the gateway stops, or a bound is crossed.
func (c *conn) run() {
	defer c.cancel()
	defer c.wg.Wait()
	defer c.unsubscribeAll()
	c.ws.SetReadLimit(PreConnectMaxBytes)
	c.wg.Add(1)
	go c.writer()
	nonce := ids.Hex(16)
	challengeAt := c.srv.cfg.Now()
	c.event("connect.challenge", map[string]any{"nonce": nonce, "ts": challengeAt.UnixMilli()})
	// A read whose context ends closes the WebSocket without a close frame: the handshake's
	// deadline closes it properly instead.
	deadline := time.AfterFunc(c.srv.cfg.HandshakeTimeout, func() {
		c.closeWith(websocket.StatusPolicyViolation, "handshake timeout: no connect request")
	})
	_, data, err := c.ws.Read(c.ctx)
	deadline.Stop()
	if err != nil {
		c.closeWith(websocket.StatusPolicyViolation, "invalid handshake")
		return
	}
	if !c.handshake(data, nonce, challengeAt) {
		return
	}
	c.ws.SetReadLimit(c.srv.cfg.MaxPayload)
	c.wg.Add(1)
	go c.ticker()
	for {
		_, data, err := c.ws.Read(c.ctx)
		if err != nil {
			c.closeWith(websocket.StatusNormalClosure, "")
			return
		}
		var f inFrame
		if err := json.Unmarshal(data, &f); err != nil || f.Type != "req" || f.ID == "" || f.Method == "" {
			id := f.ID
			if id == "" {
				id = "invalid"
			}
			c.reply(inFrame{ID: id, Method: f.Method}, nil, errf(CodeInvalidRequest, "invalid request frame: want {type:\"req\", id, method, params}"))
			continue
		}
		c.dispatch(f)
	}
}

// handshake checks the connect request and answers hello-ok, or the protocol's error and a close.
func (c *conn) handshake(data []byte, nonce string, challengeAt time.Time) bool {
	var f inFrame
	if err := json.Unmarshal(data, &f); err != nil || f.Type != "req" || f.ID == "" {
		c.closeWith(websocket.StatusPolicyViolation, "invalid request frame")
		return false
	}
	fail := func(msg, detail string) bool {
		var details any
		if detail != "" {
			details = map[string]any{"code": detail}
		}
		c.reply(f, nil, &errorShape{Code: CodeInvalidRequest, Message: msg, Details: details})
		if c.srv.cfg.Refuse != nil {
			c.srv.cfg.Refuse(c.req, msg)
		} else {
			c.srv.cfg.Log.Warn("openclaw client refused", "reason", msg, "remote", c.remote)
		}
		c.closeWith(websocket.StatusPolicyViolation, truncate(msg, 120))
		return false
	}
	if f.Method != "connect" {
		return fail("invalid handshake: first request must be connect", "")
	}
	var p connectParams
	if err := json.Unmarshal(f.Params, &p); err != nil {
		return fail("invalid connect params: "+truncate(err.Error(), 200), "")
	}
	if p.MinProtocol > ProtocolVersion || (p.MaxProtocol != 0 && p.MaxProtocol < ProtocolVersion) {
		return fail(fmt.Sprintf("protocol mismatch: this gateway speaks protocol %d, the client %d..%d", ProtocolVersion, p.MinProtocol, p.MaxProtocol), DetailProtocolMismatch)
	}
	if p.Role != "" && p.Role != "operator" {
		return fail("invalid role: this gateway serves operator clients only (got "+truncate(p.Role, 40)+")", "")
	}
	token, password, deviceToken := "", "", ""
	if p.Auth != nil {
		token, password, deviceToken = p.Auth.Token, p.Auth.Password, p.Auth.DeviceToken
	}
	if strings.HasPrefix(token, DeviceTokenPrefix) && deviceToken == "" {
		deviceToken = token // clients send a stored device token as auth.token
	}
	if p.Device != nil {
		// The signature covers the token the client authenticates with: auth.token, else the
		// device token it stored (a reconnect of a signed-in Control UI sends only that).
		signed := token
		if signed == "" && password == "" {
			signed = deviceToken
		}
		if code, msg := verifyDevice(p.Device, p, signed, nonce, challengeAt); code != "" {
			return fail(msg, code)
		}
	}
	// capped: the scopes a device token was issued for (nil: every operator scope)
	var capped []string
	operator := false
	switch {
	case c.srv.checkToken(token) || c.srv.checkToken(password):
		operator = true
	case deviceToken != "" && c.srv.cfg.Devices != nil:
		if p.Device == nil {
			return fail("unauthorized: a device token needs the device's signed identity", DetailDeviceTokenMismatch)
		}
		sc, err := c.srv.cfg.Devices.Check(c.ctx, deviceToken, p.Device.ID)
		if err != nil {
			return fail("unauthorized: device token mismatch (revoked or replaced; connect with the operator token to get a new one)", DetailDeviceTokenMismatch)
		}
		capped = sc
	case c.browser && token == "" && password == "":
		// signed in through this gateway's sign-in: the browser session is the credential
		operator = true
	case token == "" && password == "":
		return fail("unauthorized: gateway token missing (pass the operator token: the gateway's <data-dir>/gateway.token)", DetailAuthTokenMissing)
	default:
		return fail("unauthorized: gateway token mismatch (pass the operator token: the gateway's <data-dir>/gateway.token)", DetailAuthTokenMismatch)
	}
	// The operator token grants every operator scope, a device token those it was issued for; a
	// client gets those it asked for (all it may have when it asked for none).
	allowed := operatorScopes
	if capped != nil || !operator {
		allowed = capped
	}
	granted := allowed
	if len(p.Scopes) > 0 {
		granted = nil
		for _, sc := range p.Scopes {
			if !slices.Contains(allowed, sc) && !operator && slices.Contains(operatorScopes, sc) {
				return fail("unauthorized: device token scope mismatch: it was issued for "+strings.Join(allowed, ",")+
					" (connect with the operator token for more)", DetailAuthScopeMismatch)
			}
			if slices.Contains(allowed, sc) && !slices.Contains(granted, sc) {
				granted = append(granted, sc)
			}
		}
	}
	// A verified device counts against its own connection cap, before a token is issued to it.
	if p.Device != nil && !c.srv.claimDevice(c, strings.ToLower(p.Device.ID)) {
		c.reply(f, nil, &errorShape{Code: CodeUnavailable, Retryable: true, RetryAfterMs: 5000,
			Message: fmt.Sprintf("too many connections of this device (openclawClients.maxConnectionsPerDevice: %d); close one", c.srv.cfg.MaxConnectionsPerDevice)})
		c.closeWith(websocket.StatusTryAgainLater, "too many connections of this device")
		return false
	}
	if !operator && p.Device != nil {
		c.srv.setDeviceID(c, strings.ToLower(p.Device.ID)) // connected by its device token
	}
	// A verified device that signed in with the operator's credential gets a device token of its
	// own, for the scopes it was granted (revocable: openclaw devices revoke).
	var issued string
	if operator && p.Device != nil && c.srv.cfg.Devices != nil {
		tok, err := c.srv.cfg.Devices.Issue(c.ctx, p.Device, p.Client, granted)
		if err != nil {
			c.srv.cfg.Log.Warn("openclaw device token", "err", err)
		} else {
			issued = tok
			c.srv.setDeviceID(c, strings.ToLower(p.Device.ID))
		}
	}
	c.scopes, c.client = granted, p.Client
	hello := c.hello(granted)
	if issued != "" {
		hello["auth"].(map[string]any)["deviceToken"] = issued
	}
	c.reply(f, hello, nil)
	if c.deviceID != "" && c.srv.deviceRevoked(c.deviceID) {
		c.closeWith(websocket.StatusPolicyViolation, "device revoked")
	}
	c.srv.cfg.Log.Debug("openclaw client connected", "client", p.Client.ID, "mode", p.Client.Mode, "remote", c.remote)
	return true
}

// helloAuth is hello-ok's auth: the role, the granted scopes and, for a client that proved a
// device, its recoveryScope (an opaque name of the device under which the Control UI keeps its
// pending placements across reloads; it grants nothing here).
func (c *conn) helloAuth(scopes []string) map[string]any {
	a := map[string]any{"role": "operator", "scopes": scopes}
	if c.deviceID != "" {
		b, _ := json.Marshal([]string{"device", c.deviceID})
		sum := sha256.Sum256(b)
		a["recoveryScope"] = base64.RawURLEncoding.EncodeToString(sum[:])
	}
	return a
}

func (c *conn) hello(scopes []string) map[string]any {
	cfg := c.srv.cfg
	return map[string]any{
		"type":     "hello-ok",
		"protocol": ProtocolVersion,
		"server":   map[string]any{"version": orDefault(cfg.Version, "dev"), "connId": c.connID},
		"features": map[string]any{"methods": methodNames(), "events": eventNames},
		"snapshot": map[string]any{
			"presence":        []any{},
			"health":          map[string]any{"ok": true},
			"stateVersion":    map[string]any{"presence": 0, "health": 0},
			"uptimeMs":        max(0, c.srv.cfg.Now().Sub(c.srv.started).Milliseconds()),
			"sessionDefaults": map[string]any{"defaultAgentId": defaultAgent, "mainKey": mainKeyName, "mainSessionKey": sessionKeyFor(defaultAgent, mainKeyName)},
		},
		"auth":   c.helloAuth(scopes),
		"policy": map[string]any{"maxPayload": cfg.MaxPayload, "maxBufferedBytes": cfg.MaxBufferedBytes, "tickIntervalMs": cfg.TickInterval.Milliseconds()},
	}
}

func (c *conn) has(scope string) bool {
	return slices.Contains(c.scopes, scope) || slices.Contains(c.scopes, "operator.admin")
}

// dispatch runs one request: unknown methods and missing scopes are answered at once; long ones
// (those that wait for a run) in a goroutine of their own, bounded per connection.
func (c *conn) dispatch(f inFrame) {
	m, ok := methods[f.Method]
	if !ok {
		c.reply(f, nil, errf(CodeInvalidRequest, "unknown method: "+truncate(f.Method, 128)))
		return
	}
	if m.scope != "" && !c.has(m.scope) && !(m.scope == "operator.read" && c.has("operator.write")) {
		c.reply(f, nil, errf(CodeForbidden, "missing scope: "+m.scope))
		return
	}
	if !m.long {
		payload, err := m.fn(c, f)
		c.reply(f, payload, err)
		return
	}
	c.mu.Lock()
	if c.inflight >= maxInflight {
		c.mu.Unlock()
		c.reply(f, nil, &errorShape{Code: CodeUnavailable, Message: fmt.Sprintf("too many requests in flight on this connection (%d)", maxInflight), Retryable: true, RetryAfterMs: 1000})
		return
	}
	c.inflight++
	c.mu.Unlock()
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		defer func() { c.mu.Lock(); c.inflight--; c.mu.Unlock() }()
		payload, err := m.fn(c, f)
		if payload != nil || err != nil {
			c.reply(f, payload, err)
		}
	}()
}

// reply queues the response frame to request f.
func (c *conn) reply(f inFrame, payload any, err *errorShape) {
	if err != nil {
		err.Message = truncate(err.Message, 2000)
		c.sendAs(f.Method, resFrame{Type: "res", ID: f.ID, OK: false, Error: err})
		return
	}
	if payload == nil {
		payload = map[string]any{}
	}
	c.sendAs(f.Method, resFrame{Type: "res", ID: f.ID, OK: true, Payload: payload})
}

// event queues an event frame with the connection's next seq.
func (c *conn) event(name string, payload any) {
	c.sendAs("", eventFrame{Type: "event", Event: name, Payload: payload, Seq: c.seq.Add(1)})
}

// sendAs encodes and queues a frame (a response to method, or an event). A client whose queue
// passes MaxBufferedBytes is cut: the gateway never holds more for one slow reader.
func (c *conn) sendAs(method string, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		c.srv.cfg.Log.Error("openclaw: encode frame", "err", err)
		return
	}
	if c.buffered.Add(int64(len(b))) > c.srv.cfg.MaxBufferedBytes {
		c.buffered.Add(-int64(len(b)))
		c.cut("slow consumer: more than policy.maxBufferedBytes queued")
		return
	}
	c.srv.trace(method, b)
	select {
	case c.out <- outMsg{b: b}:
	case <-c.ctx.Done():
		c.buffered.Add(-int64(len(b)))
	default:
		c.buffered.Add(-int64(len(b)))
		c.cut("slow consumer: too many frames queued")
	}
}

// outMsg is a frame for the writer, or (close set) the order to close after what came before.
type outMsg struct {
	b     []byte
	close *closeReq
}

type closeReq struct {
	code   websocket.StatusCode
	reason string
}

// writer writes queued frames, each under writeTimeout; a close order closes the WebSocket after
// every frame queued before it (an error answer reaches the client before the close).
func (c *conn) writer() {
	defer c.wg.Done()
	defer c.cancel()
	for {
		select {
		case <-c.ctx.Done():
			return
		case m := <-c.out:
			if m.close != nil {
				_ = c.ws.Close(m.close.code, m.close.reason) // waits for the peer's close at most 5s
				return
			}
			wctx, cancel := context.WithTimeout(c.ctx, writeTimeout)
			err := c.ws.Write(wctx, websocket.MessageText, m.b)
			cancel()
			c.buffered.Add(-int64(len(m.b)))
			if err != nil {
				return
			}
		}
	}
}

func (c *conn) ticker() {
	defer c.wg.Done()
	t := time.NewTicker(c.srv.cfg.TickInterval)
	defer t.Stop()
	for {
		select {
		case <-c.ctx.Done():
			return
		case <-t.C:
			c.event("tick", map[string]any{"ts": c.srv.nowMs()})
		}
	}
}

// shutdown tells the client the gateway stops and closes after it.
func (c *conn) shutdown(reason string) {
	c.event("shutdown", map[string]any{"reason": reason})
	c.closeWith(websocket.StatusServiceRestart, reason)
}

// closeWith closes the WebSocket once, with a status and reason, after the frames already
// queued; when the queue is full (a client that does not read) at once. The connection ends.
func (c *conn) closeWith(code websocket.StatusCode, reason string) {
	c.once.Do(func() {
		req := &closeReq{code: code, reason: truncate(reason, 120)}
		select {
		case c.out <- outMsg{close: req}:
		default:
			c.cancel()
			go func() { _ = c.ws.Close(req.code, req.reason) }()
		}
	})
}

// cut ends a connection at once, dropping what is queued: for a client that does not read.
func (c *conn) cut(reason string) {
	c.once.Do(func() {
		c.cancel() // the writer's blocked write ends with it
		go func() { _ = c.ws.Close(websocket.StatusPolicyViolation, truncate(reason, 120)) }()
		c.srv.cfg.Log.Warn("openclaw client cut", "reason", reason, "remote", c.remote)
	})
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

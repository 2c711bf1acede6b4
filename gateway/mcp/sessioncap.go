package mcp

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/openclaw/cloudworkers/gateway/auth"
)

// The config keys of the caps.
const (
	keyPerToken = "mcp.maxSessionsPerToken"
	keyTotal    = "mcp.maxSessions"
)

// sessionIDHeader is the streamable-HTTP header that names an MCP session.
const sessionIDHeader = "Mcp-Session-Id"

// maxEvictedRemembered bounds the ids of evicted sessions kept to answer their next request
// with the reason (older ones get the SDK's plain "session not found").
const maxEvictedRemembered = 1024

// sessionCaps bounds the streamable-HTTP sessions of one MCP server: at most perToken per bearer
// token and total in all. A new session that finds its bound reached evicts the session idle the
// longest (no POST in flight; an open GET event stream does not count as busy) under that bound;
// when every one is busy the new session is refused (429) naming the cap and its config key.
type sessionCaps struct {
	perToken, total int
	server          *mcp.Server
	log             *slog.Logger
	now             func() time.Time // dates the refusal log lines

	mu       sync.Mutex
	seq      uint64                 // orders uses: a higher lastUse is more recent
	live     map[string]*capSession // session id → its token and use
	pending  map[string]int         // token key → initializes in flight (not yet a session id)
	npending int
	evicted  map[string]string // session id → why it was closed (bounded by evictedQ)
	evictedQ []string
	refused  int       // refusals since the last WARN line
	warnedAt time.Time // of the last WARN line about refusals (at most one a minute)

	evictions *prometheus.CounterVec // by cap
	refusals  *prometheus.CounterVec // by cap
}

// register adds the session metrics to r.
func (c *sessionCaps) register(r prometheus.Registerer) error {
	return errors.Join(r.Register(c.evictions), r.Register(c.refusals),
		r.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "openclaw_mcp_sessions",
			Help: "Open /mcp HTTP sessions (bounded by mcp.maxSessions and mcp.maxSessionsPerToken)."},
			func() float64 { return float64(c.tracked()) })))
}

// capSession is one tracked session.
type capSession struct {
	token   string // key of the bearer token that created it
	busy    int    // POSTs in flight
	lastUse uint64
}

func newSessionCaps(server *mcp.Server, perToken, total int, log *slog.Logger) *sessionCaps {
	c := &sessionCaps{perToken: perToken, total: total, server: server, log: log, now: time.Now,
		live: map[string]*capSession{}, pending: map[string]int{}, evicted: map[string]string{},
		evictions: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "openclaw_mcp_sessions_evicted_total",
			Help: "Idle /mcp sessions closed to make room for a new one, by the cap that was full."}, []string{"cap"}),
		refusals: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "openclaw_mcp_sessions_refused_total",
			Help: "New /mcp sessions refused (429) because every session under a full cap was busy, by cap."}, []string{"cap"}),
	}
	for _, k := range []string{keyPerToken, keyTotal} {
		c.evictions.WithLabelValues(k)
		c.refusals.WithLabelValues(k)
	}
	return c
}

// tokenKey keys a request's bearer token (hashed: the tracker never holds a token).
func tokenKey(r *http.Request) string {
	tok, _ := auth.Bearer(r)
	sum := sha256.Sum256([]byte(tok))
	return hex.EncodeToString(sum[:8])
}

// CapError is the refusal of a new session past a cap.
type CapError struct {
	Key   string // the config key of the cap: mcp.maxSessionsPerToken or mcp.maxSessions
	Limit int
}

func (e *CapError) Error() string {
	scope := "this token"
	if e.Key == keyTotal {
		scope = "the gateway"
	}
	return fmt.Sprintf("too many MCP sessions for %s: %d open and every one is in the middle of a call (cap %s = %d); end a session (DELETE /mcp with its Mcp-Session-Id) or raise %s in the gateway config",
		scope, e.Limit, e.Key, e.Limit, e.Key)
}

// serve runs one authorized request through h, tracking and bounding sessions.
func (c *sessionCaps) serve(w http.ResponseWriter, r *http.Request, h http.Handler) {
	tok := tokenKey(r)
	sid := r.Header.Get(sessionIDHeader)
	if sid != "" {
		// checked and marked busy at once: a session is either busy before an eviction looks
		// at it, or evicted before its request starts (so a close never waits for a call)
		if why, evicted := c.begin(sid, r.Method == http.MethodPost); evicted {
			writeRPCError(w, r, http.StatusNotFound, why)
			return
		}
		if r.Method == http.MethodPost {
			defer c.use(sid, -1)
		}
		h.ServeHTTP(w, r)
		return
	}
	if r.Method != http.MethodPost || !startsSession(r) {
		// anything else without a session id gets a session of the SDK's that ends with the request
		h.ServeHTTP(w, r)
		return
	}
	if err := c.admit(tok); err != nil {
		writeRPCError(w, r, http.StatusTooManyRequests, err.Error())
		return
	}
	cw := &captureWriter{ResponseWriter: w, onSession: func(id string) { c.started(tok, id) }}
	defer func() { c.finished(tok, cw.sid) }()
	h.ServeHTTP(cw, r)
}

// maxPeekBytes bounds the body read to tell an initialize; a larger body is taken as one.
const maxPeekBytes = 1 << 20

// startsSession reports whether a POST without a session id is an initialize (the one request
// the SDK keeps a session for), reading its body and putting it back.
func startsSession(r *http.Request) bool {
	if r.Body == nil {
		return false
	}
	head, err := io.ReadAll(io.LimitReader(r.Body, maxPeekBytes+1))
	r.Body = struct {
		io.Reader
		io.Closer
	}{io.MultiReader(bytes.NewReader(head), r.Body), r.Body}
	if err != nil || len(head) > maxPeekBytes {
		return true
	}
	var msg struct {
		Method string `json:"method"`
	}
	if json.Unmarshal(head, &msg) != nil {
		return bytes.Contains(head, []byte(`"initialize"`)) // a batch, or garbage the SDK refuses
	}
	return msg.Method == "initialize"
}

// admit reserves room for a new session of token tok, evicting the oldest idle session under a
// full bound; a *CapError when every session under it is busy.
func (c *sessionCaps) admit(tok string) error {
	c.prune()
	var victims []string
	defer func() {
		for _, id := range victims {
			c.close(id)
		}
	}()
	c.mu.Lock()
	defer c.mu.Unlock()
	count := c.pending[tok]
	for _, s := range c.live {
		if s.token == tok {
			count++
		}
	}
	if count >= c.perToken {
		id, ok := c.oldestIdle(tok)
		if !ok {
			return c.refuse(&CapError{Key: keyPerToken, Limit: c.perToken})
		}
		c.evictLocked(id, keyPerToken, fmt.Sprintf("this token's cap %s = %d", keyPerToken, c.perToken))
		victims = append(victims, id)
	}
	if len(c.live)+c.npending >= c.total {
		id, ok := c.oldestIdle("")
		if !ok {
			return c.refuse(&CapError{Key: keyTotal, Limit: c.total})
		}
		c.evictLocked(id, keyTotal, fmt.Sprintf("the gateway's cap %s = %d", keyTotal, c.total))
		victims = append(victims, id)
	}
	c.pending[tok]++
	c.npending++
	return nil
}

// refuse counts a refusal, logging a WARN at most once a minute with the count (a client that
// retries in a loop must not fill the log).
func (c *sessionCaps) refuse(err *CapError) error {
	c.refusals.WithLabelValues(err.Key).Inc()
	c.refused++
	if now := c.now(); now.Sub(c.warnedAt) >= time.Minute {
		c.log.Warn("MCP sessions refused: cap reached with every session busy", "cap", err.Key, "limit", err.Limit, "refused", c.refused)
		c.warnedAt, c.refused = now, 0
	}
	return err
}

// oldestIdle is the session with no POST in flight used least recently, of token tok ("": any).
func (c *sessionCaps) oldestIdle(tok string) (string, bool) {
	best, found := "", false
	var bestUse uint64
	for id, s := range c.live {
		if s.busy > 0 || (tok != "" && s.token != tok) {
			continue
		}
		if !found || s.lastUse < bestUse {
			best, bestUse, found = id, s.lastUse, true
		}
	}
	return best, found
}

func (c *sessionCaps) evictLocked(id, key, cap string) {
	c.evictions.WithLabelValues(key).Inc()
	delete(c.live, id)
	c.evicted[id] = fmt.Sprintf("MCP session %s was closed to make room for a newer session (%s; the session idle the longest goes first): start a new session with initialize", id, cap)
	c.evictedQ = append(c.evictedQ, id)
	if len(c.evictedQ) > maxEvictedRemembered {
		delete(c.evicted, c.evictedQ[0])
		c.evictedQ = c.evictedQ[1:]
	}
	c.log.Debug("MCP session evicted", "session", id, "cap", cap)
}

// close ends the SDK's session id (its requests in flight, if any, finish first).
func (c *sessionCaps) close(id string) {
	for ss := range c.server.Sessions() {
		if ss.ID() == id {
			_ = ss.Close()
		}
	}
}

// prune forgets the tracked sessions the SDK no longer holds (closed by their client, by the
// idle timeout, or a failed initialize).
func (c *sessionCaps) prune() {
	alive := map[string]bool{}
	for ss := range c.server.Sessions() {
		alive[ss.ID()] = true
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for id := range c.live {
		if !alive[id] {
			delete(c.live, id)
		}
	}
}

// started turns an initialize's reservation into the session id the SDK gave it (from its
// response header): it is busy until that request ends.
func (c *sessionCaps) started(tok, id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.unreserve(tok)
	c.seq++
	c.live[id] = &capSession{token: tok, busy: 1, lastUse: c.seq}
}

func (c *sessionCaps) unreserve(tok string) {
	if c.pending[tok]--; c.pending[tok] <= 0 {
		delete(c.pending, tok)
	}
	c.npending--
}

// finished ends an initialize: id is the session it started, "" if none (its reservation is
// released).
func (c *sessionCaps) finished(tok, id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if id == "" {
		c.unreserve(tok)
		return
	}
	if s, ok := c.live[id]; ok {
		c.seq++
		s.busy--
		s.lastUse = c.seq
	}
}

// use marks a POST of session id ending (-1).
func (c *sessionCaps) use(id string, d int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if s, ok := c.live[id]; ok {
		c.seq++
		s.busy += d
		s.lastUse = c.seq
	}
}

// begin starts a request of session id: an evicted session's reason, or, for a POST, the
// session marked busy.
func (c *sessionCaps) begin(id string, post bool) (why string, evicted bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if why, ok := c.evicted[id]; ok {
		return why, true
	}
	if s, ok := c.live[id]; ok && post {
		c.seq++
		s.busy++
		s.lastUse = c.seq
	}
	return "", false
}

// tracked is the number of sessions the caps count (for tests and metrics).
func (c *sessionCaps) tracked() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.live)
}

// captureWriter reports the session id the SDK sets on an initialize's response.
type captureWriter struct {
	http.ResponseWriter
	onSession func(id string)
	sid       string
	wrote     bool
}

func (w *captureWriter) capture() {
	if w.wrote {
		return
	}
	w.wrote = true
	if id := w.Header().Get(sessionIDHeader); id != "" {
		w.sid = id
		w.onSession(id)
	}
}

func (w *captureWriter) WriteHeader(code int) {
	w.capture()
	w.ResponseWriter.WriteHeader(code)
}

func (w *captureWriter) Write(b []byte) (int, error) {
	w.capture()
	return w.ResponseWriter.Write(b)
}

func (w *captureWriter) Flush() {
	w.capture()
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Unwrap lets http.ResponseController reach the connection (deadlines, flushing).
func (w *captureWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// writeRPCError answers a JSON-RPC error with an HTTP status. The request's id is echoed when
// its (bounded) body names one; a request without one (an event stream's GET, a notification)
// gets the id "openclaw-refused", since an SDK client surfaces the message of a valid response
// only (an id of null reads as a bare "session not found").
func writeRPCError(w http.ResponseWriter, r *http.Request, status int, msg string) {
	var req struct {
		ID json.RawMessage `json:"id"`
	}
	id := json.RawMessage(`"openclaw-refused"`)
	if r.Body != nil {
		if err := json.NewDecoder(bufio.NewReader(io.LimitReader(r.Body, 64<<10))).Decode(&req); err == nil && len(req.ID) > 0 && string(req.ID) != "null" {
			id = req.ID
		}
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"jsonrpc": "2.0", "id": id,
		"error": map[string]any{"code": -32000, "message": msg}})
}

// demoteInfo is a slog handler that logs the SDK's per-session INFO lines (session connected,
// initialized, disconnected: several per initialize) at DEBUG; warnings and errors pass as they are.
type demoteInfo struct{ slog.Handler }

func (d demoteInfo) Enabled(ctx context.Context, l slog.Level) bool {
	if l == slog.LevelInfo {
		l = slog.LevelDebug
	}
	return d.Handler.Enabled(ctx, l)
}

func (d demoteInfo) Handle(ctx context.Context, r slog.Record) error {
	if r.Level == slog.LevelInfo {
		r.Level = slog.LevelDebug
	}
	return d.Handler.Handle(ctx, r)
}

func (d demoteInfo) WithAttrs(as []slog.Attr) slog.Handler {
	return demoteInfo{d.Handler.WithAttrs(as)}
}
func (d demoteInfo) WithGroup(n string) slog.Handler { return demoteInfo{d.Handler.WithGroup(n)} }

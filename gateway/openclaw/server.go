package openclaw

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"

	"github.com/openclaw/cloudworkers/gateway/sessions"
	"github.com/openclaw/cloudworkers/gateway/turns"
)

// Bounds of the endpoint (Config's zero values).
const (
	// PreConnectMaxBytes bounds a frame before connect (the protocol's 64 KiB).
	PreConnectMaxBytes = 64 << 10
	// DefaultMaxPayload bounds one frame after connect (advertised as policy.maxPayload).
	DefaultMaxPayload = 4 << 20
	// DefaultMaxBufferedBytes bounds what a connection may have queued for a client that reads
	// slowly (policy.maxBufferedBytes); past it the connection is closed.
	DefaultMaxBufferedBytes = 8 << 20
	// DefaultTickInterval is the period of tick events (policy.tickIntervalMs).
	DefaultTickInterval = 30 * time.Second
	// DefaultMaxConnections bounds open connections, gateway-wide (openclawClients.maxConnections):
	// 500 subscribed clients streaming took 150-170 KiB of gateway memory each (docs/performance.md).
	DefaultMaxConnections = 1024
	// DefaultMaxConnectionsPerDevice bounds the open connections of one device (its device token
	// or its signed identity): a leaked device token cannot take the whole endpoint.
	DefaultMaxConnectionsPerDevice = 32
	// DefaultMaxSubscriptions bounds the sessions one connection follows.
	DefaultMaxSubscriptions = 64
	// HandshakeTimeout bounds the wait for the connect request.
	HandshakeTimeout = 10 * time.Second
	// writeTimeout bounds one frame's write; a client that stops reading is cut.
	writeTimeout = 10 * time.Second
)

// Turns is what the endpoint needs of the turn service.
type Turns interface {
	Send(ctx context.Context, sessionID, text, idempotencyKey string) (turns.Turn, error)
	Cancel(sessionID string) bool
	Get(ctx context.Context, runID string) (turns.Turn, error)
	Busy(sessionID string) bool
}

// Model is one model of the catalog, as models.list shows it.
type Model struct {
	Ref, Provider, ID, Name string
	ContextWindow           int
}

// Environment is one environment as environments.list shows it (the EnvironmentSummary shape's
// worker part).
type Environment struct {
	ID, ProfileID, ProviderID, LeaseID, State, Error, TunnelStatus string
	AgeMs, IdleMs                                                  int64
	AttachedSessionIDs                                             []string
}

// Profile is a worker profile as environments.list {projection: "profiles"} shows it.
type Profile struct {
	ID, ProviderID string
	// Classes are the machine classes a dispatch may choose (none: the provider's default).
	Classes []string
}

// EnvironmentError is a refusal of an environment operation: Invalid (bad input, e.g. an unknown
// profile: INVALID_REQUEST with Code in details) or not (UNAVAILABLE, retryable after RetryAfter).
type EnvironmentError struct {
	Invalid    bool
	Code       string
	Message    string
	RetryAfter time.Duration
}

func (e *EnvironmentError) Error() string { return e.Message }

// Placement is where a session runs, as sessions.list shows it.
type Placement struct {
	State, EnvironmentID, ProfileID, ProviderID, BundleHash, BaseManifest, BoxWorkspace, Error string
	Generation, OwnerEpoch                                                                     uint64
}

// Config wires the endpoint to the gateway's services.
type Config struct {
	// Token returns the operator token (read at each connect: a rotated token takes effect).
	Token    func() string
	Sessions *sessions.Store
	Turns    Turns
	// Models lists the catalog; DefaultModel is its default reference.
	Models       func() []Model
	DefaultModel func() string
	// Environments lists the live environments; Placement reads a session's placement.
	Environments func(ctx context.Context) ([]Environment, error)
	Placement    func(ctx context.Context, sessionID string) (Placement, bool)
	// Dispatch starts moving a session to a worker of a profile; Reclaim starts bringing it home
	// (a pull-back of an active session; with recover, a failed placement moved back to the
	// gateway). Both return once the move is recorded, and the endpoint follows the placement on
	// the sessions feed (placement.updated). Errors may be *EnvironmentError.
	Dispatch func(ctx context.Context, sessionID, profileID, machineClass string) error
	Reclaim  func(ctx context.Context, sessionID string, recover bool) error
	// NewWorkspace makes a new empty workspace directory for a session (sessions.create with
	// worktreeSource "empty"), in the gateway's own area of its data dir.
	NewWorkspace func(sessionID string) (string, error)
	// CloudProfiles lists the profiles as OpenClaw's configuration shows them (config.get);
	// ApplyProfiles validates a config.patch's changes of them, then makes them.
	CloudProfiles func(ctx context.Context) ([]CloudProfile, error)
	ApplyProfiles func(ctx context.Context, ch ProfileChanges) error
	// Profiles lists the worker profiles; CreateEnvironment leases one (idempotent per key);
	// DestroyEnvironment tears one down (waiting for proof of teardown while ctx lasts). Errors
	// may be *EnvironmentError.
	Profiles           func(ctx context.Context) ([]Profile, error)
	CreateEnvironment  func(ctx context.Context, profileID, idempotencyKey string) (Environment, error)
	DestroyEnvironment func(ctx context.Context, id string, force bool) (Environment, error)
	Version            string
	Log                *slog.Logger
	// Limits (zero: the defaults above).
	MaxPayload       int64
	MaxBufferedBytes int64
	TickInterval     time.Duration
	MaxConnections   int
	// MaxConnectionsPerDevice bounds the connections of one device (openclawClients.maxConnectionsPerDevice).
	MaxConnectionsPerDevice int
	MaxSubscriptions        int
	// HandshakeTimeout bounds the wait for the connect request (default HandshakeTimeout).
	HandshakeTimeout time.Duration
	// Now is the clock (time.Now when nil).
	Now func() time.Time
	// SignedIn, when set, reports whether an upgrade request carries a signed-in browser
	// session of this gateway (OpenClaw's Control UI served by it): such a connection needs no
	// token. The WebSocket accept already refuses a page of another origin.
	SignedIn func(r *http.Request) bool
	// Refuse, when set, records a refused connection (the gateway's one refused-authentication
	// log); else it is logged at WARN.
	Refuse func(r *http.Request, why string)
	// RemoveSession removes a session as `openclaw session rm` does without --force (a session
	// whose work is on a worker is refused: pull it back first).
	RemoveSession func(ctx context.Context, id string) error
	// Devices, when set, issues device tokens to verified devices and authenticates them.
	Devices *Devices
	// Trace, when set, receives every frame the endpoint sends, one JSON document per line
	// (openclawClients.traceFile: a debugging aid; frames never carry a token).
	Trace io.Writer
}

func (c *Config) setDefaults() {
	if c.MaxPayload == 0 {
		c.MaxPayload = DefaultMaxPayload
	}
	if c.MaxBufferedBytes == 0 {
		c.MaxBufferedBytes = DefaultMaxBufferedBytes
	}
	if c.TickInterval == 0 {
		c.TickInterval = DefaultTickInterval
	}
	if c.MaxConnectionsPerDevice == 0 {
		c.MaxConnectionsPerDevice = DefaultMaxConnectionsPerDevice
	}
	if c.MaxConnections == 0 {
		c.MaxConnections = DefaultMaxConnections
	}
	if c.HandshakeTimeout == 0 {
		c.HandshakeTimeout = HandshakeTimeout
	}
	if c.MaxSubscriptions == 0 {
		c.MaxSubscriptions = DefaultMaxSubscriptions
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Models == nil {
		c.Models = func() []Model { return nil }
	}
	if c.DefaultModel == nil {
		c.DefaultModel = func() string { return "" }
	}
}

// Server is the endpoint: an http.Handler for WebSocket upgrades.
type Server struct {
	cfg     Config
	started time.Time
	ctx     context.Context
	cancel  context.CancelFunc

	traceMu sync.Mutex
	// configMu (a one-slot semaphore) lets one config.patch at a time check and apply.
	configMu chan struct{}

	mu        sync.Mutex
	conns     map[*conn]struct{}
	accepting int // upgrades past the cap check, not yet in conns
	// devices counts the connected connections of each device (MaxConnectionsPerDevice)
	devices map[string]int
	closed  bool
	wg      sync.WaitGroup
}

// New builds the endpoint.
func New(cfg Config) (*Server, error) {
	cfg.setDefaults()
	if cfg.Token == nil || cfg.Sessions == nil || cfg.Turns == nil {
		return nil, errors.New("openclaw endpoint: Token, Sessions and Turns are required")
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Server{cfg: cfg, started: cfg.Now(), ctx: ctx, cancel: cancel, conns: map[*conn]struct{}{}, devices: map[string]int{},
		configMu: make(chan struct{}, 1)}, nil
}

// IsUpgrade reports whether r asks for a WebSocket: the requests this endpoint serves.
func IsUpgrade(r *http.Request) bool {
	return r.Method == http.MethodGet && headerHas(r.Header, "Connection", "upgrade") && headerHas(r.Header, "Upgrade", "websocket")
}

// ServeHTTP accepts the WebSocket and runs the connection until it ends.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	// The slot is taken under the lock before the accept, so upgrades at the same moment cannot
	// pass the cap together.
	s.mu.Lock()
	full := len(s.conns)+s.accepting >= s.cfg.MaxConnections
	if s.closed || full {
		s.mu.Unlock()
		w.Header().Set("Retry-After", "5")
		http.Error(w, "openclaw endpoint: too many connections (openclawClients.maxConnections) or stopping", http.StatusServiceUnavailable)
		return
	}
	s.accepting++
	s.wg.Add(1)
	s.mu.Unlock()
	defer s.wg.Done()
	accepted := false
	defer func() {
		if !accepted {
			s.mu.Lock()
			s.accepting--
			s.mu.Unlock()
		}
	}()
	// Origin: a browser page may connect only from this gateway's own origin (the Control UI it
	// serves); clients that are not browsers send no Origin.
	ws, err := websocket.Accept(w, r, &websocket.AcceptOptions{})
	if err != nil {
		return
	}
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(time.Time{})
	_ = rc.SetWriteDeadline(time.Time{})
	c := newConn(s, ws, r)
	s.mu.Lock()
	s.accepting--
	accepted = true
	if s.closed {
		s.mu.Unlock()
		_ = ws.Close(websocket.StatusServiceRestart, "gateway stopping")
		return
	}
	s.conns[c] = struct{}{}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.conns, c)
		if c.claimed != "" {
			if s.devices[c.claimed]--; s.devices[c.claimed] <= 0 {
				delete(s.devices, c.claimed)
			}
		}
		s.mu.Unlock()
	}()
	c.run()
}

// claimDevice counts a connection against its device's cap; false when the device has
// MaxConnectionsPerDevice open already.
func (s *Server) claimDevice(c *conn, id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.devices[id] >= s.cfg.MaxConnectionsPerDevice {
		return false
	}
	s.devices[id]++
	c.claimed = id
	return true
}

// Close sends every connection the shutdown event, closes them and waits for their goroutines.
func (s *Server) Close(ctx context.Context) error {
	s.mu.Lock()
	s.closed = true
	conns := make([]*conn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	for _, c := range conns {
		c.shutdown("gateway stopping")
	}
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	// Each connection writes what it has queued, the shutdown event and its close; past the
	// deadline (or 6s: a close waits at most 5s for the peer) the rest are cut.
	wait := time.NewTimer(6 * time.Second)
	defer wait.Stop()
	select {
	case <-done:
		s.cancel()
		return nil
	case <-wait.C:
	case <-ctx.Done():
	}
	s.cancel()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// setDeviceID records the device a connection proved, under the lock DropDevice reads it with.
func (s *Server) setDeviceID(c *conn, id string) {
	s.mu.Lock()
	c.deviceID = id
	s.mu.Unlock()
}

// DropDevice closes every connection of a device (after its token was revoked).
func (s *Server) DropDevice(id string) int {
	id = strings.ToLower(id)
	s.mu.Lock()
	var drop []*conn
	for c := range s.conns {
		if c.deviceID == id {
			drop = append(drop, c)
		}
	}
	s.mu.Unlock()
	for _, c := range drop {
		c.closeWith(websocket.StatusPolicyViolation, "device revoked")
	}
	return len(drop)
}

// deviceRevoked is a check after connect for a revocation that raced the handshake.
func (s *Server) deviceRevoked(id string) bool {
	if s.cfg.Devices == nil {
		return false
	}
	list, err := s.cfg.Devices.List(s.ctx)
	if err != nil {
		return false
	}
	for _, d := range list {
		if d.ID == id {
			return !d.RevokedAt.IsZero()
		}
	}
	return false
}

// Connections is the number of open connections.
func (s *Server) Connections() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.conns)
}

// checkToken compares a presented secret with the operator token in constant time.
func (s *Server) checkToken(got string) bool {
	want := s.cfg.Token()
	return want != "" && got != "" && subtle.ConstantTimeCompare([]byte(got), []byte(want)) == 1
}

// trace writes a sent frame to Config.Trace as {"method", "frame"} (method: the request a
// response answers; "" for an event).
func (s *Server) trace(method string, b []byte) {
	if s.cfg.Trace == nil {
		return
	}
	m, _ := json.Marshal(method)
	line := make([]byte, 0, len(b)+len(m)+24)
	line = append(append(append(append(append(line, `{"method":`...), m...), `,"frame":`...), b...), "}\n"...)
	s.traceMu.Lock()
	defer s.traceMu.Unlock()
	_, _ = s.cfg.Trace.Write(line)
}

func (s *Server) nowMs() int64 { return s.cfg.Now().UnixMilli() }

func headerHas(h http.Header, name, token string) bool {
	for _, v := range h.Values(name) {
		for _, part := range splitComma(v) {
			if equalFoldASCII(part, token) {
				return true
			}
		}
	}
	return false
}

func splitComma(s string) []string {
	var out []string
	start := 0
	for i := 0; i <= len(s); i++ {
		if i == len(s) || s[i] == ',' {
			part := s[start:i]
			for len(part) > 0 && (part[0] == ' ' || part[0] == '\t') {
				part = part[1:]
			}
			for len(part) > 0 && (part[len(part)-1] == ' ' || part[len(part)-1] == '\t') {
				part = part[:len(part)-1]
			}
			out = append(out, part)
			start = i + 1
		}
	}
	return out
}

func equalFoldASCII(a, b string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := 0; i < len(a); i++ {
		x, y := a[i], b[i]
		if 'A' <= x && x <= 'Z' {
			x += 32
		}
		if 'A' <= y && y <= 'Z' {
			y += 32
		}
		if x != y {
			return false
		}
	}
	return true
}

// decodeParams strictly decodes a request's params into v (unknown fields are ignored: the
// protocol's clients send many we do not use), naming the method in the error.
func decodeParams(method string, raw json.RawMessage, v any) *errorShape {
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	if err := json.Unmarshal(raw, v); err != nil {
		return errf(CodeInvalidRequest, fmt.Sprintf("invalid %s params: %v", method, err))
	}
	return nil
}

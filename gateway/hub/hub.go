// Package hub is the gateway's worker endpoint: it admits workers over WebSocket and tracks them.
package hub

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/openclaw/cloudworkers/gateway/store"
	"github.com/openclaw/cloudworkers/internal/clock"
	"github.com/openclaw/cloudworkers/internal/shutdown"
	"github.com/openclaw/cloudworkers/internal/watchdog"
	"github.com/openclaw/cloudworkers/protocol"
	"github.com/openclaw/cloudworkers/worker/tools"
)

// WorkerPath is the only HTTP path served on the worker listener.
const WorkerPath = "/worker"

// DefaultWriteTimeout is Config.WriteTimeout's default.
const DefaultWriteTimeout = 10 * time.Second

// ErrNotAdmitted is returned when no worker is admitted for an environment.
var ErrNotAdmitted = errors.New("no worker admitted for environment")

// ErrClosed is returned after Close.
var ErrClosed = errors.New("worker hub closed")

// Config configures a Server.
type Config struct {
	DB *store.DB
	// Credentials verifies worker credentials; nil means NewCredentials(DB).
	Credentials *Credentials
	Log         *slog.Logger
	// ExpectedBundle returns the bundle hash the gateway pushed for an environment. A worker is
	// admitted only if its handshake bundle hash equals both this and its credential's binding.
	ExpectedBundle func(envID string) (hash string, ok bool)
	// HeartbeatTimeout closes an admitted connection that sends nothing for this long. Workers
	// are told to heartbeat at a third of it. Default 30s.
	HeartbeatTimeout time.Duration
	// WriteTimeout closes a connection whose write to the worker has been blocked this long (a
	// worker that stopped reading). Default DefaultWriteTimeout.
	WriteTimeout time.Duration
	// DeadlineClock runs HeartbeatTimeout and WriteTimeout (one watchdog for all connections); the
	// real clock when nil, not Clock, so a test that drives Clock for pacing does not also cut
	// connections.
	DeadlineClock clock.Clock
	// AdmissionTimeout bounds the time from a connection's accept to its admission (HTTP upgrade and
	// connect frame included); a connection not admitted by then is closed. Default 10s.
	AdmissionTimeout time.Duration
	// FrameLimit bounds frames after admission. Default protocol.DefaultFrameLimit.
	FrameLimit int
	// OnAdmit and OnDisconnect are called, serialized and in order, when an environment gains its
	// admitted worker and when it loses it. A connection replaced by a newer one for the same
	// environment does not trigger OnDisconnect. They must not block for long.
	// GatewayTools are the gateway-resident tools (web_search) workers may call with worker.tool.call.
	GatewayTools []tools.Tool
	// Spawn serves worker.sessions.spawn (gateway/agents); nil refuses it with method-not-allowed.
	Spawn        SpawnFunc
	OnAdmit      func(envID string)
	OnDisconnect func(envID string)
	// OnActivity is called for every request of an admitted worker other than heartbeats and
	// credential refreshes (transcript commits, live events, inference, tool calls): the
	// environment's activity as the gateway sees it. It must be cheap.
	OnActivity func(envID string)
	// Sessions serves worker.transcript.commit, worker.live-event and worker.resume; nil answers
	// them with method-not-allowed.
	Sessions SessionBackend
	// Models serves worker.inference.start (the inference proxy); nil answers it with
	// method-not-allowed.
	Models Models
	// CallCredentials picks the provider credential of a proxied call when OCC bound one to the
	// revision the environment serves (gateway/occ); nil: always the catalog's credential.
	CallCredentials CallCredentials
	// StreamQueue bounds the requests queued per stream (session + stream kind); a full queue answers
	// capacity-exceeded. Default DefaultStreamQueue.
	StreamQueue int
	// MaxStreams bounds the streams of one connection. Default DefaultMaxStreams.
	MaxStreams int
	// ConnQueueBytes bounds the params bytes queued on one connection. Default DefaultConnQueueBytes.
	ConnQueueBytes int
	// RetryAfter is the retryAfterMs hint sent with capacity-exceeded. Default DefaultRetryAfter.
	RetryAfter time.Duration
	// Limits bound calls and bytes in flight, credential refreshes, pre-admission connections and
	// the audit of refusals.
	Limits Limits
	// Capacity bounds what the whole gateway holds: workers, model calls in flight, relay rates.
	Capacity Capacity
	// Registerer, when set, gets the hub's metrics (openclaw_workers_connected, …; see metrics.go).
	Registerer prometheus.Registerer
	// RequireWorkerKey refuses an admission without a valid proof of the worker's key
	// (protocol.SignAdmission, at most AdmissionProofSkew old or early), and one whose credential's
	// lineage is bound to another key: a copied credential alone admits nothing.
	RequireWorkerKey bool
	// ExpectedTools is the tool manifest of the bundle's built-in tools (tools.Manifest of this
	// build, which the bundles share); a worker presenting another is refused. Nil: not checked.
	ExpectedTools []protocol.ToolDigest
	// Runs tells which turn of a session runs now: an inference or tool call must name that run,
	// else it is refused with unknown-run. Nil refuses every call.
	Runs Runs
	// Clock tells the time of accounting rows, refusal windows and backpressure, and paces the
	// refusal audit; the real clock when nil. A Credentials built here (nil Credentials) shares it.
	Clock clock.Clock
}

func (c *Config) setDefaults() {
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	c.Clock = clock.Or(c.Clock)
	if c.Credentials == nil && c.DB != nil {
		c.Credentials = NewCredentials(c.DB)
		c.Credentials.Clock = c.Clock
	}
	orDefault(&c.HeartbeatTimeout, 30*time.Second)
	orDefault(&c.WriteTimeout, DefaultWriteTimeout)
	orDefault(&c.AdmissionTimeout, 10*time.Second)
	orDefault(&c.FrameLimit, protocol.DefaultFrameLimit)
	orDefault(&c.StreamQueue, DefaultStreamQueue)
	orDefault(&c.MaxStreams, DefaultMaxStreams)
	orDefault(&c.ConnQueueBytes, DefaultConnQueueBytes)
	orDefault(&c.RetryAfter, DefaultRetryAfter)
	c.Limits.setDefaults()
	c.Capacity.setDefaults()
}

// Validate reports a missing dependency.
func (c *Config) Validate() error {
	switch {
	case c.DB == nil:
		return errors.New("hub config: DB is required")
	case c.ExpectedBundle == nil:
		return errors.New("hub config: ExpectedBundle is required")
	case c.FrameLimit < protocol.PreAdmissionFrameLimit:
		return fmt.Errorf("hub config: FrameLimit must be at least %d", protocol.PreAdmissionFrameLimit)
	}
	if err := c.Capacity.validate(); err != nil {
		return err
	}
	return c.Limits.validate(c.FrameLimit)
}

// Server is the worker endpoint. Serve it on the listener the tunnels forward to.
type Server struct {
	cfg   Config
	log   *slog.Logger
	http  *http.Server
	ctx   context.Context // cancelled by Close; parent of every connection
	stop  context.CancelFunc
	cbMu  sync.Mutex // serializes state changes with their callbacks
	mu    sync.Mutex
	conns map[*workerConn]struct{} // every live connection, admitted or not
	// workers maps an environment to its admitted connection.
	workers map[string]*workerConn
	// admitting counts connections past the Capacity.MaxWorkers check and not yet registered.
	admitting int
	// sessionConns maps environment+"\x00"+session to a connection admitted for one session only
	// (a worker's per-turn client); they neither replace nor count as the environment's worker.
	sessionConns map[string]*workerConn
	// pressure holds each environment's backpressure record (see Backpressure).
	pressure map[string]*pressure
	changed  chan struct{} // closed and replaced whenever workers changes
	closed   bool
	wg       sync.WaitGroup

	bmu            sync.Mutex           // guards the budgets below and every workerConn.inflight
	envInflight    map[string]*inflight // environment → calls and bytes in flight
	refreshBuckets map[string]*bucket   // environment → credential refresh tokens
	preAdmission   map[string]int       // tunnel environment ("" untagged) → connections not admitted yet
	refused        refusals             // refusals counted for the next audit window
	inference      int                  // model calls in flight on the gateway
	envInference   map[string]int       // environment → model calls in flight
	callTime       time.Duration        // moving average of model calls' durations (0: none ended yet)
	relay          map[string]*relayBucket
	metrics        *metrics
	refusalsStop   chan struct{} // closed by Close once every connection ended
	refusalsDone   chan struct{} // closed when refusalLoop has flushed for the last time
	watch          *watchdog.Sweeper
	watchStop      context.CancelFunc
	watchDone      chan struct{} // closed when the watchdog has stopped
	closeOnce      sync.Once
}

// Runs is the one record of the turn a session runs, kept by gateway/turns: the turn's row, written
// in the transaction that admits it and ended with it. The hub keeps no copy.
type Runs interface {
	// RunningTurn returns the run id and run epoch of the session's running worker turn; ok false
	// when none runs.
	RunningTurn(ctx context.Context, sessionID string) (runID string, runEpoch uint64, ok bool, err error)
}

// Yields is implemented by a Runs whose runs a live move can stop at their next model call: the
// hub answers that call protocol.CodeRunYield and the worker's run ends there.
type Yields interface {
	Yielding(sessionID, runID string) bool
}

// AdmissionProofSkew bounds how far a worker's admission proof may be signed from the gateway's time.
const AdmissionProofSkew = 2 * time.Minute

// New returns a Server; it serves nothing until Serve.
func New(cfg Config) (*Server, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	ctx, stop := context.WithCancel(context.Background())
	s := &Server{
		cfg: cfg, log: cfg.Log, ctx: ctx, stop: stop,
		conns: map[*workerConn]struct{}{}, workers: map[string]*workerConn{}, sessionConns: map[string]*workerConn{},
		changed:     make(chan struct{}),
		pressure:    map[string]*pressure{},
		envInflight: map[string]*inflight{}, refreshBuckets: map[string]*bucket{}, preAdmission: map[string]int{},
		envInference: map[string]int{}, relay: map[string]*relayBucket{},
		refused:      refusals{clock: cfg.Clock},
		refusalsStop: make(chan struct{}), refusalsDone: make(chan struct{}),
		watch: watchdog.New(watchdog.Config{ReadTimeout: cfg.HeartbeatTimeout, WriteTimeout: cfg.WriteTimeout,
			Clock: cfg.DeadlineClock}),
		watchDone: make(chan struct{}),
	}
	s.http = &http.Server{
		Handler:           http.HandlerFunc(s.serveHTTP),
		ReadHeaderTimeout: 10 * time.Second,
		MaxHeaderBytes:    16 << 10,
		BaseContext:       func(net.Listener) context.Context { return ctx },
		ConnContext:       connContext,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
	}
	s.metrics = newMetrics(s)
	if cfg.Registerer != nil {
		if err := s.metrics.register(cfg.Registerer); err != nil {
			return nil, fmt.Errorf("hub metrics: %w", err)
		}
	}
	go s.refusalLoop()
	wctx, wstop := context.WithCancel(context.Background())
	s.watchStop = wstop
	go func() {
		defer close(s.watchDone)
		s.watch.Run(wctx)
	}()
	return s, nil
}

// Credentials returns the credential store the server verifies against.
func (s *Server) Credentials() *Credentials { return s.cfg.Credentials }

// Serve accepts worker connections on ln until ln fails or Close. It may be called again with a
// new listener (a re-established tunnel) while admitted workers stay tracked.
func (s *Server) Serve(ln net.Listener) error {
	err := s.http.Serve(gateListener{Listener: ln, s: s})
	if errors.Is(err, http.ErrServerClosed) {
		return ErrClosed
	}
	return err
}

// Close stops every listener and connection, waits (until ctx ends) for connection goroutines to
// finish and writes the last window of refusal counts. Calls after the first return nil.
func (s *Server) Close(ctx context.Context) error {
	var err error
	s.closeOnce.Do(func() { err = s.close(ctx) })
	return err
}

func (s *Server) close(ctx context.Context) error {
	s.mu.Lock()
	s.closed = true
	conns := make([]*workerConn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	s.stop()
	err := s.http.Close()
	for _, c := range conns {
		_ = c.ws.CloseNow()
	}
	err = errors.Join(err, shutdown.Wait(ctx, &s.wg, "worker connections"))
	close(s.refusalsStop) // the last window is flushed even when connections outlived ctx
	select {
	case <-s.refusalsDone:
	case <-ctx.Done():
		err = errors.Join(err, fmt.Errorf("refusal audit still flushing: %w", context.Cause(ctx)))
	}
	s.watchStop()
	select {
	case <-s.watchDone:
	case <-ctx.Done():
		err = errors.Join(err, fmt.Errorf("connection watchdog still closing: %w", context.Cause(ctx)))
	}
	return err
}

// Admitted reports whether envID has an admitted worker connection.
func (s *Server) Admitted(envID string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.workers[envID]
	return ok
}

// AdmissionChanged is closed at the next admission or departure of any worker: a caller reads it
// before it checks Admitted, then waits on it for the next change.
func (s *Server) AdmissionChanged() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.changed
}

// WaitAdmitted waits until envID has an admitted worker.
func (s *Server) WaitAdmitted(ctx context.Context, envID string) error {
	for {
		s.mu.Lock()
		_, ok := s.workers[envID]
		changed, closed := s.changed, s.closed
		s.mu.Unlock()
		if ok {
			return nil
		}
		if closed {
			return ErrClosed
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return fmt.Errorf("wait for worker of %s: %w", envID, ctx.Err())
		case <-s.ctx.Done():
			return ErrClosed
		}
	}
}

// Shutdown tells envID's worker to exit cleanly (a worker.shutdown event). The worker closes the
// connection, which ends its admission.
func (s *Server) Shutdown(ctx context.Context, envID, reason string) error {
	s.mu.Lock()
	wc := s.workers[envID]
	s.mu.Unlock()
	if wc == nil {
		return fmt.Errorf("shut down worker of %s: %w", envID, ErrNotAdmitted)
	}
	ev, err := protocol.NewEvent(protocol.MethodShutdown, wc.nextSeq(), protocol.ShutdownPayload{Reason: reason})
	if err != nil {
		return err
	}
	// A write in progress is bounded by WriteTimeout only; a worker that stops reading while it
	// is told to shut down has its connection cut once ctx ends (a release's deadline holds).
	stop := context.AfterFunc(ctx, func() { _ = wc.ws.CloseNow() })
	defer stop()
	if err := wc.write(ctx, ev); err != nil {
		return fmt.Errorf("shut down worker of %s: %w", envID, err)
	}
	s.log.Info("worker shutdown requested", "env", envID, "reason", reason)
	return nil
}

// Request sends a request to envID's worker (the connection admitted for the environment, not a
// per-session one) and waits for its answer. A refused request returns its *protocol.Error.
func (s *Server) Request(ctx context.Context, envID, method string, params any) (json.RawMessage, error) {
	if !protocol.IsGatewayMethod(method) {
		return nil, fmt.Errorf("request %s: not a gateway method", method)
	}
	s.mu.Lock()
	wc := s.workers[envID]
	s.mu.Unlock()
	if wc == nil {
		return nil, fmt.Errorf("%s to worker of %s: %w", method, envID, ErrNotAdmitted)
	}
	ch := make(chan protocol.Frame, 1)
	wc.mu.Lock()
	wc.reqID++
	id := fmt.Sprintf("g%d", wc.reqID)
	wc.pending[id] = ch
	wc.mu.Unlock()
	defer func() {
		wc.mu.Lock()
		delete(wc.pending, id)
		wc.mu.Unlock()
	}()
	req, err := protocol.Request(id, method, params)
	if err != nil {
		return nil, err
	}
	if err := wc.write(ctx, req); err != nil {
		return nil, fmt.Errorf("%s to worker of %s: %w", method, envID, err)
	}
	select {
	case f := <-ch:
		if !f.OK {
			return nil, f.Error
		}
		return f.Payload, nil
	case <-wc.done:
		return nil, fmt.Errorf("%s to worker of %s: connection lost", method, envID)
	case <-ctx.Done():
		return nil, fmt.Errorf("%s to worker of %s: %w", method, envID, ctx.Err())
	}
}

func (s *Server) serveHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != WorkerPath {
		http.NotFound(w, r)
		return
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		http.Error(w, "closing", http.StatusServiceUnavailable)
		return
	}
	s.wg.Add(1)
	s.mu.Unlock()
	defer s.wg.Done()

	ws, err := websocket.Accept(w, r, nil)
	if err != nil {
		s.log.Debug("worker websocket handshake", "err", err)
		return
	}
	ws.SetReadLimit(protocol.PreAdmissionFrameLimit)
	pc, _ := r.Context().Value(preConnKey{}).(*preConn)
	wc := &workerConn{ws: ws, wd: s.watch.Watch(ws), pre: pc, streamState: streamState{streams: map[string]*stream{}}, callState: callState{calls: map[string]*proxyCall{}},
		pending: map[string]chan protocol.Frame{}, done: make(chan struct{})}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		wc.wd.Release()
		_ = ws.CloseNow()
		return
	}
	s.conns[wc] = struct{}{}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.conns, wc)
		s.dropSlotLocked(wc)
		s.mu.Unlock()
		wc.wd.Release()
		_ = ws.CloseNow()
		close(wc.done)
	}()

	ctx, cancel := context.WithCancel(s.ctx)
	defer cancel()
	if !s.admit(ctx, wc) {
		return
	}
	defer s.release(wc)
	err = s.serveAdmitted(ctx, wc)
	if normalEnd(err) || s.ctx.Err() != nil {
		s.log.Info("worker disconnected", "env", wc.envID)
		return
	}
	s.log.Warn("worker connection lost", "env", wc.envID, "err", err)
}

// normalEnd reports whether a worker connection ended the ordinary way: the worker closed it
// (normal closure, going away) or the gateway did.
func normalEnd(err error) bool {
	switch websocket.CloseStatus(err) {
	case websocket.StatusNormalClosure, websocket.StatusGoingAway:
		return true
	}
	return err == nil || errors.Is(err, context.Canceled) || errors.Is(err, net.ErrClosed)
}

// workerConn is one WebSocket connection.
type workerConn struct {
	ws *websocket.Conn
	// wd bounds the connection's reads (HeartbeatTimeout) and writes (WriteTimeout).
	wd *watchdog.Conn
	// Set once at admission, read-only afterwards.
	envID      string
	cred       Credential
	ownerEpoch uint64
	sessionID  string
	// pre is the accepted connection holding a pre-admission slot (nil when not served by Serve).
	pre *preConn
	// inflight counts the calls of this connection in flight (guarded by Server.bmu).
	inflight inflight
	// slot: the connection holds a Capacity.MaxWorkers reservation (guarded by Server.mu).
	slot bool

	mu      sync.Mutex
	seq     uint64
	reqID   uint64
	pending map[string]chan protocol.Frame // gateway request id → where its answer goes
	done    chan struct{}                  // closed when the connection ends

	streamState
	callState
}

func (wc *workerConn) nextSeq() uint64 {
	wc.mu.Lock()
	defer wc.mu.Unlock()
	wc.seq++
	return wc.seq
}

// write sends one frame; it is safe for concurrent use. ctx bounds the wait for the writes
// ahead; the write itself is bounded by the watchdog (Config.WriteTimeout), which cuts the
// connection, not by a timeout per frame.
func (wc *workerConn) write(ctx context.Context, f protocol.Frame) error {
	b, err := f.Encode()
	if err != nil {
		return err
	}
	return wc.wd.Write(ctx, websocket.MessageText, b)
}

// readFrame reads one text message of at most limit bytes and decodes it. The websocket read
// limit is set to limit, which lets one byte more through, so an oversized frame is detected here
// and answered with frame-too-large instead of an abrupt close.
func readFrame(ctx context.Context, ws *websocket.Conn, limit int) (protocol.Frame, error) {
	typ, r, err := ws.Reader(ctx)
	if err != nil {
		return protocol.Frame{}, err
	}
	b, err := io.ReadAll(io.LimitReader(r, int64(limit)+1))
	if err != nil {
		return protocol.Frame{}, err
	}
	if len(b) > limit {
		return protocol.Frame{}, &protocol.DecodeError{Code: protocol.CodeFrameTooLarge,
			Err: fmt.Errorf("%w: more than %d bytes", protocol.ErrFrameTooLarge, limit)}
	}
	if typ != websocket.MessageText {
		return protocol.Frame{}, &protocol.DecodeError{Code: protocol.CodeInvalidFrame, Err: errors.New("binary message")}
	}
	return protocol.Decode(b, limit)
}

var envIDPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$`)

// admit runs admission on a fresh connection; on rejection it audits, answers and closes.
func (s *Server) admit(ctx context.Context, wc *workerConn) bool {
	rctx, cancel := context.WithTimeout(ctx, s.cfg.AdmissionTimeout)
	f, err := readFrame(rctx, wc.ws, protocol.PreAdmissionFrameLimit)
	cancel()
	reqID := "0"
	if err != nil {
		var de *protocol.DecodeError
		if !errors.As(err, &de) {
			s.log.Debug("worker connection lost before connect", "err", err)
			return false
		}
		s.reject(ctx, wc, reqID, "", protocol.Errorf(de.Code, "%v", de.Err))
		return false
	}
	if f.Type == protocol.TypeReq || f.Type == protocol.TypeCancel {
		reqID = f.ID
	}
	if f.Type != protocol.TypeReq || f.Method != protocol.MethodConnect {
		s.reject(ctx, wc, reqID, "", protocol.Errorf(protocol.CodeExpectedConnect, "first frame must be a connect request"))
		return false
	}
	var p protocol.ConnectParams
	if err := protocol.DecodeParams(f.Params, &p); err != nil {
		s.reject(ctx, wc, reqID, "", protocol.Errorf(protocol.CodeInvalidFrame, "connect params: %v", err))
		return false
	}
	a := p.Admission
	// The claimed environment is hostile input: audit it only if it looks like an id.
	claimedEnv := ""
	if envIDPattern.MatchString(a.EnvironmentID) {
		claimedEnv = a.EnvironmentID
	}
	if p.Role != protocol.RoleWorker {
		s.reject(ctx, wc, reqID, claimedEnv, protocol.Errorf(protocol.CodeInvalidFrame, "role must be %q", protocol.RoleWorker))
		return false
	}
	cred, err := s.cfg.Credentials.Verify(ctx, a.Credential)
	switch {
	case errors.Is(err, ErrUnknownCredential):
		s.reject(ctx, wc, reqID, claimedEnv, protocol.Errorf(protocol.CodeUnauthorized, "unknown worker credential"))
		return false
	case errors.Is(err, ErrCredentialExpired):
		s.reject(ctx, wc, reqID, cred.EnvironmentID, protocol.Errorf(protocol.CodeCredentialExpired,
			"credential %s expired at %s", cred.ShortID(), store.FormatTime(cred.ExpiresAt)))
		return false
	case err != nil:
		s.log.Error("verify worker credential", "err", err)
		s.reject(ctx, wc, reqID, claimedEnv, &protocol.Error{Code: protocol.CodeInternal, Message: "credential check failed", Retryable: true})
		return false
	}
	if a.EnvironmentID != cred.EnvironmentID {
		s.reject(ctx, wc, reqID, cred.EnvironmentID, protocol.Errorf(protocol.CodeWrongEnvironment,
			"credential %s is not for environment %.128q", cred.ShortID(), a.EnvironmentID))
		return false
	}
	env := cred.EnvironmentID
	if wc.pre != nil && wc.pre.tag != "" && wc.pre.tag != env {
		// A credential (perhaps stolen from another box) for an environment other than the tunnel's.
		s.reject(ctx, wc, reqID, wc.pre.tag, protocol.Errorf(protocol.CodeWrongEnvironment,
			"credential %s is for environment %s, but the connection came through the tunnel of %s", cred.ShortID(), env, wc.pre.tag))
		return false
	}
	expected, ok := s.cfg.ExpectedBundle(env)
	if !ok || a.Handshake.BundleHash != cred.BundleHash || a.Handshake.BundleHash != expected {
		s.reject(ctx, wc, reqID, env, protocol.Errorf(protocol.CodeBundleMismatch,
			"bundle %.80q is not the bundle provisioned for %s", a.Handshake.BundleHash, env))
		return false
	}
	if s.cfg.RequireWorkerKey {
		if err := protocol.VerifyAdmission(a); err != nil {
			s.reject(ctx, wc, reqID, env, protocol.Errorf(protocol.CodeUnauthorized, "%v", err))
			return false
		}
		if skew := s.cfg.Clock.Now().Sub(time.UnixMilli(a.SignedAtMs)); skew > AdmissionProofSkew || skew < -AdmissionProofSkew {
			s.reject(ctx, wc, reqID, env, protocol.Errorf(protocol.CodeUnauthorized,
				"the admission proof was signed %s from the gateway's time (at most %s)", skew.Round(time.Second), AdmissionProofSkew))
			return false
		}
	}
	if s.cfg.ExpectedTools != nil {
		if d := protocol.ManifestDiff(s.cfg.ExpectedTools, a.Handshake.Tools); d != "" {
			s.reject(ctx, wc, reqID, env, protocol.Errorf(protocol.CodeBundleMismatch,
				"the worker's tools are not the bundle's: %s", d))
			return false
		}
	}
	if a.Handshake.Version != protocol.ProtocolVersion {
		s.reject(ctx, wc, reqID, env, protocol.Errorf(protocol.CodeUnsupportedVersion,
			"protocol version %d, gateway speaks %d", a.Handshake.Version, protocol.ProtocolVersion))
		return false
	}

	if a.SessionID != "" {
		// A per-session connection: the session must be attached here, with this owner epoch.
		if e := s.bindingError(ctx, env, a.SessionID, a.OwnerEpoch); e != nil {
			s.reject(ctx, wc, reqID, env, e)
			return false
		}
	} else if e := s.takeWorkerSlot(wc, env); e != nil {
		// Nothing is recorded for a worker the gateway has no room for; it retries after the hint.
		s.reject(ctx, wc, reqID, env, e)
		return false
	}
	if wc.pre != nil && !wc.pre.admit() {
		s.log.Info("worker connection reached admission after its deadline", "env", env)
		return false
	}

	features := protocol.NegotiateFeatures(a.Handshake.ProtocolFeatures)
	wc.envID, wc.cred, wc.ownerEpoch, wc.sessionID = env, cred, a.OwnerEpoch, a.SessionID
	detail := fmt.Sprintf("credential %s epoch %d build %.64q features %s", cred.ShortID(), a.OwnerEpoch,
		a.Handshake.BuildVersion, strings.Join(features, ","))
	if err := s.cfg.DB.InTx(ctx, func(tx *sql.Tx) error {
		if s.cfg.RequireWorkerKey {
			if err := s.cfg.Credentials.bindKeyTx(ctx, tx, cred, a.PublicKey); err != nil {
				return err
			}
		}
		// The credential is in use: the ones it replaced (refreshes it descends from) are revoked.
		if err := s.cfg.Credentials.revokeSupersededTx(ctx, tx, cred); err != nil {
			return err
		}
		return store.Audit(ctx, tx, s.cfg.Clock.Now(), "worker.admit", env, detail)
	}); errors.Is(err, ErrOtherKey) {
		s.reject(ctx, wc, reqID, env, protocol.Errorf(protocol.CodeUnauthorized,
			"credential %s is bound to another worker key (a copied credential?)", cred.ShortID()))
		return false
	} else if err != nil {
		s.log.Error("audit worker admission", "env", env, "err", err)
		s.reject(ctx, wc, reqID, "", &protocol.Error{Code: protocol.CodeInternal, Message: "admission not recorded", Retryable: true})
		return false
	}
	res, err := protocol.Response(reqID, protocol.ConnectResult{
		EnvironmentID:         env,
		HeartbeatIntervalMs:   (s.cfg.HeartbeatTimeout / 3).Milliseconds(),
		Features:              features,
		CredentialExpiresInMs: max(cred.ExpiresAt.Sub(s.cfg.Credentials.now()).Milliseconds(), 1),
	})
	if err == nil {
		err = wc.write(ctx, res)
	}
	if err != nil {
		s.log.Warn("worker lost during admission", "env", env, "err", err)
		return false
	}
	s.register(wc)
	s.log.Info("worker admitted", "env", env, "epoch", a.OwnerEpoch, "credential", cred.ShortID())
	return true
}

// reject counts a refused admission for the audit window, answers it and closes the connection.
func (s *Server) reject(ctx context.Context, wc *workerConn, reqID, envID string, e *protocol.Error) {
	s.refused.add("worker.reject", envID, e)
	s.log.Debug("worker rejected", "env", envID, "code", e.Code, "reason", e.Message)
	if err := wc.write(ctx, protocol.ErrorResponse(reqID, e)); err != nil {
		s.log.Debug("answer rejected worker", "err", err)
	}
	status := websocket.StatusPolicyViolation
	switch e.Code {
	case protocol.CodeFrameTooLarge:
		status = websocket.StatusMessageTooBig
	case protocol.CodeCapacityExceeded:
		status = websocket.StatusTryAgainLater
	}
	_ = wc.ws.Close(status, string(e.Code))
}

// register makes wc the admitted connection of its environment, closing any older one. A
// connection admitted for one session replaces only an older one of the same session.
func (s *Server) register(wc *workerConn) {
	s.cbMu.Lock()
	defer s.cbMu.Unlock()
	if wc.sessionID != "" {
		key := wc.envID + "\x00" + wc.sessionID
		s.mu.Lock()
		old := s.sessionConns[key]
		s.sessionConns[key] = wc
		s.mu.Unlock()
		if old != nil {
			s.closeReplaced(old)
		}
		return
	}
	s.mu.Lock()
	old := s.workers[wc.envID]
	s.workers[wc.envID] = wc
	s.dropSlotLocked(wc)
	s.notifyLocked()
	s.mu.Unlock()
	if old != nil {
		s.log.Info("worker connection replaced by a newer one", "env", wc.envID)
		s.closeReplaced(old)
	}
	if s.cfg.OnAdmit != nil {
		s.cfg.OnAdmit(wc.envID)
	}
}

// closeReplaced closes a connection that a newer one replaced, without waiting for it.
func (s *Server) closeReplaced(old *workerConn) {
	s.wg.Add(1) // safe: the caller's handler holds the group open
	go func() {
		defer s.wg.Done()
		_ = old.ws.Close(websocket.StatusPolicyViolation, "replaced by a newer connection")
	}()
}

// release forgets wc if it is still its environment's admitted connection.
func (s *Server) release(wc *workerConn) {
	s.cbMu.Lock()
	defer s.cbMu.Unlock()
	if wc.sessionID != "" {
		key := wc.envID + "\x00" + wc.sessionID
		s.mu.Lock()
		if s.sessionConns[key] == wc {
			delete(s.sessionConns, key)
		}
		s.mu.Unlock()
		return
	}
	s.mu.Lock()
	current := s.workers[wc.envID] == wc
	if current {
		delete(s.workers, wc.envID)
		s.notifyLocked()
	}
	s.mu.Unlock()
	if current && s.cfg.OnDisconnect != nil {
		s.cfg.OnDisconnect(wc.envID)
	}
}

func (s *Server) notifyLocked() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// serveAdmitted reads frames until the connection ends; requests are served as routes says.
func (s *Server) serveAdmitted(ctx context.Context, wc *workerConn) error {
	ctx, cancel := context.WithCancel(ctx)
	defer func() {
		cancel()
		wc.swg.Wait()
	}()
	wc.ws.SetReadLimit(int64(s.cfg.FrameLimit))
	// Reads run on a context that never ends (no timer per frame): the watchdog cuts a read that
	// waits longer than HeartbeatTimeout, and ctx's end closes the connection.
	stop := context.AfterFunc(ctx, func() { _ = wc.ws.CloseNow() })
	defer stop()
	for {
		wc.wd.BeginRead()
		f, err := readFrame(watchdog.Background, wc.ws, s.cfg.FrameLimit)
		wc.wd.EndRead()
		if err != nil {
			err = wc.wd.Err(err)
			var de *protocol.DecodeError
			if errors.As(err, &de) {
				// A malformed frame from an admitted worker is a protocol violation: drop it.
				status := websocket.StatusPolicyViolation
				if de.Code == protocol.CodeFrameTooLarge {
					status = websocket.StatusMessageTooBig
				}
				_ = wc.ws.Close(status, string(de.Code))
			}
			return err
		}
		switch f.Type {
		case protocol.TypeReq:
			if res, now := s.serveRequest(ctx, wc, f); now {
				if err := wc.write(ctx, res); err != nil {
					return err
				}
			}
		case protocol.TypeRes:
			wc.mu.Lock()
			ch := wc.pending[f.ID]
			delete(wc.pending, f.ID)
			wc.mu.Unlock()
			if ch != nil {
				ch <- f // buffered: one answer per request
			}
		case protocol.TypeCancel:
			// A cancel frame names the request it cancels: an in-flight inference call.
			if !wc.cancelRequest(f.ID) {
				s.log.Debug("cancel of no running request", "env", wc.envID, "id", f.ID)
			}
		case protocol.TypeEvent:
			s.log.Debug("ignoring worker event", "env", wc.envID, "event", f.Event)
		}
	}
}

// serveHeartbeat answers worker.heartbeat: any frame read resets the connection's heartbeat timeout.
func (s *Server) serveHeartbeat(_ context.Context, _ *workerConn, f protocol.Frame) protocol.Frame {
	res, _ := protocol.Response(f.ID, struct{}{})
	return res
}

// serveCredentialRefresh answers worker.credential.refresh with a new credential of the same
// binding, at most one per Limits.RefreshInterval per environment (burst Limits.RefreshBurst).
func (s *Server) serveCredentialRefresh(ctx context.Context, wc *workerConn, f protocol.Frame) protocol.Frame {
	if ok, wait := s.refreshAllowed(wc.envID); !ok {
		return protocol.ErrorResponse(f.ID, &protocol.Error{Code: protocol.CodeCapacityExceeded, Retryable: true,
			Message: fmt.Sprintf("credential refreshes are limited to one per %s (burst %d)",
				s.cfg.Limits.RefreshInterval, s.cfg.Limits.RefreshBurst),
			RetryAfterMs: max(wait.Milliseconds(), 1)})
	}
	secret, c, err := s.cfg.Credentials.refreshHash(ctx, wc.cred.ID)
	if err != nil {
		code := protocol.CodeInternal
		switch {
		case errors.Is(err, ErrCredentialExpired):
			code = protocol.CodeCredentialExpired
		case errors.Is(err, ErrUnknownCredential):
			code = protocol.CodeUnauthorized
		}
		s.log.Warn("worker credential refresh", "env", wc.envID, "err", err)
		return protocol.ErrorResponse(f.ID, &protocol.Error{Code: code, Message: "credential refresh failed", Retryable: code == protocol.CodeInternal})
	}
	wc.cred = c // later refreshes on this connection chain from the new credential
	res, _ := protocol.Response(f.ID, protocol.CredentialRefreshResult{
		Credential: secret, ExpiresInMs: c.ExpiresAt.Sub(s.cfg.Credentials.now()).Milliseconds()})
	return res
}

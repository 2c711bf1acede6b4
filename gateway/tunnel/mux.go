package tunnel

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/crypto/ssh"

	"github.com/openclaw/cloudworkers/internal/clock"
	"github.com/openclaw/cloudworkers/internal/shutdown"
)

// ErrHubClosed is returned by Open and Accept once the hub is closed.
var ErrHubClosed = fmt.Errorf("tunnel hub closed: %w", net.ErrClosed)

// ErrTunnelStopped is returned by Open when the tunnel is stopped (CloseEnv, a later Open of the
// same environment, or Close) before its first connection is up.
var ErrTunnelStopped = errors.New("tunnel stopped")

// Status is the state of one environment's tunnel.
type Status string

const (
	StatusStopped      Status = "stopped"
	StatusConnecting   Status = "connecting"   // before the first connection is up
	StatusConnected    Status = "connected"    // control connection up and socket forwarded
	StatusReconnecting Status = "reconnecting" // the connection was lost; redialling
)

// Up reports whether the tunnel carries connections.
func (s Status) Up() bool { return s == StatusConnected }

// Terminal reports whether the tunnel will not change state any more.
func (s Status) Terminal() bool { return s == StatusStopped }

// statusMoves is the table of legal status changes of one tunnel; stopped is terminal.
var statusMoves = map[Status][]Status{
	StatusConnecting:   {StatusConnected, StatusStopped},
	StatusConnected:    {StatusReconnecting, StatusStopped},
	StatusReconnecting: {StatusConnected, StatusStopped},
	StatusStopped:      nil,
}

func (s Status) canMoveTo(next Status) bool {
	for _, n := range statusMoves[s] {
		if n == next {
			return true
		}
	}
	return false
}

// Config configures a Mux. Zero values take the defaults noted on each field.
type Config struct {
	Log *slog.Logger
	// KeepaliveInterval is the pause between keepalive@openssh.com requests (10s).
	KeepaliveInterval time.Duration
	// KeepaliveTimeout is how long a keepalive may go unanswered before the connection is
	// closed and redialled (30s).
	KeepaliveTimeout time.Duration
	// BackoffMin and BackoffMax bound the jittered exponential delay between dials (500ms, 30s).
	BackoffMin time.Duration
	BackoffMax time.Duration
	// DialTimeout bounds one dial with its handshake, and separately the socket setup (15s).
	DialTimeout time.Duration
	// AcceptBacklog is how many forwarded connections may wait for Accept (64); beyond it new
	// connections are closed instead of stalling the forwards.
	AcceptBacklog int
	// TunnelBacklog is how many of them may come from one tunnel (8), so one box cannot fill the
	// backlog the others share.
	TunnelBacklog int
	// OnHostKeyMismatch is called, from the tunnel's goroutine, when a box presents a host key
	// that is not pinned. The tunnel is then stopped for good.
	OnHostKeyMismatch func(envID string, err *HostKeyMismatchError)
	// OnStatus is called, from the tunnel's goroutine and in order for one environment, on every
	// status change. It must not block or call back into the Mux's Open, CloseEnv or Close.
	OnStatus func(envID string, status Status)
	// Clock drives keepalives and backoff; the real clock when nil.
	Clock clock.Clock
}

func (c *Config) setDefaults() {
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&c.KeepaliveInterval, 10*time.Second)
	def(&c.KeepaliveTimeout, 30*time.Second)
	def(&c.BackoffMin, 500*time.Millisecond)
	def(&c.BackoffMax, 30*time.Second)
	def(&c.DialTimeout, 15*time.Second)
	if c.BackoffMax < c.BackoffMin {
		c.BackoffMax = c.BackoffMin
	}
	if c.AcceptBacklog <= 0 {
		c.AcceptBacklog = 64
	}
	if c.TunnelBacklog <= 0 {
		c.TunnelBacklog = min(8, c.AcceptBacklog)
	}
	if c.Clock == nil {
		c.Clock = clock.Real
	}
}

// Validate reports settings that make no sense; NewMux replaces zero values with defaults.
func (c Config) Validate() error {
	for name, d := range map[string]time.Duration{
		"keepalive interval": c.KeepaliveInterval, "keepalive timeout": c.KeepaliveTimeout,
		"backoff min": c.BackoffMin, "backoff max": c.BackoffMax, "dial timeout": c.DialTimeout,
	} {
		if d < 0 {
			return fmt.Errorf("tunnel config: negative %s %v", name, d)
		}
	}
	if c.BackoffMax > 0 && c.BackoffMin > c.BackoffMax {
		return fmt.Errorf("tunnel config: backoff min %v above max %v", c.BackoffMin, c.BackoffMax)
	}
	if c.AcceptBacklog < 0 {
		return fmt.Errorf("tunnel config: negative accept backlog %d", c.AcceptBacklog)
	}
	if c.TunnelBacklog < 0 || (c.AcceptBacklog > 0 && c.TunnelBacklog > c.AcceptBacklog) {
		return fmt.Errorf("tunnel config: tunnel backlog %d must be from 0 to the accept backlog", c.TunnelBacklog)
	}
	return nil
}

// Conn is one connection a worker opened on its forwarded socket.
type Conn struct {
	net.Conn
	EnvironmentID string
	// Epoch is the tunnel epoch of the control connection that carried it.
	Epoch uint64
}

// TunnelEnvironment is the environment whose tunnel carried the connection; the worker hub admits
// on it only a credential of that environment.
func (c *Conn) TunnelEnvironment() string { return c.EnvironmentID }

// Mux receives the forwarded connections of all environments (Accept, or Listener for a server).
// It owns one supervised tunnel per environment.
type Mux struct {
	cfg    Config
	log    *slog.Logger
	queue  chan *Conn
	closed chan struct{}
	wg     sync.WaitGroup // tunnel supervisors

	mu       sync.Mutex
	isClosed bool
	envs     map[string]*tunnel
	epochs   map[string]uint64 // last epoch handed out per environment, kept for the hub's life
	queued   map[string]int    // connections waiting for Accept per environment (≤ TunnelBacklog)

	// reconnects counts tunnels connected again after a loss (openclaw_tunnel_reconnects_total).
	reconnects prometheus.Counter
}

// Collectors are the hub's metrics, for the gateway's registry.
func (h *Mux) Collectors() []prometheus.Collector { return []prometheus.Collector{h.reconnects} }

// NewMux returns a hub with no tunnels.
func NewMux(cfg Config) *Mux {
	cfg.setDefaults()
	return &Mux{
		reconnects: prometheus.NewCounter(prometheus.CounterOpts{Name: "openclaw_tunnel_reconnects_total",
			Help: "Tunnels to boxes connected again after their connection was lost."}),
		cfg:    cfg,
		log:    cfg.Log,
		queue:  make(chan *Conn, cfg.AcceptBacklog), // bounded by the documented backlog
		closed: make(chan struct{}),
		envs:   map[string]*tunnel{},
		epochs: map[string]uint64{},
		queued: map[string]int{},
	}
}

// Accept returns the next forwarded connection of any environment, as a *Conn.
func (h *Mux) Accept() (net.Conn, error) { return h.accept(nil) }

// accept is Accept that also gives up when stop is closed.
func (h *Mux) accept(stop <-chan struct{}) (net.Conn, error) {
	select {
	case <-h.closed:
		return nil, ErrHubClosed
	case <-stop:
		return nil, ErrListenerClosed
	default:
	}
	select {
	case c := <-h.queue:
		h.dequeued(c.EnvironmentID)
		return c, nil
	case <-h.closed:
		return nil, ErrHubClosed
	case <-stop:
		return nil, ErrListenerClosed
	}
}

// ErrListenerClosed is returned by the Accept of a Listener once that listener is closed.
var ErrListenerClosed = fmt.Errorf("tunnel hub listener closed: %w", net.ErrClosed)

// Listener returns a net.Listener of the hub's forwarded connections, for a server to Serve.
// Closing it ends its Accept only: the tunnels run until the Mux's Close.
func (h *Mux) Listener() net.Listener { return &listener{h: h, stop: make(chan struct{})} }

type listener struct {
	h    *Mux
	stop chan struct{}
	once sync.Once
}

var _ net.Listener = (*listener)(nil)

func (l *listener) Accept() (net.Conn, error) { return l.h.accept(l.stop) }
func (l *listener) Addr() net.Addr            { return l.h.Addr() }
func (l *listener) Close() error {
	l.once.Do(func() { close(l.stop) })
	return nil
}

func (h *Mux) dequeued(envID string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.queued[envID]--; h.queued[envID] <= 0 {
		delete(h.queued, envID)
	}
}

// Addr names the hub; it is not a network address.
func (h *Mux) Addr() net.Addr { return hubAddr{} }

type hubAddr struct{}

func (hubAddr) Network() string { return "openclaw-tunnel" }
func (hubAddr) String() string  { return "tunnel-hub" }

// Close stops every tunnel, waits for them until ctx ends, and closes connections nobody
// accepted. It is safe to call more than once.
func (h *Mux) Close(ctx context.Context) error {
	h.mu.Lock()
	first := !h.isClosed
	h.isClosed = true
	all := h.envs
	h.envs = map[string]*tunnel{}
	h.mu.Unlock()
	if first {
		close(h.closed)
	}
	for _, tn := range all {
		tn.stop()
	}
	err := shutdown.Wait(ctx, &h.wg, "tunnel supervisors")
	for {
		select {
		case c := <-h.queue:
			c.Close()
		default:
			return err
		}
	}
}

// Open starts, or replaces, the supervised control connection of t.EnvironmentID. It returns
// once the first connection is up with its socket forwarded (nil), or with the first error. A host
// key mismatch or an invalid target is permanent: the tunnel is stopped before Open returns. On
// other errors the tunnel keeps redialling in the background until CloseEnv or Close. ctx bounds
// only the wait, not the tunnel's life.
func (h *Mux) Open(ctx context.Context, t Target) error {
	if err := t.Validate(); err != nil {
		return err
	}
	h.mu.Lock()
	if h.isClosed {
		h.mu.Unlock()
		return ErrHubClosed
	}
	tn := newTunnel(h, t, h.envs[t.EnvironmentID])
	h.envs[t.EnvironmentID] = tn
	h.wg.Go(tn.run)
	h.mu.Unlock()

	select {
	case err := <-tn.first:
		return err
	case <-tn.done:
		if tn.err != nil {
			return tn.err
		}
		return fmt.Errorf("open tunnel %s: %w", t.EnvironmentID, ErrTunnelStopped)
	case <-ctx.Done():
		return fmt.Errorf("open tunnel %s: %w", t.EnvironmentID, context.Cause(ctx))
	}
}

// CloseEnv stops the tunnel of envID, cancels its forward and waits for it. Connections already
// accepted end with the control connection.
func (h *Mux) CloseEnv(envID string) {
	h.mu.Lock()
	tn := h.envs[envID]
	delete(h.envs, envID)
	h.mu.Unlock()
	if tn != nil {
		tn.stop()
		<-tn.done
	}
}

// Status reports the tunnel status of envID; stopped when the hub has no tunnel for it.
func (h *Mux) Status(envID string) Status {
	if tn := h.tunnel(envID); tn != nil {
		return tn.getStatus()
	}
	return StatusStopped
}

// Client returns the current control connection of envID, or nil when it is not connected.
// Callers may run sessions on it but must not close it.
func (h *Mux) Client(envID string) *ssh.Client {
	if tn := h.tunnel(envID); tn != nil {
		c, _ := tn.current()
		return c
	}
	return nil
}

// Epoch returns the tunnel epoch of envID's current connection, or 0 when it is not connected.
func (h *Mux) Epoch(envID string) uint64 {
	if tn := h.tunnel(envID); tn != nil {
		_, e := tn.current()
		return e
	}
	return 0
}

func (h *Mux) tunnel(envID string) *tunnel {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.envs[envID]
}

// forget removes tn from the hub unless it was replaced already.
func (h *Mux) forget(tn *tunnel) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.envs[tn.target.EnvironmentID] == tn {
		delete(h.envs, tn.target.EnvironmentID)
	}
}

// nextEpoch hands out the next epoch of envID, above base and every epoch handed out before.
func (h *Mux) nextEpoch(envID string, base uint64) uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	e := max(h.epochs[envID], base) + 1
	h.epochs[envID] = e
	return e
}

// deliver queues a forwarded connection for Accept, or closes it when the backlog, or its tunnel's
// share of it, is full.
func (h *Mux) deliver(c *Conn) {
	select {
	case <-h.closed:
		c.Close()
		return
	default:
	}
	h.mu.Lock()
	full := h.queued[c.EnvironmentID] >= h.cfg.TunnelBacklog
	if !full {
		h.queued[c.EnvironmentID]++
	}
	h.mu.Unlock()
	if full {
		h.log.Warn("tunnel's share of the accept backlog full; connection dropped",
			"env", c.EnvironmentID, "epoch", c.Epoch, "tunnelBacklog", h.cfg.TunnelBacklog)
		c.Close()
		return
	}
	select {
	case h.queue <- c:
	default:
		h.dequeued(c.EnvironmentID)
		h.log.Warn("tunnel accept backlog full; connection dropped",
			"env", c.EnvironmentID, "epoch", c.Epoch, "backlog", cap(h.queue))
		c.Close()
	}
}

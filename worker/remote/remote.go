// Package remote is the box side of the worker protocol: it connects to the gateway through the
// tunnelled unix socket, gets admitted, heartbeats and reconnects until told to shut down.
package remote

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

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
	// Tools is the worker's tool manifest, sent at admission (protocol.ToolManifest).
	Tools []protocol.ToolDigest
	// Key is the worker's key, made at launch and never written anywhere: every admission is
	// signed with it (protocol.SignAdmission). Nil: unsigned (a gateway requiring keys refuses).
	Key ed25519.PrivateKey
	// Version is the openclaw build version, reported for logs and audit.
	Version string
	// ProtocolVersion is the protocol version offered; 0 means protocol.ProtocolVersion. Tests only.
	ProtocolVersion int
	// Features are the protocol features offered; nil means protocol.Features.
	Features []string
	Log      *slog.Logger
	// BackoffMin and BackoffMax bound the jittered, doubling reconnect delay. Defaults 250ms and 30s.
	BackoffMin, BackoffMax time.Duration
	// Clock paces heartbeats, reconnects and retries; the real clock when nil.
	Clock clock.Clock
	// DeadlineClock runs each connection's read and write deadlines (its watchdog); the real clock
	// when nil, not Clock, so a test that drives Clock for heartbeats does not also cut connections.
	DeadlineClock clock.Clock
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
	opts := connOptions{serve: cfg.Handler, primary: true}
	err := w.reconnect(ctx, slog.LevelWarn, func(ctx context.Context) (bool, error) { return w.connect(ctx, opts) },
		func(err error) bool {
			var ae *AdmissionError
			return errors.Is(err, errShutdown) || ctx.Err() == nil && errors.As(err, &ae) && ae.Permanent()
		})
	if errors.Is(err, errShutdown) {
		w.log.Info("worker shut down by gateway")
		return nil
	}
	return err
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

// worker is what the connections made from one Config share: the dialer, the newest credential
// and the request ids.
type worker struct {
	cfg    Config
	log    *slog.Logger
	client *http.Client

	credential *Secret // replaced by a successful refresh
	mu         sync.Mutex
	nextID     uint64
}

func (w *worker) id() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.nextID++
	return strconv.FormatUint(w.nextID, 10)
}

func (w *worker) now() time.Time { return w.cfg.Clock.Now() }

// reconnect runs connection after connection until one ends with an error final accepts, which it
// returns, or ctx ends. Between connections it waits a capped, jittered backoff on the config's
// clock that starts over after every admitted connection, and logs the lost one at level.
func (w *worker) reconnect(ctx context.Context, level slog.Level, connect func(context.Context) (admitted bool, err error),
	final func(error) bool) error {
	bo := backoff.Backoff{Min: w.cfg.BackoffMin, Max: w.cfg.BackoffMax, Clock: w.cfg.Clock}
	for {
		admitted, err := connect(ctx)
		if final(err) {
			return err
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if admitted {
			bo.Reset()
		}
		d := bo.Next()
		w.log.Log(ctx, level, "gateway connection lost; reconnecting", "err", err, "in", d)
		if err := bo.Sleep(ctx, d); err != nil {
			return err
		}
	}
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

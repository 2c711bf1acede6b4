package boxaccess

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/labstack/echo/v4"
	"golang.org/x/crypto/ssh"
	"golang.org/x/time/rate"

	"github.com/openclaw/cloudworkers/gateway/envs"
	"github.com/openclaw/cloudworkers/gateway/tunnel"
	"github.com/openclaw/cloudworkers/internal/shutdown"
)

// Deps are what the service works with.
type Deps struct {
	Envs *envs.Manager
	// Dial opens a new SSH connection to an environment's box with its pinned host key.
	Dial func(ctx context.Context, env envs.Environment) (*ssh.Client, error)
	// Audit records one exec or shell (its command, never its output).
	Audit func(ctx context.Context, kind, envID, detail string)
	// StartTimeout bounds dialing the box and starting a command there (box.commandTimeout).
	StartTimeout time.Duration
	Log          *slog.Logger
}

// Service serves the box access routes.
type Service struct {
	cfg  Config
	d    Deps
	ctx  context.Context
	stop context.CancelCauseFunc
	wg   sync.WaitGroup

	mu   sync.Mutex
	open map[string]int // sessions open per environment
}

// New returns a service; Close ends every session it holds.
func New(cfg Config, d Deps) (*Service, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.SetDefaults()
	if d.Log == nil {
		d.Log = slog.New(slog.DiscardHandler)
	}
	if d.StartTimeout <= 0 {
		d.StartTimeout = time.Minute
	}
	if d.Audit == nil {
		d.Audit = func(context.Context, string, string, string) {}
	}
	ctx, stop := context.WithCancelCause(context.Background())
	return &Service{cfg: cfg, d: d, ctx: ctx, stop: stop, open: map[string]int{}}, nil
}

// MaxExtend is the longest extension env extend may ask for.
func (s *Service) MaxExtend() time.Duration { return s.cfg.MaxExtend.D() }

// Close ends every open session and waits for them.
func (s *Service) Close(ctx context.Context) error {
	s.stop(errors.New("the gateway is stopping"))
	return shutdown.Wait(ctx, &s.wg, "box access sessions")
}

// acquire counts one session of envID; release undoes it.
func (s *Service) acquire(envID string) (release func(), err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ctx.Err() != nil {
		return nil, echo.NewHTTPError(http.StatusServiceUnavailable, context.Cause(s.ctx).Error())
	}
	if s.open[envID] >= s.cfg.SessionsPerEnvironment {
		return nil, echo.NewHTTPError(http.StatusTooManyRequests,
			fmt.Sprintf("environment %s already has %d box sessions open (boxAccess.sessionsPerEnvironment)", envID, s.open[envID]))
	}
	s.open[envID]++
	s.wg.Add(1)
	return func() {
		s.mu.Lock()
		if s.open[envID]--; s.open[envID] == 0 {
			delete(s.open, envID)
		}
		s.mu.Unlock()
		s.wg.Done()
	}, nil
}

// usable refuses an environment whose box cannot be reached.
func usable(e envs.Environment) error {
	if !e.State.HasMachine() || e.Lease.SSHHost == "" {
		return fmt.Errorf("environment %s is %s: it has no box to reach: %w", e.ID, e.State, envs.ErrConflict)
	}
	return nil
}

// sessionContext is the life of one session on env's box: it ends with parent, with the service,
// or when the environment leaves the states that have a machine (destroying, failed, orphaned),
// with that as its cause.
func (s *Service) sessionContext(parent context.Context, envID string) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(parent)
	stopSvc := context.AfterFunc(s.ctx, func() { cancel(context.Cause(s.ctx)) })
	go func() {
		e, err := s.d.Envs.WaitFor(ctx, envID, func(e envs.Environment) bool { return !e.State.HasMachine() })
		if err == nil {
			cancel(fmt.Errorf("environment %s is %s: the session on its box was closed", envID, e.State))
		}
	}()
	return ctx, func() { stopSvc(); cancel(context.Canceled) }
}

// dial opens the box connection of one session; it is closed when ctx ends, so no box can hold
// the session past its environment's teardown.
func (s *Service) dial(ctx context.Context, e envs.Environment) (*ssh.Client, error) {
	dctx, cancel := context.WithTimeout(ctx, s.d.StartTimeout)
	defer cancel()
	c, err := s.d.Dial(dctx, e)
	if err != nil {
		if cause := context.Cause(ctx); cause != nil {
			return nil, cause
		}
		return nil, fmt.Errorf("connect to the box of %s: %w", e.ID, err)
	}
	tunnel.CloseOnDone(ctx, c)
	return c, nil
}

// startDeadline closes client when the box has not done what it was asked within StartTimeout
// (a box that never answers the session's open or its command cannot hold the session);
// inTime stops it and reports whether the box was in time.
func (s *Service) startDeadline(client *ssh.Client) (inTime func() bool) {
	return time.AfterFunc(s.d.StartTimeout, func() { _ = client.Close() }).Stop
}

// errStartTimeout is the error of a box that was not in time.
func (s *Service) errStartTimeout(what string) error {
	return fmt.Errorf("the box did not %s within %s (box.commandTimeout)", what, s.d.StartTimeout)
}

// limiter paces box output to boxAccess.outputBytesPerSecond.
func (s *Service) limiter() *rate.Limiter {
	return rate.NewLimiter(rate.Limit(s.cfg.OutputBytesPerSecond), max(s.cfg.OutputBytesPerSecond, s.cfg.MaxFrameBytes))
}

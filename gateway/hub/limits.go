package hub

import (
	"fmt"
	"time"

	"github.com/openclaw/cloudworkers/protocol"
)

// Defaults of Limits.
const (
	DefaultConnCalls         = 4
	DefaultConnBytes         = 64 << 20
	DefaultEnvCalls          = 8
	DefaultEnvBytes          = 128 << 20
	DefaultRefreshInterval   = 10 * time.Second
	DefaultRefreshBurst      = 2
	DefaultPreAdmission      = 8
	DefaultRejectAuditWindow = time.Minute
	DefaultCreditStall       = time.Minute
)

// Limits bound what one worker may hold on the gateway. Zero values take the defaults above.
type Limits struct {
	// ConnCalls and ConnBytes bound the calls in flight on one connection (worker.inference.start,
	// worker.transcript.context, worker.tool.call, each a goroutine) and the bytes of their params
	// (an inference call's context counts). Beyond either, the call is answered capacity-exceeded
	// with retryAfterMs and nothing is started.
	ConnCalls int
	ConnBytes int64
	// EnvCalls and EnvBytes bound the same over all connections of one environment.
	EnvCalls int
	EnvBytes int64
	// RefreshInterval and RefreshBurst rate-limit worker.credential.refresh per environment: a token
	// every RefreshInterval, at most RefreshBurst saved up.
	RefreshInterval time.Duration
	RefreshBurst    int
	// PreAdmission bounds the connections of one tunnel (untagged connections share one budget) that
	// are not admitted yet; a connection beyond it is closed at once.
	PreAdmission int
	// RejectAuditWindow is how often refusals (rejected connections, refused inference calls) are
	// written to the audit log: one row per environment and kind per window, with counts.
	RejectAuditWindow time.Duration
	// CreditStall ends a proxied model call whose worker leaves it without credit this long (the
	// worker grants credit as it reads the call's events): its slots, its bytes and its provider
	// stream are freed, and its terminal says why.
	CreditStall time.Duration
}

func (l *Limits) setDefaults() {
	orDefault(&l.ConnCalls, DefaultConnCalls)
	orDefault(&l.ConnBytes, DefaultConnBytes)
	orDefault(&l.EnvCalls, max(DefaultEnvCalls, l.ConnCalls))
	orDefault(&l.EnvBytes, max(DefaultEnvBytes, l.ConnBytes))
	orDefault(&l.RefreshInterval, DefaultRefreshInterval)
	orDefault(&l.RefreshBurst, DefaultRefreshBurst)
	orDefault(&l.PreAdmission, DefaultPreAdmission)
	orDefault(&l.RejectAuditWindow, DefaultRejectAuditWindow)
	orDefault(&l.CreditStall, DefaultCreditStall)
}

// orDefault sets *v to d when it is zero or negative: a limit left out takes its default.
func orDefault[T ~int | ~int64](v *T, d T) {
	if *v <= 0 {
		*v = d
	}
}

// validate names the first inconsistent limit; frameLimit is the largest request a connection reads.
func (l Limits) validate(frameLimit int) error {
	switch {
	case l.ConnBytes < int64(frameLimit):
		return fmt.Errorf("hub config: Limits.ConnBytes %d is below FrameLimit %d: a largest request could never run", l.ConnBytes, frameLimit)
	case l.EnvCalls < l.ConnCalls:
		return fmt.Errorf("hub config: Limits.EnvCalls %d is below Limits.ConnCalls %d", l.EnvCalls, l.ConnCalls)
	case l.EnvBytes < l.ConnBytes:
		return fmt.Errorf("hub config: Limits.EnvBytes %d is below Limits.ConnBytes %d", l.EnvBytes, l.ConnBytes)
	}
	return nil
}

// releaseOnce is the release of a reservation: undo runs under s.bmu, the first time only (a
// release may be called more than once).
func (s *Server) releaseOnce(undo func()) func() {
	var done bool
	return func() {
		s.bmu.Lock()
		defer s.bmu.Unlock()
		if !done {
			done = true
			undo()
		}
	}
}

// inflight counts calls and bytes in flight, of one connection or one environment.
type inflight struct {
	calls int
	bytes int64
}

// reserve takes a call of n params bytes from wc's and its environment's budgets, or answers
// capacity-exceeded. The returned release gives them back; it is safe to call more than once.
func (s *Server) reserve(wc *workerConn, n int) (release func(), _ *protocol.Error) {
	l := s.cfg.Limits
	s.bmu.Lock()
	env := s.envInflight[wc.envID]
	if env == nil {
		env = &inflight{}
		s.envInflight[wc.envID] = env
	}
	var why string
	switch {
	case wc.inflight.calls+1 > l.ConnCalls:
		why = fmt.Sprintf("%d calls in flight on this connection, at most %d", wc.inflight.calls, l.ConnCalls)
	case wc.inflight.bytes+int64(n) > l.ConnBytes:
		why = fmt.Sprintf("%d bytes in flight on this connection, at most %d", wc.inflight.bytes+int64(n), l.ConnBytes)
	case env.calls+1 > l.EnvCalls:
		why = fmt.Sprintf("%d calls in flight in environment %s, at most %d", env.calls, wc.envID, l.EnvCalls)
	case env.bytes+int64(n) > l.EnvBytes:
		why = fmt.Sprintf("%d bytes in flight in environment %s, at most %d", env.bytes+int64(n), wc.envID, l.EnvBytes)
	}
	if why != "" {
		if env.calls == 0 {
			delete(s.envInflight, wc.envID)
		}
		s.bmu.Unlock()
		return nil, s.capacityError(wc.envID, ReasonCalls, s.cfg.RetryAfter, "%s", why)
	}
	wc.inflight.calls++
	wc.inflight.bytes += int64(n)
	env.calls++
	env.bytes += int64(n)
	s.bmu.Unlock()
	return s.releaseOnce(func() {
		wc.inflight.calls--
		wc.inflight.bytes -= int64(n)
		env.calls--
		env.bytes -= int64(n)
		if env.calls == 0 && s.envInflight[wc.envID] == env {
			delete(s.envInflight, wc.envID)
		}
	}), nil
}

// refreshAllowed takes a credential-refresh token of envID, or returns how long until one is free.
func (s *Server) refreshAllowed(envID string) (ok bool, wait time.Duration) {
	l := s.cfg.Limits
	now := s.cfg.Credentials.now()
	s.bmu.Lock()
	defer s.bmu.Unlock()
	b := s.refreshBuckets[envID]
	if b == nil {
		b = &bucket{tokens: float64(l.RefreshBurst), at: now}
		s.refreshBuckets[envID] = b
	}
	b.tokens = min(float64(l.RefreshBurst), b.tokens+float64(now.Sub(b.at))/float64(l.RefreshInterval))
	b.at = now
	if b.tokens >= 1 {
		b.tokens--
		return true, 0
	}
	return false, time.Duration((1 - b.tokens) * float64(l.RefreshInterval))
}

// bucket is a token bucket of one environment's credential refreshes.
type bucket struct {
	tokens float64
	at     time.Time
}

package hub

import (
	"context"
	"fmt"
	"time"

	"github.com/openclaw/cloudworkers/internal/clock"
	"github.com/openclaw/cloudworkers/protocol"
)

// Defaults of Capacity, chosen from `make bench` on the 2-core reference machine (docs/performance.md).
const (
	DefaultMaxWorkers                 = 500
	DefaultMaxInflightInference       = 512
	DefaultMaxInflightInferencePerEnv = 8
	DefaultMaxRelayBytesPerSecond     = 4 << 20
)

// Reasons of capacity refusals and shedding: the reason label of openclaw_capacity_rejections_total
// and Shedding.Reason.
const (
	ReasonWorkers              = "max-workers"                    // a new worker connection over Capacity.MaxWorkers
	ReasonInferenceGateway     = "max-inflight-inference"         // a call over Capacity.MaxInflightInference
	ReasonInferenceEnvironment = "max-inflight-inference-per-env" // a call over Capacity.MaxInflightInferencePerEnv
	ReasonRelayRate            = "max-relay-bytes-per-second"     // the environment relays more than Capacity.MaxRelayBytesPerSecond
	ReasonCalls                = "worker-calls-in-flight"         // a call over the Limits of calls and bytes in flight
	ReasonStreamQueue          = "stream-queue-full"              // a durable request over a stream's or connection's queue
)

// Capacity bounds what the whole gateway holds, so that load beyond it is refused up front
// (capacity-exceeded with retryAfterMs) instead of slowing every worker. Zero values take the
// defaults above.
type Capacity struct {
	// MaxWorkers bounds the environments with an admitted worker connection; a connection of one
	// more environment is refused at admission (a replacement connection of an admitted
	// environment is not new). Per-session connections of admitted environments do not count.
	MaxWorkers int
	// MaxInflightInference bounds the model calls in flight over the whole gateway, and
	// MaxInflightInferencePerEnv those of one environment.
	MaxInflightInference       int
	MaxInflightInferencePerEnv int
	// MaxRelayBytesPerSecond bounds the inference event bytes relayed to one environment per second
	// (a second's worth may burst). Beyond it the calls in flight are paced, never cut, and a new
	// call is refused until the environment is back under its rate.
	MaxRelayBytesPerSecond int64
}

func (c *Capacity) setDefaults() {
	orDefault(&c.MaxWorkers, DefaultMaxWorkers)
	orDefault(&c.MaxInflightInference, DefaultMaxInflightInference)
	orDefault(&c.MaxInflightInferencePerEnv, min(DefaultMaxInflightInferencePerEnv, c.MaxInflightInference))
	orDefault(&c.MaxRelayBytesPerSecond, DefaultMaxRelayBytesPerSecond)
}

func (c Capacity) validate() error {
	if c.MaxInflightInferencePerEnv > c.MaxInflightInference {
		return fmt.Errorf("hub config: Capacity.MaxInflightInferencePerEnv %d is above Capacity.MaxInflightInference %d",
			c.MaxInflightInferencePerEnv, c.MaxInflightInference)
	}
	return nil
}

// Shedding says why an environment's load is being refused or paced, and since when; zero when it
// is not.
type Shedding struct {
	Reason string    `json:"reason"`
	Since  time.Time `json:"since"`
}

// capacityError is the refusal of one reason, counted and shown as the environment's shedding.
func (s *Server) capacityError(envID, reason string, retryAfter time.Duration, format string, args ...any) *protocol.Error {
	s.CountRejection(reason)
	if envID != "" {
		p := s.pressureOf(envID)
		p.rejected.Add(1)
		p.shed(s.cfg.Clock.Now(), reason)
	}
	return &protocol.Error{Code: protocol.CodeCapacityExceeded, Message: fmt.Sprintf(format, args...), Retryable: true,
		RetryAfterMs: max(retryAfter.Milliseconds(), 1)}
}

// CountRejection counts one capacity refusal of reason made outside the hub (a new environment
// refused by the environment manager) on openclaw_capacity_rejections_total.
func (s *Server) CountRejection(reason string) {
	s.metrics.rejections.WithLabelValues(reason).Inc()
}

// takeWorkerSlot reserves a place among Capacity.MaxWorkers for a new environment connection of
// envID (a replacement of envID's admitted connection needs none); register turns the reservation
// into the admitted worker, dropSlot gives it back.
func (s *Server) takeWorkerSlot(wc *workerConn, envID string) *protocol.Error {
	s.mu.Lock()
	if _, ok := s.workers[envID]; ok {
		s.mu.Unlock()
		return nil
	}
	n := len(s.workers) + s.admitting
	if n < s.cfg.Capacity.MaxWorkers {
		s.admitting++
		wc.slot = true
		s.mu.Unlock()
		return nil
	}
	s.mu.Unlock()
	return s.capacityError(envID, ReasonWorkers, s.cfg.RetryAfter*25,
		"the gateway holds %d workers, at most %d (capacity.maxWorkers)", n, s.cfg.Capacity.MaxWorkers)
}

// inferenceRetryAfter is the retry hint of a model call refused for the calls in flight: a place
// frees when a call ends, so a worker retrying sooner than calls last is mostly refused again
// (`make bench` section 1: a fixed 200 ms made most refusals retries). It is the calls' moving
// average duration, between RetryAfter and 25 × RetryAfter.
func (s *Server) inferenceRetryAfter() time.Duration {
	s.bmu.Lock()
	d := s.callTime
	s.bmu.Unlock()
	return min(max(d, s.cfg.RetryAfter), 25*s.cfg.RetryAfter)
}

// callEnded adds one model call's duration to the moving average inferenceRetryAfter uses.
func (s *Server) callEnded(d time.Duration) {
	s.bmu.Lock()
	defer s.bmu.Unlock()
	if s.callTime == 0 {
		s.callTime = d
		return
	}
	s.callTime += (d - s.callTime) / 8
}

// dropSlotLocked gives back wc's reservation, if it still holds one; s.mu is held.
func (s *Server) dropSlotLocked(wc *workerConn) {
	if wc.slot {
		wc.slot = false
		s.admitting--
	}
}

// Workers returns the number of environments with an admitted worker.
func (s *Server) Workers() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.workers)
}

// reserveInference takes a place among the model calls in flight of the gateway and of wc's
// environment, or answers capacity-exceeded. An environment over its relay rate gets no new call.
func (s *Server) reserveInference(wc *workerConn) (release func(), _ *protocol.Error) {
	c := s.cfg.Capacity
	if wait := s.relayDebt(wc.envID); wait > 0 {
		return nil, s.capacityError(wc.envID, ReasonRelayRate, max(wait, s.cfg.RetryAfter),
			"environment %s relays more than %d bytes/s (capacity.maxRelayBytesPerSecond)", wc.envID, c.MaxRelayBytesPerSecond)
	}
	s.bmu.Lock()
	env := s.envInference[wc.envID]
	switch {
	case s.inference >= c.MaxInflightInference:
		n := s.inference
		s.bmu.Unlock()
		return nil, s.capacityError(wc.envID, ReasonInferenceGateway, s.inferenceRetryAfter(),
			"%d model calls in flight on the gateway, at most %d (capacity.maxInflightInference)", n, c.MaxInflightInference)
	case env >= c.MaxInflightInferencePerEnv:
		s.bmu.Unlock()
		return nil, s.capacityError(wc.envID, ReasonInferenceEnvironment, s.inferenceRetryAfter(),
			"%d model calls in flight in environment %s, at most %d (capacity.maxInflightInferencePerEnvironment)",
			env, wc.envID, c.MaxInflightInferencePerEnv)
	}
	s.inference++
	s.envInference[wc.envID]++
	s.bmu.Unlock()
	return s.releaseOnce(func() {
		s.inference--
		if s.envInference[wc.envID]--; s.envInference[wc.envID] <= 0 {
			delete(s.envInference, wc.envID)
		}
	}), nil
}

// InferenceInflight returns the model calls in flight on the gateway.
func (s *Server) InferenceInflight() int {
	s.bmu.Lock()
	defer s.bmu.Unlock()
	return s.inference
}

// relayBucket is the token bucket of one environment's relayed bytes; tokens go negative while
// a relay is paced.
type relayBucket struct {
	tokens float64
	at     time.Time
}

// relayBucketLocked returns envID's relay bucket refilled up to now; s.bmu is held.
func (s *Server) relayBucketLocked(envID string) *relayBucket {
	rate := float64(s.cfg.Capacity.MaxRelayBytesPerSecond)
	now := s.cfg.Clock.Now()
	b := s.relay[envID]
	if b == nil {
		b = &relayBucket{tokens: rate, at: now}
		s.relay[envID] = b
	}
	b.tokens = min(rate, b.tokens+rate*now.Sub(b.at).Seconds())
	b.at = now
	return b
}

// relayDebt is how long until envID is back under its relay rate (0: it is).
func (s *Server) relayDebt(envID string) time.Duration {
	s.bmu.Lock()
	defer s.bmu.Unlock()
	b := s.relayBucketLocked(envID)
	if b.tokens >= 0 {
		if b.tokens >= float64(s.cfg.Capacity.MaxRelayBytesPerSecond) {
			delete(s.relay, envID) // full: nothing to remember
		}
		return 0
	}
	return time.Duration(-b.tokens / float64(s.cfg.Capacity.MaxRelayBytesPerSecond) * float64(time.Second))
}

// paceRelay takes n bytes of envID's relay rate and waits, on the hub's clock, while the
// environment is over it. The wait is pacing, not a refusal: the bytes are relayed after it.
func (s *Server) paceRelay(ctx context.Context, envID string, n int) error {
	s.bmu.Lock()
	b := s.relayBucketLocked(envID)
	b.tokens -= float64(n)
	debt := b.tokens
	s.bmu.Unlock()
	if debt >= 0 {
		return nil
	}
	s.pressureOf(envID).shed(s.cfg.Clock.Now(), ReasonRelayRate)
	return clock.Sleep(ctx, s.cfg.Clock, time.Duration(-debt/float64(s.cfg.Capacity.MaxRelayBytesPerSecond)*float64(time.Second)))
}

// Capacity returns the server's capacity limits, defaults filled in.
func (s *Server) Capacity() Capacity { return s.cfg.Capacity }

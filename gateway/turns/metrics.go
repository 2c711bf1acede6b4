package turns

import "github.com/prometheus/client_golang/prometheus"

// metrics count turns as they start and end.
type metrics struct {
	started  *prometheus.CounterVec // placement
	finished *prometheus.CounterVec // placement, status
}

func newMetrics() *metrics {
	m := &metrics{
		started: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "openclaw_turns_started_total",
			Help: "Turns admitted, by placement (local, worker)."}, []string{"placement"}),
		finished: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "openclaw_turns_finished_total",
			Help: "Turns ended, by placement and status (done, failed, canceled)."}, []string{"placement", "status"}),
	}
	for _, p := range []string{"local", "worker"} {
		m.started.WithLabelValues(p)
		for _, st := range []TurnStatus{TurnDone, TurnFailed, TurnCanceled} {
			m.finished.WithLabelValues(p, string(st))
		}
	}
	return m
}

// Collectors are the turn service's metrics, for the gateway's registry.
func (s *Service) Collectors() []prometheus.Collector {
	return []prometheus.Collector{s.metrics.started, s.metrics.finished}
}

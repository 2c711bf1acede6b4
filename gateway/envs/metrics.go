package envs

import "github.com/prometheus/client_golang/prometheus"

// provisionBuckets bound the time from an environment's request to its worker's admission.
var provisionBuckets = []float64{0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800}

func newProvisionHistogram() *prometheus.HistogramVec {
	return prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "openclaw_environment_provision_seconds",
		Help:    "Time from an environment's request to ready (leased, bootstrapped, worker admitted; result ready) or to its failure before that (result failed), by provider.",
		Buckets: provisionBuckets}, []string{"provider", "result"})
}

// observeProvision records a provision's end: result ready or failed.
func (m *Manager) observeProvision(e Environment, result string) {
	m.provisionSeconds.WithLabelValues(e.ProviderID, result).Observe(max(0, m.cfg.Clock.Now().Sub(e.CreatedAt)).Seconds())
}

// Collectors are the environment manager's metrics, for the gateway's registry.
func (m *Manager) Collectors() []prometheus.Collector {
	return []prometheus.Collector{m.provisionSeconds}
}

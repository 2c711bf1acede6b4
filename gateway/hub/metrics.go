package hub

import (
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Kinds of durable commits timed by openclaw_commit_duration_seconds.
const (
	commitTranscript = "transcript"
	commitLive       = "live-event"
)

// metrics are the hub's capacity metrics. They are counted whether or not they are registered.
type metrics struct {
	collectors   []prometheus.Collector
	rejections   *prometheus.CounterVec
	relayBytes   prometheus.Counter
	relayLatency prometheus.Histogram
	commits      *prometheus.HistogramVec
}

func newMetrics(s *Server) *metrics {
	m := &metrics{
		rejections: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "openclaw_capacity_rejections_total",
			Help: "Requests refused with capacity-exceeded (and new environments refused with 429), by the limit that refused them."},
			[]string{"reason"}),
		relayBytes: prometheus.NewCounter(prometheus.CounterOpts{Name: "openclaw_relay_bytes_total",
			Help: "Bytes of inference event frames relayed to workers."}),
		relayLatency: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "openclaw_relay_latency_seconds",
			Help:    "Time the gateway adds to one inference event (encoding and writing it to the worker; waiting for credit or rate excluded).",
			Buckets: prometheus.ExponentialBuckets(25e-6, 2, 14)}),
		commits: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "openclaw_commit_duration_seconds",
			Help:    "Time to commit one durable worker request to SQLite (transcript commit or live event), by kind.",
			Buckets: prometheus.ExponentialBuckets(100e-6, 2, 14)}, []string{"kind"}),
	}
	for _, r := range []string{ReasonWorkers, ReasonInferenceGateway, ReasonInferenceEnvironment,
		ReasonRelayRate, ReasonCalls, ReasonStreamQueue} {
		m.rejections.WithLabelValues(r) // every reason shows, at 0, from the start
	}
	m.collectors = []prometheus.Collector{m.rejections, m.relayBytes, m.relayLatency, m.commits,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "openclaw_workers_connected",
			Help: "Environments with an admitted worker connection (bounded by capacity.maxWorkers)."},
			func() float64 { return float64(s.Workers()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "openclaw_inference_inflight",
			Help: "Model calls in flight through the inference proxy (bounded by capacity.maxInflightInference)."},
			func() float64 { return float64(s.InferenceInflight()) }),
	}
	return m
}

func (m *metrics) register(r prometheus.Registerer) error {
	var err error
	for _, c := range m.collectors {
		err = errors.Join(err, r.Register(c))
	}
	return err
}

func (m *metrics) relayed(n int, d time.Duration) {
	m.relayBytes.Add(float64(n))
	m.relayLatency.Observe(d.Seconds())
}

func (m *metrics) committed(kind string, d time.Duration) {
	m.commits.WithLabelValues(kind).Observe(d.Seconds())
}

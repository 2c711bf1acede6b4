package placement

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// syncMetrics measure the workspace transfers: out (dispatch) and in (pull-back, checkpoint).
type syncMetrics struct {
	bytes    *prometheus.CounterVec   // direction
	wire     *prometheus.CounterVec   // direction
	duration *prometheus.HistogramVec // direction, result
}

func newSyncMetrics() *syncMetrics {
	m := &syncMetrics{
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "openclaw_sync_bytes_total",
			Help: "File content carried by workspace syncs (uncompressed; in: with the git bundle), by direction (out: to a box, in: back)."}, []string{"direction"}),
		wire: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "openclaw_sync_wire_bytes_total",
			Help: "Bytes the sync connection's exec channels carried (compressed archives, bundles, manifests, plans), by direction (out: to a box, in: from it)."}, []string{"direction"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "openclaw_sync_duration_seconds",
			Help:    "Duration of workspace syncs by direction and result (ok, failed).",
			Buckets: []float64{0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800}}, []string{"direction", "result"}),
	}
	for _, dir := range []string{"out", "in"} {
		m.bytes.WithLabelValues(dir)
		m.wire.WithLabelValues(dir)
	}
	return m
}

func (m *syncMetrics) observe(direction string, start time.Time, err error) {
	result := "ok"
	if err != nil {
		result = "failed"
	}
	m.duration.WithLabelValues(direction, result).Observe(time.Since(start).Seconds())
}

// countWire adds what one exec channel of a sync connection carried.
func (m *syncMetrics) countWire(sent, received int64) {
	m.wire.WithLabelValues("out").Add(float64(sent))
	m.wire.WithLabelValues("in").Add(float64(received))
}

// Collectors are the dispatcher's metrics, for the gateway's registry.
func (d *Dispatcher) Collectors() []prometheus.Collector {
	return []prometheus.Collector{d.sync.bytes, d.sync.wire, d.sync.duration}
}

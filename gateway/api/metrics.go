package api

import (
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// httpMetrics count the API's requests by method, route template and status.
type httpMetrics struct {
	requests *prometheus.CounterVec   // method, route, status
	duration *prometheus.HistogramVec // method, route
}

// newHTTPMetrics registers the request metrics on reg (nil: counted, not served). A second server
// on the same registry (the metrics listener) shares the first one's series.
func newHTTPMetrics(reg prometheus.Registerer) *httpMetrics {
	m := &httpMetrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "openclaw_http_requests_total",
			Help: "HTTP requests by method, route template and status."}, []string{"method", "route", "status"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "openclaw_http_request_duration_seconds",
			Help: "HTTP request durations by method and route template (WebSocket streams: their whole life).", Buckets: prometheus.DefBuckets},
			[]string{"method", "route"}),
	}
	if reg == nil {
		return m
	}
	m.requests = register(reg, m.requests)
	m.duration = register(reg, m.duration)
	return m
}

func register[C prometheus.Collector](reg prometheus.Registerer, c C) C {
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(C); ok {
				return existing
			}
		}
		panic(err) // a name clash between our own metrics
	}
	return c
}

func (m *httpMetrics) observe(method, route string, status int, took time.Duration) {
	switch method {
	case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete, http.MethodOptions:
	default:
		method = "other" // the label's values stay bounded whatever a client sends
	}
	m.requests.WithLabelValues(method, route, strconv.Itoa(status)).Inc()
	m.duration.WithLabelValues(method, route).Observe(took.Seconds())
}

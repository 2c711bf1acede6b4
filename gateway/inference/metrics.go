package inference

import (
	"errors"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/openclaw/cloudworkers/protocol"
)

// metrics count the catalog's model calls, whether a local turn or a worker (through the hub's
// proxy) made them.
type metrics struct {
	calls  *prometheus.CounterVec // model, result
	tokens *prometheus.CounterVec // model, direction
	cost   *prometheus.CounterVec // model
	errors *prometheus.CounterVec // model, code
}

func newMetrics(models []string) *metrics {
	m := &metrics{
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "openclaw_inference_calls_total",
			Help: "Model calls by model and result (ok, error, aborted)."}, []string{"model", "result"}),
		tokens: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "openclaw_inference_tokens_total",
			Help: "Tokens of model calls by model and direction (in: input and cache, out: output)."}, []string{"model", "direction"}),
		cost: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "openclaw_inference_cost_total",
			Help: "Cost of model calls by model, in the catalog's cost unit (USD)."}, []string{"model"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "openclaw_provider_errors_total",
			Help: "Failed model calls by model and code: the provider's HTTP status, or error when it gave none."}, []string{"model", "code"}),
	}
	for _, ref := range models { // the catalog is small and fixed: every series exists from the start
		for _, r := range []string{"ok", protocol.StopError, protocol.StopAborted} {
			m.calls.WithLabelValues(ref, r)
		}
		m.tokens.WithLabelValues(ref, "in")
		m.tokens.WithLabelValues(ref, "out")
		m.cost.WithLabelValues(ref)
	}
	return m
}

// observe records one call's outcome.
func (m *metrics) observe(ref string, msg protocol.Message, err error) {
	result := "ok"
	if err != nil {
		result = protocol.StopError
		var ce *CallError
		if errors.As(err, &ce) && ce.Reason == protocol.StopAborted {
			result = protocol.StopAborted
		} else {
			code := protocol.StopError
			if ce != nil && ce.Status != 0 {
				code = strconv.Itoa(ce.Status)
			}
			m.errors.WithLabelValues(ref, code).Inc()
		}
	}
	m.calls.WithLabelValues(ref, result).Inc()
	if u := msg.Usage; u != nil {
		m.tokens.WithLabelValues(ref, "in").Add(float64(u.Input + u.CacheRead + u.CacheWrite))
		m.tokens.WithLabelValues(ref, "out").Add(float64(u.Output))
		m.cost.WithLabelValues(ref).Add(u.Cost.Total)
	}
}

// Collectors are the catalog's metrics, for the gateway's registry.
func (c *Catalog) Collectors() []prometheus.Collector {
	return []prometheus.Collector{c.metrics.calls, c.metrics.tokens, c.metrics.cost, c.metrics.errors}
}

package gateway

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/openclaw/cloudworkers/gateway/store"
)

// stateCollector is a gauge of rows by state, counted in SQLite at each scrape; every known state
// is reported, zero when no row is in it.
type stateCollector struct {
	db     *store.DB
	desc   *prometheus.Desc
	states []string
	query  string // SELECT state, COUNT(*) … GROUP BY state
}

func newStateCollector(db *store.DB, name, help, label string, states []string, query string) *stateCollector {
	return &stateCollector{db: db, desc: prometheus.NewDesc(name, help, []string{label}, nil), states: states, query: query}
}

func stateNames[S ~string](states []S) []string {
	out := make([]string, len(states))
	for i, s := range states {
		out[i] = string(s)
	}
	return out
}

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	counts := map[string]float64{}
	for _, s := range c.states {
		counts[s] = 0
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rows, err := c.db.R.QueryContext(ctx, c.query)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(c.desc, err)
		return
	}
	defer rows.Close()
	for rows.Next() {
		var s string
		var n float64
		if rows.Scan(&s, &n) == nil {
			counts[s] = n
		}
	}
	for s, n := range counts {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, n, s)
	}
}

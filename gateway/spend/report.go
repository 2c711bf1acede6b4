package spend

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/openclaw/cloudworkers/gateway/store"
	"github.com/openclaw/cloudworkers/providers"
)

type metrics struct {
	spent     *prometheus.CounterVec // kind, profile
	remaining *prometheus.GaugeVec   // budget
	refusals  *prometheus.CounterVec // budget
}

func (l *Ledger) metrics() *metrics {
	l.metsOnce.Do(func() {
		l.mets = &metrics{
			spent: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "openclaw_spend_usd_total",
				Help: "Spend recorded in the ledger since the gateway started, in US dollars, by kind (model, machine) and profile (empty: the gateway)."}, []string{"kind", "profile"}),
			remaining: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "openclaw_budget_remaining_usd",
				Help: "What a configured budget has left in its window, in US dollars, as last computed (budget list, a reservation)."}, []string{"budget"}),
			refusals: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "openclaw_budget_refusals_total",
				Help: "Model calls, turns and leases refused because they would pass a budget, by budget."}, []string{"budget"}),
		}
		for _, b := range l.all() {
			l.mets.refusals.WithLabelValues(b.ID)
		}
	})
	return l.mets
}

// Collectors are the ledger's metrics, for the gateway's registry.
func (l *Ledger) Collectors() []prometheus.Collector {
	m := l.metrics()
	return []prometheus.Collector{m.spent, m.remaining, m.refusals}
}

func (l *Ledger) refused(budget string) {
	if len(budget) > 8 && budget[:8] == "session:" {
		budget = "session" // one series for every session's own budget
	}
	l.metrics().refusals.WithLabelValues(budget).Inc()
}

// Status is a budget as `openclaw budget list` shows it.
type Status struct {
	Budget
	SpentUSD     float64   `json:"spentUsd"`
	RemainingUSD float64   `json:"remainingUsd"`
	WindowStart  time.Time `json:"windowStart,omitzero"`
	ResetAt      time.Time `json:"resetAt,omitzero"`
	// Warning is set once the spend has passed warnAt of the limit.
	Warning bool `json:"warning"`
	// Exceeded: new turns, model calls and leases it counts are refused.
	Exceeded bool `json:"exceeded"`
}

// Budgets returns every configured budget with its spend in its window now.
func (l *Ledger) Budgets(ctx context.Context) ([]Status, error) {
	now := l.now()
	budgets := l.all()
	out := make([]Status, 0, len(budgets))
	open, err := l.openAccruals(ctx)
	if err != nil {
		return nil, err
	}
	for _, b := range budgets {
		a := l.configured(b, now)
		spent, err := l.spent(ctx, a, open)
		if err != nil {
			return nil, err
		}
		st := Status{Budget: b, SpentUSD: spent, RemainingUSD: max(b.LimitUSD-spent, 0), WindowStart: a.from, ResetAt: a.reset,
			Warning: spent >= b.WarnAt*b.LimitUSD, Exceeded: spent >= b.LimitUSD}
		l.metrics().remaining.WithLabelValues(b.ID).Set(st.RemainingUSD)
		out = append(out, st)
	}
	return out, nil
}

// SessionSpend is a session tree's spend and its own budget, if it has one.
type SessionSpend struct {
	SessionID string  `json:"sessionId"`
	OwnUSD    float64 `json:"ownUsd"`
	TreeUSD   float64 `json:"treeUsd"`
	BudgetUSD float64 `json:"budgetUsd,omitempty"`
}

// Session returns what a session and its tree (its spawned descendants) have spent.
func (l *Ledger) Session(ctx context.Context, sessionID string) (SessionSpend, error) {
	sc, err := l.ScopeOf(ctx, sessionID)
	if err != nil {
		return SessionSpend{}, err
	}
	out := SessionSpend{SessionID: sessionID}
	if err := l.cfg.DB.R.QueryRowContext(ctx, `SELECT COALESCE(SUM(usd),0) FROM spend WHERE pending = 0 AND session_id=?`, sessionID).Scan(&out.OwnUSD); err != nil {
		return out, err
	}
	if err := l.cfg.DB.R.QueryRowContext(ctx, `SELECT COALESCE(SUM(usd),0) FROM spend WHERE pending = 0 AND (lineage = ? OR (lineage >= ? AND lineage < ?))`,
		sc.Lineage, sc.Lineage+"/", sc.Lineage+"0").Scan(&out.TreeUSD); err != nil {
		return out, err
	}
	_ = l.cfg.DB.R.QueryRowContext(ctx, `SELECT usd FROM session_budgets WHERE session_id=?`, sessionID).Scan(&out.BudgetUSD)
	return out, nil
}

// Group keys of the usage report.
var groupKeys = map[string]string{
	"session": "session_id",
	"profile": "profile_id",
	"agent":   "agent",
	"model":   "model",
	"kind":    "kind",
	"day":     "", // by the day of the configured zone, computed below
}

// UsageRow is one line of the usage report.
type UsageRow struct {
	Key              string  `json:"key"`
	USD              float64 `json:"usd"`
	ModelUSD         float64 `json:"modelUsd"`
	MachineUSD       float64 `json:"machineUsd"`
	Calls            int     `json:"calls"`
	InputTokens      int64   `json:"inputTokens"`
	OutputTokens     int64   `json:"outputTokens"`
	CacheReadTokens  int64   `json:"cacheReadTokens"`
	CacheWriteTokens int64   `json:"cacheWriteTokens"`
	MachineSeconds   float64 `json:"machineSeconds"`
}

// MaxUsageRows bounds one usage report.
const MaxUsageRows = 10000

// Usage reports the ledger's rows since since (zero: all), grouped by by (session, profile, agent,
// model, kind or day), largest spend first (by day: oldest first).
func (l *Ledger) Usage(ctx context.Context, by string, since time.Time) ([]UsageRow, error) {
	col, ok := groupKeys[by]
	if !ok {
		return nil, providers.Fieldf("by", "must be session, profile, agent, model, kind or day, got %q", by)
	}
	// ended leases' time goes in first, so the report has it at once
	if err := l.Accrue(ctx); err != nil {
		l.log.Warn("accrue leased time for the usage report", "err", err)
	}
	// Grouped in SQL (settled rows only: a reservation in flight is not spend yet); days by the
	// hour in UTC, folded into the days of the configured zone below.
	key := orConst(col)
	if by == "day" {
		key = "substr(at, 1, 13)"
	}
	q := `SELECT ` + key + `, kind, SUM(usd), COUNT(*), SUM(input_tokens), SUM(output_tokens), SUM(cache_read_tokens), SUM(cache_write_tokens), SUM(seconds)
		FROM spend WHERE pending = 0`
	var args []any
	if !since.IsZero() {
		q += ` AND at >= ?`
		args = append(args, store.FormatTime(since))
	}
	rows, err := l.cfg.DB.R.QueryContext(ctx, q+` GROUP BY 1, 2`, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	byKey := map[string]*UsageRow{}
	var order []string
	for rows.Next() {
		var key, kind string
		var usd, seconds float64
		var n int
		var in, out, cr, cw int64
		if err := rows.Scan(&key, &kind, &usd, &n, &in, &out, &cr, &cw, &seconds); err != nil {
			return nil, err
		}
		if by == "day" {
			hour, err := time.Parse("2006-01-02T15", key)
			if err != nil {
				continue
			}
			key = hour.In(l.cfg.Zone).Format(time.DateOnly)
		}
		r := byKey[key]
		if r == nil {
			if len(byKey) >= MaxUsageRows {
				return nil, fmt.Errorf("more than %d %s rows: narrow the report with --since", MaxUsageRows, by)
			}
			r = &UsageRow{Key: key}
			byKey[key] = r
			order = append(order, key)
		}
		r.USD += usd
		r.InputTokens += in
		r.OutputTokens += out
		r.CacheReadTokens += cr
		r.CacheWriteTokens += cw
		if kind == KindModel {
			r.ModelUSD += usd
			r.Calls += n
		} else {
			r.MachineUSD += usd
			r.MachineSeconds += seconds
		}
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	out := make([]UsageRow, 0, len(order))
	for _, k := range order {
		out = append(out, *byKey[k])
	}
	if by == "day" {
		sortBy(out, func(a, b UsageRow) bool { return a.Key < b.Key })
	} else {
		sortBy(out, func(a, b UsageRow) bool { return a.USD > b.USD || a.USD == b.USD && a.Key < b.Key })
	}
	return out, nil
}

func orConst(col string) string {
	if col == "" {
		return "''"
	}
	return col
}

func sortBy(rows []UsageRow, less func(a, b UsageRow) bool) {
	slices.SortStableFunc(rows, func(a, b UsageRow) int {
		switch {
		case less(a, b):
			return -1
		case less(b, a):
			return 1
		}
		return 0
	})
}

package spend

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/openclaw/cloudworkers/gateway/store"
	"github.com/openclaw/cloudworkers/protocol"
	"github.com/openclaw/cloudworkers/providers"
)

// Settle records a model call's cost from its usage (the catalog's prices) in its reservation's
// row. A call that failed before any usage costs nothing.
func (r *Reservation) Settle(ctx context.Context, model string, u protocol.Usage) {
	if r == nil {
		return
	}
	r.once.Do(func() {
		l := r.l
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		var err error
		if u.Cost.Total > 0 || u.Input > 0 || u.Output > 0 {
			_, err = l.cfg.DB.W.ExecContext(ctx, `UPDATE spend SET at = ?, model = ?, usd = ?, input_tokens = ?, output_tokens = ?,
				cache_read_tokens = ?, cache_write_tokens = ?, pending = 0 WHERE id = ?`,
				store.FormatTime(l.now()), model, u.Cost.Total, u.Input, u.Output, u.CacheRead, u.CacheWrite, r.id)
			if err == nil && u.Cost.Total > 0 {
				l.metrics().spent.WithLabelValues(KindModel, r.scope.ProfileID).Add(u.Cost.Total)
			}
		} else {
			_, err = l.cfg.DB.W.ExecContext(ctx, `DELETE FROM spend WHERE id = ? AND pending = 1`, r.id)
		}
		if err != nil {
			l.log.Error("record a model call's spend", "session", r.scope.SessionID, "model", model, "usd", u.Cost.Total, "err", err)
		}
		if u.Cost.Total > 0 {
			l.warn(ctx, r.scope)
		}
	})
}

// warn announces, once a window, each budget of sc whose spend has passed its warnAt share.
func (l *Ledger) warn(ctx context.Context, sc Scope) {
	bs, err := l.budgetsFor(ctx, sc)
	if err != nil || len(bs) == 0 {
		return
	}
	open, err := l.openAccruals(ctx)
	if err != nil {
		return
	}
	for _, a := range bs {
		spent, err := l.spent(ctx, a, open)
		if err != nil || spent < a.warnAt*a.limit {
			continue
		}
		l.wmu.Lock()
		if l.warned == nil {
			l.warned = map[string]time.Time{}
		}
		w, done := l.warned[a.id]
		first := !done || !w.Equal(a.from)
		l.warned[a.id] = a.from
		l.wmu.Unlock()
		if !first {
			continue
		}
		l.log.Warn("budget past its warning share", "budget", a.id, "spent", spent, "limit", a.limit, "warnAt", a.warnAt)
		if l.cfg.Notify != nil {
			l.cfg.Notify(ChangeBudgetWarning, a.id)
		}
	}
}

// row is one ledger row.
type row struct {
	kind       string
	scope      Scope
	model      string
	usd        float64
	in, out    int64
	cacheRead  int64
	cacheWrite int64
	seconds    float64
	at         time.Time
}

func (l *Ledger) insertTx(ctx context.Context, tx *sql.Tx, r row) error {
	at := r.at
	if at.IsZero() {
		at = l.now()
	}
	_, err := tx.ExecContext(ctx, `INSERT INTO spend(at, kind, session_id, lineage, agent, profile_id, environment_id, model, usd,
		input_tokens, output_tokens, cache_read_tokens, cache_write_tokens, seconds) VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?)`,
		store.FormatTime(at), r.kind, r.scope.SessionID, r.scope.Lineage, r.scope.Agent, r.scope.ProfileID, r.scope.EnvironmentID,
		r.model, r.usd, r.in, r.out, r.cacheRead, r.cacheWrite, r.seconds)
	if err == nil && r.usd > 0 {
		l.metrics().spent.WithLabelValues(r.kind, r.scope.ProfileID).Add(r.usd)
	}
	return err
}

// lease is one environment whose leased time is not all in the ledger yet.
type lease struct {
	envID       string
	scope       Scope
	price       providers.Price
	created     time.Time
	accruedTo   time.Time
	destroyedAt time.Time // zero while leased; its teardown's proof (or its failure: no machine is billed after)
}

// leases returns the environments whose time is not all in the ledger.
func (l *Ledger) leases(ctx context.Context) ([]lease, error) {
	rows, err := l.cfg.DB.R.QueryContext(ctx, `SELECT e.id, e.profile_id, e.profile_snapshot, e.created_at, COALESCE(a.accrued_to, ''),
		COALESCE((SELECT MIN(ev.at) FROM environment_events ev WHERE ev.environment_id = e.id AND ev.to_state IN ('destroyed', 'failed')), ''),
		COALESCE((SELECT s.id FROM sessions s WHERE s.environment_id = e.id LIMIT 1), '')
		FROM environments e LEFT JOIN spend_accrual a ON a.environment_id = e.id WHERE COALESCE(a.closed, 0) = 0`)
	if err != nil {
		return nil, err
	}
	var out []lease
	var sessionIDs []string
	for rows.Next() {
		var ls lease
		var snapshot, created, accrued, destroyed, session string
		if err := rows.Scan(&ls.envID, &ls.scope.ProfileID, &snapshot, &created, &accrued, &destroyed, &session); err != nil {
			rows.Close()
			return nil, err
		}
		var prof providers.Profile
		_ = json.Unmarshal([]byte(snapshot), &prof) // a snapshot without a price is free
		ls.price = prof.Price
		ls.created = store.ParseTime(created)
		ls.accruedTo = ls.created
		if accrued != "" {
			ls.accruedTo = store.ParseTime(accrued)
		}
		if destroyed != "" {
			ls.destroyedAt = store.ParseTime(destroyed)
		}
		ls.scope.EnvironmentID = ls.envID
		out = append(out, ls)
		sessionIDs = append(sessionIDs, session)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	for i, id := range sessionIDs {
		if id == "" || out[i].price.PerHour == 0 {
			continue // a free machine's scope is never charged
		}
		sc, err := l.ScopeOf(ctx, id)
		if err != nil {
			return nil, err
		}
		sc.EnvironmentID, sc.ProfileID = out[i].envID, out[i].scope.ProfileID
		out[i].scope = sc
	}
	return out, nil
}

// due is what a lease owes beyond what is in the ledger, up to until: its time since accruedTo,
// and, once it has ended, what its minimum billing still asks. While it runs the minimum counts
// too (a lease is billed at least that much).
func (ls lease) due(until time.Time) (usd, seconds float64) {
	if ls.price.PerHour == 0 {
		return 0, 0
	}
	seconds = max(until.Sub(ls.accruedTo).Seconds(), 0)
	usd = seconds / 3600 * ls.price.PerHour
	if short := ls.price.MinimumMinutes*60 - until.Sub(ls.created).Seconds(); short > 0 {
		usd += short / 3600 * ls.price.PerHour
	}
	return usd, seconds
}

// until is how far a lease runs now.
func (ls lease) until(now time.Time) time.Time {
	if !ls.destroyedAt.IsZero() && ls.destroyedAt.Before(now) {
		return ls.destroyedAt
	}
	return now
}

// accrual is the part of a lease's cost not yet in the ledger, for budgets.
type accrual struct {
	scope Scope
	usd   float64
}

func (l *Ledger) openAccruals(ctx context.Context) ([]accrual, error) {
	ls, err := l.leases(ctx)
	if err != nil {
		return nil, err
	}
	now := l.now()
	var out []accrual
	for _, x := range ls {
		if usd, _ := x.due(x.until(now)); usd > 0 {
			out = append(out, accrual{scope: x.scope, usd: usd})
		}
	}
	return out, nil
}

// accrueStep is the least stretch of a running lease written as one row (shorter ones wait: the
// budgets count them from the lease itself meanwhile).
const accrueStep = 10 * time.Minute

// Accrue writes the leased time of every environment into the ledger: a running lease's time in
// stretches of at least accrueStep, an ended one's up to its teardown, with its minimum billing,
// after which it is closed. Each row moves the lease's accrued_to in its own transaction, so a
// restart neither loses nor counts a stretch twice.
func (l *Ledger) Accrue(ctx context.Context) error {
	l.accrue.Lock()
	defer l.accrue.Unlock()
	ls, err := l.leases(ctx)
	if err != nil {
		return err
	}
	now := l.now()
	for _, x := range ls {
		until := x.until(now)
		ended := !x.destroyedAt.IsZero()
		if !ended && until.Sub(x.accruedTo) < accrueStep {
			continue
		}
		usd, seconds := x.due(until)
		if !ended {
			usd = seconds / 3600 * x.price.PerHour // the minimum is billed at the end
		}
		err := l.cfg.DB.InTx(ctx, func(tx *sql.Tx) error {
			if usd > 0 || seconds > 0 && x.price.PerHour > 0 {
				if err := l.insertTx(ctx, tx, row{kind: KindMachine, scope: x.scope, usd: usd, seconds: seconds, at: until}); err != nil {
					return err
				}
			}
			closed := 0
			if ended {
				closed = 1
			}
			_, err := tx.ExecContext(ctx, `INSERT INTO spend_accrual(environment_id, accrued_to, closed) VALUES(?,?,?)
				ON CONFLICT(environment_id) DO UPDATE SET accrued_to = excluded.accrued_to, closed = excluded.closed`,
				x.envID, store.FormatTime(until), closed)
			return err
		})
		if err != nil {
			return fmt.Errorf("accrue the leased time of %s: %w", x.envID, err)
		}
	}
	return nil
}

// Run accrues leased time every 30 seconds of the ledger's clock until ctx ends.
func (l *Ledger) Run(ctx context.Context) {
	t := l.clock().NewTicker(30 * time.Second)
	defer t.Stop()
	for {
		if err := l.Accrue(ctx); err != nil && ctx.Err() == nil {
			l.log.Warn("accrue leased time", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C():
		}
	}
}

// ReserveLease admits a new lease of prof against the gateway's and the profile's budgets at its
// minimum billing (or a minute when it has none). Release the reservation once the lease is
// recorded: from then on the lease itself counts.
func (l *Ledger) ReserveLease(ctx context.Context, prof providers.Profile) (*Reservation, error) {
	minutes := max(prof.Price.MinimumMinutes, 1)
	r, err := l.reserve(ctx, Scope{ProfileID: prof.ID}, minutes/60*prof.Price.PerHour, KindMachine)
	var ee *ExceededError
	if errors.As(err, &ee) {
		return nil, fmt.Errorf("a new machine of profile %s: %w", prof.ID, err)
	}
	return r, err
}

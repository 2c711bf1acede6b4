package spend

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"

	"github.com/openclaw/cloudworkers/gateway/store"
	"github.com/openclaw/cloudworkers/providers"
)

// MaxStoredBudgets bounds the budgets set at run time.
const MaxStoredBudgets = 200

// all returns every budget: the config's, then those set at run time.
func (l *Ledger) all() []Budget {
	l.bmu.RLock()
	defer l.bmu.RUnlock()
	return append(slices.Clone(l.cfg.Budgets), l.stored...)
}

func (l *Ledger) loadStored(ctx context.Context) error {
	rows, err := l.cfg.DB.R.QueryContext(ctx, `SELECT budget FROM budgets ORDER BY id`)
	if err != nil {
		return err
	}
	defer rows.Close()
	var out []Budget
	for rows.Next() {
		var raw string
		if err := rows.Scan(&raw); err != nil {
			return err
		}
		var b Budget
		if err := json.Unmarshal([]byte(raw), &b); err != nil {
			return err
		}
		b.Source = "api"
		out = append(out, b)
	}
	if err := rows.Err(); err != nil {
		return err
	}
	l.bmu.Lock()
	l.stored = out
	l.bmu.Unlock()
	return nil
}

// Set creates or replaces a budget set at run time. A budget of the config cannot be changed here
// (its id is refused, naming where it is set).
func (l *Ledger) Set(ctx context.Context, b Budget) error {
	b.Source = ""
	if b.WarnAt == 0 {
		b.WarnAt = 0.8
	}
	if err := b.Check("budget"); err != nil {
		return err
	}
	for _, c := range l.cfg.Budgets {
		if c.ID == b.ID {
			return providers.Fieldf("budget.id", "%q is set in the gateway's config (budgets:); change it there", b.ID)
		}
	}
	raw, _ := json.Marshal(b)
	if err := l.setStored(ctx, b, raw); err != nil {
		return err
	}
	l.metrics().refusals.WithLabelValues(b.ID) // outside bmu: the metrics read the budgets
	return nil
}

func (l *Ledger) setStored(ctx context.Context, b Budget, raw []byte) error {
	l.bmu.Lock()
	defer l.bmu.Unlock()
	exists := slices.ContainsFunc(l.stored, func(o Budget) bool { return o.ID == b.ID })
	if !exists && len(l.stored) >= MaxStoredBudgets {
		return fmt.Errorf("at most %d budgets can be set at run time; remove one first", MaxStoredBudgets)
	}
	if _, err := l.cfg.DB.W.ExecContext(ctx, `INSERT INTO budgets(id, budget, updated_at) VALUES(?,?,?)
		ON CONFLICT(id) DO UPDATE SET budget = excluded.budget, updated_at = excluded.updated_at`, b.ID, string(raw), store.FormatTime(l.now())); err != nil {
		return err
	}
	b.Source = "api"
	l.stored = slices.DeleteFunc(l.stored, func(o Budget) bool { return o.ID == b.ID })
	l.stored = append(l.stored, b)
	return nil
}

// Remove removes a budget set at run time (store.ErrNotFound when there is none; a config budget
// is refused, naming where it is set).
func (l *Ledger) Remove(ctx context.Context, id string) error {
	for _, c := range l.cfg.Budgets {
		if c.ID == id {
			return providers.Fieldf("id", "%q is set in the gateway's config (budgets:); remove it there", id)
		}
	}
	l.bmu.Lock()
	defer l.bmu.Unlock()
	res, err := l.cfg.DB.W.ExecContext(ctx, `DELETE FROM budgets WHERE id = ?`, id)
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("budget %q: %w", id, store.ErrNotFound)
	}
	l.stored = slices.DeleteFunc(l.stored, func(o Budget) bool { return o.ID == id })
	return nil
}

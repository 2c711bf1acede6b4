// Package spend is the gateway's spend ledger and its budgets: every model call (from its usage)
// and every stretch of an environment's leased time is a row of the ledger, and every total — a
// budget's spend, the usage report — is derived from those rows alone.
//
// Budgets hold under concurrency by reservation: before a model call the gateway reserves its
// worst case (the request's input at the input price plus the output limit at the output price)
// and settles it from the call's usage; before a lease it reserves the profile's minimum billing.
// A budget can be overspent by at most what is in flight when it is hit, and the machine time
// that accrues while a lease is running.
package spend

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"sync"
	"time"
	_ "time/tzdata" // day and month windows in spend.timeZone, on hosts without a zone database

	"github.com/openclaw/cloudworkers/gateway/store"
	"github.com/openclaw/cloudworkers/internal/clock"
	"github.com/openclaw/cloudworkers/providers"
)

// Kinds of ledger rows.
const (
	KindModel   = "model"
	KindMachine = "machine"
)

// Scopes and windows of a budget.
const (
	ScopeGateway = "gateway"
	ScopeProfile = "profile"
	ScopeAgent   = "agent"
	ScopeSession = "session" // a session's own budget: its tree (session new --budget)

	WindowDay   = "day"
	WindowMonth = "month"
	WindowTotal = "total"
)

// Budget is one spend limit (config budgets:).
type Budget struct {
	// ID names the budget in refusals and reports.
	ID string `yaml:"id" json:"id"`
	// Scope is what the budget counts: gateway (everything), profile (the spend of sessions on
	// its workers and its machines: Profile), agent (the sessions of an agent: Agent).
	Scope   string `yaml:"scope" json:"scope"`
	Profile string `yaml:"profile,omitempty" json:"profile,omitempty"`
	Agent   string `yaml:"agent,omitempty" json:"agent,omitempty"`
	// Window is day or month (in spend.timeZone) or total.
	Window   string  `yaml:"window" json:"window"`
	LimitUSD float64 `yaml:"limitUsd" json:"limitUsd"`
	// WarnAt is the share of the limit from which the budget reports a warning (default 0.8).
	WarnAt float64 `yaml:"warnAt,omitempty" json:"warnAt,omitempty"`
	// OnExceeded is refuse (the default: no new turn, model call or lease it counts) or stop
	// (also bring the work of its idle machines home and release them).
	OnExceeded string `yaml:"onExceeded,omitempty" json:"onExceeded,omitempty"`
	// Source says where the budget is set: config (the gateway's config file) or api (budget
	// set, kept in the database). Read only.
	Source string `yaml:"-" json:"source,omitempty"`
}

// Policies of a spent budget.
const (
	OnExceededRefuse = "refuse"
	OnExceededStop   = "stop"
)

// Check validates a configured budget; field prefixes the field names in its error.
func (b Budget) Check(field string) error {
	switch {
	case b.ID == "" || len(b.ID) > 64 || strings.ContainsAny(b.ID, " /\t\n"):
		return providers.Fieldf(field+".id", "must be 1-64 characters without spaces or '/', got %.64q", b.ID)
	case b.Scope == ScopeProfile && b.Profile == "":
		return providers.Fieldf(field+".profile", "is required for scope profile")
	case b.Scope == ScopeAgent && b.Agent == "":
		return providers.Fieldf(field+".agent", "is required for scope agent")
	case b.Scope != ScopeGateway && b.Scope != ScopeProfile && b.Scope != ScopeAgent:
		return providers.Fieldf(field+".scope", "must be gateway, profile or agent, got %q", b.Scope)
	case b.Window != WindowDay && b.Window != WindowMonth && b.Window != WindowTotal:
		return providers.Fieldf(field+".window", "must be day, month or total, got %q", b.Window)
	case !(b.LimitUSD > 0 && b.LimitUSD <= 1e9):
		return providers.Fieldf(field+".limitUsd", "must be a positive number of US dollars, got %v", b.LimitUSD)
	case !(b.WarnAt >= 0 && b.WarnAt <= 1):
		return providers.Fieldf(field+".warnAt", "must be a share from 0 to 1, got %v", b.WarnAt)
	case b.OnExceeded != "" && b.OnExceeded != OnExceededRefuse && b.OnExceeded != OnExceededStop:
		return providers.Fieldf(field+".onExceeded", "must be refuse or stop, got %q", b.OnExceeded)
	}
	return nil
}

// Config configures the ledger.
type Config struct {
	DB      *store.DB
	Clock   clock.Clock
	Log     *slog.Logger
	Budgets []Budget
	// Zone is where day and month windows begin (UTC when nil).
	Zone *time.Location
	// AccrueEvery is how often leased time is written to the ledger (default 30s).
	AccrueEvery time.Duration
	// Stop is told when a budget whose policy is stop (a session's own budget always is) refuses
	// something: it brings home the work of the idle machines whose charges match and releases
	// them. At most once a minute per budget; nil: nothing is stopped.
	Stop func(budget string, counts func(Scope) bool)
	// Notify announces a change on the gateway-wide feed (sessions.Store.Notify): a budget past its
	// warnAt share (ChangeBudgetWarning, the budget's id). nil: none.
	Notify func(kind, id string)
}

// ChangeBudgetWarning is the feed's kind for a budget whose spend passed its warnAt share in its
// window (once a window).
const ChangeBudgetWarning = "budget.warning"

// Ledger is the spend ledger.
type Ledger struct {
	cfg Config
	log *slog.Logger

	// admit makes each reservation's check and its pending row one step: two cannot both see
	// the room that only one fits in.
	admit sync.Mutex
	// accrue makes Accrue one at a time: two would charge the same stretch twice.
	accrue sync.Mutex

	mets     *metrics
	metsOnce sync.Once

	wmu    sync.Mutex
	warned map[string]time.Time // budget → the window it warned in

	bmu    sync.RWMutex
	stored []Budget // budget set at run time (the budgets table)

	stopMu   sync.Mutex
	stopped  map[string]time.Time // budget → when its stop was last asked
	stopping map[string]bool      // budget → its stop runs now
}

// stopEvery bounds how often a spent budget's stop runs; stopShare is the share of its limit a
// budget has spent when a refused model call stops what it counts (a refused turn always does).
const (
	stopEvery = time.Minute
	stopShare = 0.95
)

// stop asks Config.Stop, in the background, to release what a spent stop-budget counts.
func (l *Ledger) stop(a applies) {
	if !a.stop || l.cfg.Stop == nil || a.match == nil {
		return
	}
	now := l.now()
	l.stopMu.Lock()
	if l.stopped == nil {
		l.stopped = map[string]time.Time{}
	}
	if last, ok := l.stopped[a.id]; ok && (now.Sub(last) < stopEvery || l.stopping[a.id]) {
		l.stopMu.Unlock()
		return
	}
	if l.stopping == nil {
		l.stopping = map[string]bool{}
	}
	l.stopped[a.id], l.stopping[a.id] = now, true
	l.stopMu.Unlock()
	go func() { // one run at a time per budget
		defer func() {
			l.stopMu.Lock()
			delete(l.stopping, a.id)
			l.stopMu.Unlock()
		}()
		l.cfg.Stop(a.id, a.match)
	}()
}

// Scope is what a charge is for: the session (and its lineage), its agent, and the profile and
// environment it runs on.
type Scope struct {
	SessionID     string
	Lineage       string
	Agent         string
	ProfileID     string
	EnvironmentID string
}

// New returns the ledger; Run accrues leased time until its context ends.
func New(cfg Config) (*Ledger, error) {
	for i, b := range cfg.Budgets {
		if err := b.Check(fmt.Sprintf("budgets[%d]", i)); err != nil {
			return nil, err
		}
		for _, o := range cfg.Budgets[:i] {
			if o.ID == b.ID {
				return nil, providers.Fieldf(fmt.Sprintf("budgets[%d].id", i), "%q is used twice", b.ID)
			}
		}
		if b.WarnAt == 0 {
			cfg.Budgets[i].WarnAt = 0.8
		}
	}
	if cfg.Zone == nil {
		cfg.Zone = time.UTC
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.AccrueEvery <= 0 {
		cfg.AccrueEvery = 30 * time.Second
	}
	for i := range cfg.Budgets {
		cfg.Budgets[i].Source = "config"
	}
	l := &Ledger{cfg: cfg, log: cfg.Log}
	if cfg.DB != nil {
		if err := l.loadStored(context.Background()); err != nil {
			return nil, fmt.Errorf("stored budgets: %w", err)
		}
	}
	return l, nil
}

// Recover settles what a gateway that stopped left pending: a model call's reservation is
// charged at its worst case (the call may have been billed), a lease's is dropped (a lease that
// was made counts on its own). Call it once at start, before any reservation.
func (l *Ledger) Recover(ctx context.Context) error {
	return l.cfg.DB.InTx(ctx, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `DELETE FROM spend WHERE pending = 1 AND kind = ?`, KindMachine); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, `UPDATE spend SET pending = 0 WHERE pending = 1`)
		return err
	})
}

func (l *Ledger) clock() clock.Clock { return clock.Or(l.cfg.Clock) }

func (l *Ledger) now() time.Time { return l.clock().Now() }

// ScopeOf returns what a charge of the session counts against: its lineage, its agent, and the
// profile and environment it is bound to now ("" when it runs on the gateway).
func (l *Ledger) ScopeOf(ctx context.Context, sessionID string) (Scope, error) {
	sc := Scope{SessionID: sessionID}
	if sessionID == "" {
		return sc, nil
	}
	chain := []string{sessionID}
	cur := sessionID
	for range 64 { // spawn depth is far lower; a cycle cannot hold the gateway
		var parent, agent, env string
		err := l.cfg.DB.R.QueryRowContext(ctx, `SELECT parent_session_id, agent, environment_id FROM sessions WHERE id=?`, cur).Scan(&parent, &agent, &env)
		if errors.Is(err, sql.ErrNoRows) {
			break
		}
		if err != nil {
			return sc, err
		}
		if cur == sessionID {
			sc.Agent, sc.EnvironmentID = agent, env
		}
		if parent == "" {
			break
		}
		chain = append([]string{parent}, chain...)
		cur = parent
	}
	sc.Lineage = strings.Join(chain, "/")
	if sc.EnvironmentID != "" {
		if err := l.cfg.DB.R.QueryRowContext(ctx, `SELECT profile_id FROM environments WHERE id=?`, sc.EnvironmentID).Scan(&sc.ProfileID); err != nil && !errors.Is(err, sql.ErrNoRows) {
			return sc, err
		}
	}
	return sc, nil
}

// ExceededError refuses work that would pass a budget: it names the budget, its spend, its limit,
// when its window resets and how to raise it.
type ExceededError struct {
	Budget   string
	SpentUSD float64
	LimitUSD float64
	// AskedUSD is what the refused work reserved (its worst case).
	AskedUSD float64
	// ResetAt is when the window begins again (zero for a total or a session's budget).
	ResetAt time.Time
	// Raise says how to raise the limit.
	Raise string
}

func (e *ExceededError) Error() string {
	reset := "it does not reset"
	if !e.ResetAt.IsZero() {
		reset = "it resets at " + e.ResetAt.Format(time.RFC3339)
	}
	return fmt.Sprintf("budget %s: spent $%.4f of $%.2f, and this needs up to $%.4f more; %s; to raise it, %s",
		e.Budget, e.SpentUSD, e.LimitUSD, e.AskedUSD, reset, e.Raise)
}

// applies is one budget that a charge counts against: its limit, window start and reset, and the
// SQL that selects its rows.
type applies struct {
	id           string
	stop         bool
	limit        float64
	warnAt       float64
	from, reset  time.Time
	where        string
	args         []any
	match        func(Scope) bool
	raise        string
	window       string
	scopeDisplay string
}

// budgetsFor returns the budgets a charge of sc counts against.
func (l *Ledger) budgetsFor(ctx context.Context, sc Scope) ([]applies, error) {
	now := l.now()
	var out []applies
	for _, b := range l.all() {
		if a := l.configured(b, now); a.match(sc) {
			out = append(out, a)
		}
	}
	// the session's own budget and each ancestor's: their trees' totals
	if sc.Lineage != "" {
		ids := strings.Split(sc.Lineage, "/")
		for i, id := range ids {
			var usd float64
			err := l.cfg.DB.R.QueryRowContext(ctx, `SELECT usd FROM session_budgets WHERE session_id=?`, id).Scan(&usd)
			if errors.Is(err, sql.ErrNoRows) {
				continue
			}
			if err != nil {
				return nil, err
			}
			prefix := strings.Join(ids[:i+1], "/")
			out = append(out, applies{id: "session:" + id, limit: usd, warnAt: 0.8, window: WindowTotal, stop: true,
				// the tree: the lineage itself and every one below it ('0' follows '/'), by the index
				where: "(lineage = ? OR (lineage >= ? AND lineage < ?))", args: []any{prefix, prefix + "/", prefix + "0"},
				match: func(s Scope) bool { return s.Lineage == prefix || strings.HasPrefix(s.Lineage, prefix+"/") },
				raise: "start a new session with a larger --budget (a session's budget is set when it is created)", scopeDisplay: "session tree " + id})
		}
	}
	return out, nil
}

// configured is what a configured budget counts now: its window, its rows, and which charges.
func (l *Ledger) configured(b Budget, now time.Time) applies {
	a := applies{id: b.ID, limit: b.LimitUSD, warnAt: b.WarnAt, window: b.Window, stop: b.OnExceeded == OnExceededStop,
		raise: "change limitUsd of budget " + b.ID + " in the gateway's config and restart it"}
	a.from, a.reset = l.window(b.Window, now)
	switch b.Scope {
	case ScopeProfile:
		p := b.Profile
		a.where, a.args, a.scopeDisplay = "profile_id = ?", []any{p}, "profile "+p
		a.match = func(s Scope) bool { return s.ProfileID == p }
	case ScopeAgent:
		ag := b.Agent
		a.where, a.args, a.scopeDisplay = "agent = ?", []any{ag}, "agent "+ag
		a.match = func(s Scope) bool { return s.Agent == ag }
	default: // gateway: everything
		a.where, a.match, a.scopeDisplay = "1=1", func(Scope) bool { return true }, "gateway"
	}
	return a
}

// window returns when the window that holds now began, and when the next begins (zero for total).
func (l *Ledger) window(w string, now time.Time) (time.Time, time.Time) {
	t := now.In(l.cfg.Zone)
	switch w {
	case WindowDay:
		from := time.Date(t.Year(), t.Month(), t.Day(), 0, 0, 0, 0, l.cfg.Zone)
		return from, from.AddDate(0, 0, 1)
	case WindowMonth:
		from := time.Date(t.Year(), t.Month(), 1, 0, 0, 0, 0, l.cfg.Zone)
		return from, from.AddDate(0, 1, 0)
	}
	return time.Time{}, time.Time{}
}

// spent is a budget's spend in its window: the ledger's rows (pending reservations at their worst
// case) and the leased time not yet in it.
func (l *Ledger) spent(ctx context.Context, a applies, open []accrual) (float64, error) {
	q := `SELECT COALESCE(SUM(usd), 0) FROM spend WHERE ` + a.where
	args := append([]any{}, a.args...)
	if !a.from.IsZero() {
		q += ` AND at >= ?`
		args = append(args, store.FormatTime(a.from))
	}
	var usd float64
	if err := l.cfg.DB.R.QueryRowContext(ctx, q, args...).Scan(&usd); err != nil {
		return 0, err
	}
	for _, o := range open {
		if a.match(o.scope) {
			usd += o.usd
		}
	}
	return usd, nil
}

// Reservation is a charge admitted against every budget it counts against; Settle records what it
// cost (once).
type Reservation struct {
	l     *Ledger
	id    int64 // its pending row
	scope Scope
	once  sync.Once
}

// Reserve admits a charge of up to worst USD for sc against every budget it counts against, or
// refuses it with an *ExceededError naming the first budget it would pass. The reservation is a
// pending row of the ledger until it is settled (or released).
func (l *Ledger) Reserve(ctx context.Context, sc Scope, worst float64) (*Reservation, error) {
	return l.reserve(ctx, sc, worst, KindModel)
}

func (l *Ledger) reserve(ctx context.Context, sc Scope, worst float64, kind string) (*Reservation, error) {
	if math.IsNaN(worst) || worst < 0 {
		worst = 0
	}
	bs, err := l.budgetsFor(ctx, sc)
	if err != nil {
		return nil, err
	}
	l.admit.Lock()
	defer l.admit.Unlock()
	if err := l.refuse(ctx, bs, worst, false); err != nil {
		return nil, err
	}
	r := &Reservation{l: l, scope: sc}
	err = l.cfg.DB.InTx(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `INSERT INTO spend(at, kind, session_id, lineage, agent, profile_id, environment_id, usd, pending)
			VALUES(?,?,?,?,?,?,?,?,1)`, store.FormatTime(l.now()), kind, sc.SessionID, sc.Lineage, sc.Agent, sc.ProfileID, sc.EnvironmentID, worst)
		if err != nil {
			return err
		}
		r.id, err = res.LastInsertId()
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("reserve spend: %w", err)
	}
	return r, nil
}

// Release lets a reservation go without a charge (the work did not happen, or counts on its own).
func (r *Reservation) Release() {
	if r == nil {
		return
	}
	r.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := r.l.cfg.DB.W.ExecContext(ctx, `DELETE FROM spend WHERE id = ? AND pending = 1`, r.id); err != nil {
			r.l.log.Error("release a spend reservation", "id", r.id, "err", err)
		}
	})
}

// Admit refuses new work of the session (a turn) while a budget it counts against has less left
// than atLeast (the least its first model call reserves).
func (l *Ledger) Admit(ctx context.Context, sessionID string, atLeast float64) error {
	sc, err := l.ScopeOf(ctx, sessionID)
	if err != nil {
		return err
	}
	bs, err := l.budgetsFor(ctx, sc)
	if err != nil {
		return err
	}
	return l.refuse(ctx, bs, atLeast, true)
}

// refuse returns an *ExceededError for the first of bs that has less left than amount (a turn's
// admission: also one already spent), counting the refusal and, when the budget is spent (a
// refused turn, or a call refused at stopShare of it), asking its stop.
func (l *Ledger) refuse(ctx context.Context, bs []applies, amount float64, admission bool) error {
	if len(bs) == 0 {
		return nil
	}
	open, err := l.openAccruals(ctx)
	if err != nil {
		return err
	}
	for _, a := range bs {
		spent, err := l.spent(ctx, a, open)
		if err != nil {
			return err
		}
		if spent+amount > a.limit || (admission && spent >= a.limit) {
			l.refused(a.id)
			if admission || spent >= stopShare*a.limit {
				l.stop(a) // spent, not only short of one call's worst case
			}
			return &ExceededError{Budget: a.id, SpentUSD: spent, LimitUSD: a.limit, AskedUSD: amount, ResetAt: a.reset, Raise: a.raise}
		}
	}
	return nil
}

// ReserveCall admits a model call of the session that may cost up to worst USD (the catalog's
// meter, through an adapter in the gateway's wiring).
func (l *Ledger) ReserveCall(ctx context.Context, sessionID string, worst float64) (*Reservation, error) {
	sc, err := l.ScopeOf(ctx, sessionID)
	if err != nil {
		return nil, err
	}
	return l.Reserve(ctx, sc, worst)
}

package spend

import (
	"context"
	"errors"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openclaw/cloudworkers/gateway/store"
	"github.com/openclaw/cloudworkers/gateway/store/storetest"
	"github.com/openclaw/cloudworkers/internal/clock"
	"github.com/openclaw/cloudworkers/protocol"
	"github.com/openclaw/cloudworkers/providers"
)

func newLedger(t *testing.T, db *store.DB, clk clock.Clock, zone *time.Location, budgets ...Budget) *Ledger {
	t.Helper()
	l, err := New(Config{DB: db, Clock: clk, Zone: zone, Budgets: budgets})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func exec(t *testing.T, db *store.DB, q string, args ...any) {
	t.Helper()
	if _, err := db.W.ExecContext(context.Background(), q, args...); err != nil {
		t.Fatal(err)
	}
}

// session inserts a session row (parent "" for a root).
func session(t *testing.T, db *store.DB, id, parent string) {
	t.Helper()
	exec(t, db, `INSERT INTO sessions(id, title, agent, model, workspace, owner_epoch, parent_session_id, spawn_tool_call_id, spawn_depth, created_at, updated_at)
		VALUES(?, '', 'main', '', '', 1, ?, '', 0, '2026-12-01T00:00:00Z', '2026-12-01T00:00:00Z')`, id, parent)
}

func usage(usd float64) protocol.Usage {
	return protocol.Usage{Input: 100, Output: 10, Cost: protocol.Cost{Total: usd}}
}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

// A day budget refuses the call that would pass it, naming the budget, its spend, its limit and
// when it resets — midnight in the configured zone — and admits calls again from then.
func TestADayBudgetResetsAtMidnightInItsZone(t *testing.T) {
	ctx := context.Background()
	db := storetest.Open(t)
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Fatal(err)
	}
	// 22:30 UTC on Dec 7 is 23:30 in Berlin: the Berlin day ends in 30 minutes
	clk := clock.NewManual(time.Date(2026, 12, 7, 22, 30, 0, 0, time.UTC))
	l := newLedger(t, db, clk, berlin, Budget{ID: "daily", Scope: ScopeGateway, Window: WindowDay, LimitUSD: 1})
	session(t, db, "ses_a", "")
	r, err := l.ReserveCall(ctx, "ses_a", 0.5)
	if err != nil {
		t.Fatal(err)
	}
	r.Settle(ctx, "p/m", usage(0.7))
	_, err = l.ReserveCall(ctx, "ses_a", 0.4)
	var ee *ExceededError
	if !errors.As(err, &ee) || ee.Budget != "daily" || !near(ee.SpentUSD, 0.7) || ee.LimitUSD != 1 {
		t.Fatalf("the call past the budget: %v, want daily refused at $0.70 of $1", err)
	}
	if want := time.Date(2026, 12, 8, 0, 0, 0, 0, berlin); !ee.ResetAt.Equal(want) || !strings.Contains(err.Error(), "resets at 2026-12-08T00:00:00+01:00") {
		t.Fatalf("resets at %s (%v), want Berlin midnight", ee.ResetAt, err)
	}
	if err := l.Admit(ctx, "ses_a", 0); err != nil {
		t.Fatalf("a turn while the budget still has room: %v", err)
	}
	r, err = l.ReserveCall(ctx, "ses_a", 0.3)
	if err != nil {
		t.Fatal(err)
	}
	r.Settle(ctx, "p/m", usage(0.3))
	if err := l.Admit(ctx, "ses_a", 0); !errors.As(err, &ee) {
		t.Fatalf("a turn once the budget is spent: %v, want refused", err)
	}
	clk.Advance(31 * time.Minute) // 00:01 in Berlin
	if _, err := l.ReserveCall(ctx, "ses_a", 0.9); err != nil {
		t.Fatalf("a call after midnight in Berlin: %v", err)
	}
}

// Reservations hold under concurrency: of 100 calls at once against a budget with room for 10 of
// their worst cases, exactly 10 are admitted, and once each settles at its real (lower) cost the
// budget is overspent by nothing.
func TestConcurrentCallsOverspendByNoMoreThanTheirReservations(t *testing.T) {
	ctx := context.Background()
	db := storetest.Open(t)
	l := newLedger(t, db, clock.NewManual(time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)), nil,
		Budget{ID: "total", Scope: ScopeGateway, Window: WindowTotal, LimitUSD: 1})
	session(t, db, "ses_a", "")
	var wg sync.WaitGroup
	var mu sync.Mutex
	var admitted []*Reservation
	for range 100 {
		wg.Go(func() {
			if r, err := l.ReserveCall(ctx, "ses_a", 0.1); err == nil {
				mu.Lock()
				admitted = append(admitted, r)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(admitted) != 10 {
		t.Fatalf("%d of 100 calls admitted against room for 10", len(admitted))
	}
	for _, r := range admitted {
		r.Settle(ctx, "p/m", usage(0.05))
	}
	st, err := l.Budgets(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !near(st[0].SpentUSD, 0.5) || st[0].Exceeded {
		t.Fatalf("after settling: %+v, want $0.50 spent", st[0])
	}
}

// A child's spend counts against its parent's own budget (the session tree), not against a
// sibling tree; the usage report by session shows each.
func TestASessionTreesBudgetCountsItsChildren(t *testing.T) {
	ctx := context.Background()
	db := storetest.Open(t)
	l := newLedger(t, db, clock.NewManual(time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)), nil)
	session(t, db, "ses_p", "")
	session(t, db, "ses_c", "ses_p")
	session(t, db, "ses_p2", "")       // a root whose id starts like ses_p's
	session(t, db, "ses_c2", "ses_p2") // its child
	exec(t, db, `INSERT INTO session_budgets(session_id, usd) VALUES('ses_p', 1)`)
	for _, s := range []string{"ses_c", "ses_c2", "ses_c2"} {
		r, err := l.ReserveCall(ctx, s, 0.1)
		if err != nil {
			t.Fatal(err)
		}
		r.Settle(ctx, "p/m", usage(0.45))
	}
	_, err := l.ReserveCall(ctx, "ses_c", 0.6)
	var ee *ExceededError
	if !errors.As(err, &ee) || ee.Budget != "session:ses_p" || !near(ee.SpentUSD, 0.45) {
		t.Fatalf("the child's call past its parent's budget: %v, want session:ses_p at $0.45", err)
	}
	if _, err := l.ReserveCall(ctx, "ses_c2", 5); err != nil {
		t.Fatalf("another tree's call: %v", err)
	}
	sp, err := l.Session(ctx, "ses_p")
	if err != nil || !near(sp.TreeUSD, 0.45) || sp.OwnUSD != 0 || sp.BudgetUSD != 1 {
		t.Fatalf("ses_p's spend %+v %v, want its tree's $0.45", sp, err)
	}
	rows, err := l.Usage(ctx, "session", time.Time{})
	if err != nil || len(rows) != 2 || rows[0].Key != "ses_c2" || !near(rows[0].USD, 0.9) || rows[0].Calls != 2 || rows[1].Key != "ses_c" {
		t.Fatalf("usage by session %+v %v", rows, err)
	}
}

// A lease's time is charged at its profile's price from its request to its teardown, its minimum
// billing at the end; a ledger that restarts in the middle neither loses nor counts a stretch
// twice.
func TestLeasedTimeIsChargedOnceAcrossARestart(t *testing.T) {
	ctx := context.Background()
	db := storetest.Open(t)
	start := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	clk := clock.NewManual(start)
	snapshot := `{"id":"paid","provider":"local","price":{"perHour":6,"minimumMinutes":60}}`
	exec(t, db, `INSERT INTO environments(id, profile_id, provider_id, operation_id, state, profile_snapshot, created_at, updated_at, last_activity_at)
		VALUES('env_1', 'paid', 'local', 'op1', 'ready', ?, ?, ?, ?)`, snapshot, store.FormatTime(start), store.FormatTime(start), store.FormatTime(start))
	l := newLedger(t, db, clk, nil, Budget{ID: "machines", Scope: ScopeProfile, Profile: "paid", Window: WindowTotal, LimitUSD: 100})
	total := func(l *Ledger) float64 {
		t.Helper()
		rows, err := l.Usage(ctx, "kind", time.Time{})
		if err != nil {
			t.Fatal(err)
		}
		sum := 0.0
		for _, r := range rows {
			sum += r.MachineUSD
		}
		return sum
	}
	clk.Advance(15 * time.Minute)
	if err := l.Accrue(ctx); err != nil {
		t.Fatal(err)
	}
	if got := total(l); !near(got, 1.5) { // 15 minutes at $6/h
		t.Fatalf("after 15 minutes the ledger has $%v of machine time, want $1.50", got)
	}
	st, _ := l.Budgets(ctx)
	if !near(st[0].SpentUSD, 6) { // the minimum hour counts while the lease runs
		t.Fatalf("the profile's budget counts $%v, want the minimum billing $6", st[0].SpentUSD)
	}
	// a restart: a new ledger over the same rows
	clk.Advance(5 * time.Minute)
	l2 := newLedger(t, db, clk, nil, Budget{ID: "machines", Scope: ScopeProfile, Profile: "paid", Window: WindowTotal, LimitUSD: 100})
	if err := l2.Accrue(ctx); err != nil { // 5 minutes: less than a step, not written yet
		t.Fatal(err)
	}
	if got := total(l2); !near(got, 1.5) {
		t.Fatalf("after the restart $%v, want still $1.50", got)
	}
	clk.Advance(5 * time.Minute)
	exec(t, db, `INSERT INTO environment_events(environment_id, at, from_state, to_state, reason) VALUES('env_1', ?, 'destroying', 'destroyed', 'test')`, store.FormatTime(clk.Now()))
	clk.Advance(time.Hour) // teardown was proven 25 minutes in; time after it is free
	for range 2 {
		if err := l2.Accrue(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if got := total(l2); !near(got, 6) { // 25 minutes used, billed at the 60-minute minimum
		t.Fatalf("the ended lease cost $%v, want its minimum $6", got)
	}
	st, _ = l2.Budgets(ctx)
	if !near(st[0].SpentUSD, 6) {
		t.Fatalf("the budget counts $%v after the lease ended, want $6", st[0].SpentUSD)
	}
}

// A new lease is refused before anything is recorded when its minimum billing would pass a
// budget.
func TestALeaseIsReservedAtItsMinimumBilling(t *testing.T) {
	ctx := context.Background()
	db := storetest.Open(t)
	l := newLedger(t, db, clock.NewManual(time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)), nil,
		Budget{ID: "machines", Scope: ScopeProfile, Profile: "paid", Window: WindowMonth, LimitUSD: 5})
	r, err := l.ReserveLease(ctx, profile("paid", 6, 30)) // $3 at least
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.ReserveLease(ctx, profile("paid", 6, 30)); err == nil || !strings.Contains(err.Error(), "budget machines") {
		t.Fatalf("a second lease past the budget: %v, want refused naming the budget", err)
	}
	r.Release()
	if _, err := l.ReserveLease(ctx, profile("other", 6, 30)); err != nil {
		t.Fatalf("a lease of another profile: %v", err)
	}
}

func profile(id string, perHour, minimumMinutes float64) providers.Profile {
	return providers.Profile{ID: id, Price: providers.Price{PerHour: perHour, MinimumMinutes: minimumMinutes}}
}

// Bad budgets are refused naming the field.
func TestBadBudgetsAreRefused(t *testing.T) {
	for _, tc := range []struct {
		b     Budget
		field string
	}{
		{Budget{ID: "", Scope: ScopeGateway, Window: WindowDay, LimitUSD: 1}, "budgets[0].id"},
		{Budget{ID: "x", Scope: "planet", Window: WindowDay, LimitUSD: 1}, "budgets[0].scope"},
		{Budget{ID: "x", Scope: ScopeProfile, Window: WindowDay, LimitUSD: 1}, "budgets[0].profile"},
		{Budget{ID: "x", Scope: ScopeGateway, Window: "week", LimitUSD: 1}, "budgets[0].window"},
		{Budget{ID: "x", Scope: ScopeGateway, Window: WindowDay, LimitUSD: -1}, "budgets[0].limitUsd"},
		{Budget{ID: "x", Scope: ScopeGateway, Window: WindowDay, LimitUSD: math.NaN()}, "budgets[0].limitUsd"},
		{Budget{ID: "x", Scope: ScopeGateway, Window: WindowDay, LimitUSD: 1, WarnAt: 2}, "budgets[0].warnAt"},
	} {
		_, err := New(Config{Budgets: []Budget{tc.b}})
		if err == nil || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("budget %+v: %v, want a refusal naming %s", tc.b, err, tc.field)
		}
	}
}

// A gateway that dies during a model call leaves its reservation in the ledger: the restarted
// gateway charges it at its worst case (the provider may have billed it) and counts it once; a
// lease's reservation left the same way is dropped (a lease that was made counts on its own).
func TestAReservationSurvivesTheGatewaysDeath(t *testing.T) {
	ctx := context.Background()
	db := storetest.Open(t)
	clk := clock.NewManual(time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC))
	b := Budget{ID: "total", Scope: ScopeGateway, Window: WindowTotal, LimitUSD: 10}
	l := newLedger(t, db, clk, nil, b)
	session(t, db, "ses_a", "")
	done, err := l.ReserveCall(ctx, "ses_a", 1)
	if err != nil {
		t.Fatal(err)
	}
	done.Settle(ctx, "p/m", usage(0.25))
	if _, err := l.ReserveCall(ctx, "ses_a", 2); err != nil { // in flight when the gateway dies
		t.Fatal(err)
	}
	if _, err := l.ReserveLease(ctx, profile("paid", 6, 10)); err != nil { // $1, in flight likewise
		t.Fatal(err)
	}
	// the restart
	l2 := newLedger(t, db, clk, nil, b)
	if err := l2.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	st, err := l2.Budgets(ctx)
	if err != nil || !near(st[0].SpentUSD, 2.25) {
		t.Fatalf("after the restart the budget counts $%v (%v), want $0.25 settled + $2 charged at its worst case", st[0].SpentUSD, err)
	}
	rows, err := l2.Usage(ctx, "kind", time.Time{})
	if err != nil || len(rows) != 1 || rows[0].Key != KindModel || rows[0].Calls != 2 || !near(rows[0].USD, 2.25) {
		t.Fatalf("usage after the restart %+v %v, want 2 model calls, $2.25", rows, err)
	}
	if err := l2.Recover(ctx); err != nil { // a second start changes nothing
		t.Fatal(err)
	}
	if st, _ := l2.Budgets(ctx); !near(st[0].SpentUSD, 2.25) {
		t.Fatalf("a second recovery counted again: $%v", st[0].SpentUSD)
	}
}

// Accrue runs from its loop and from every usage report: run at once, they still charge each
// stretch of leased time once.
func TestConcurrentAccrualsChargeOnce(t *testing.T) {
	ctx := context.Background()
	db := storetest.Open(t)
	start := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	clk := clock.NewManual(start)
	exec(t, db, `INSERT INTO environments(id, profile_id, provider_id, operation_id, state, profile_snapshot, created_at, updated_at, last_activity_at)
		VALUES('env_1', 'paid', 'local', 'op1', 'ready', '{"id":"paid","provider":"local","price":{"perHour":6}}', ?, ?, ?)`,
		store.FormatTime(start), store.FormatTime(start), store.FormatTime(start))
	l := newLedger(t, db, clk, nil)
	clk.Advance(time.Hour)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			if _, err := l.Usage(ctx, "kind", time.Time{}); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	rows, err := l.Usage(ctx, "kind", time.Time{})
	if err != nil || len(rows) != 1 || !near(rows[0].MachineUSD, 6) {
		t.Fatalf("an hour at $6/h accrued by 8 reports at once: %+v %v, want $6 once", rows, err)
	}
}

// A budget set at run time holds like a configured one, survives a restart (it is stored), and
// goes when removed; a configured budget cannot be changed or removed that way.
func TestBudgetsSetAtRunTime(t *testing.T) {
	ctx := context.Background()
	db := storetest.Open(t)
	clk := clock.NewManual(time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC))
	cfg := Budget{ID: "cfg", Scope: ScopeGateway, Window: WindowTotal, LimitUSD: 100}
	l := newLedger(t, db, clk, nil, cfg)
	session(t, db, "ses_a", "")
	if err := l.Set(ctx, Budget{ID: "cfg", Scope: ScopeGateway, Window: WindowDay, LimitUSD: 1}); err == nil || !strings.Contains(err.Error(), "config") {
		t.Fatalf("setting a configured budget: %v, want refused naming the config", err)
	}
	if err := l.Set(ctx, Budget{ID: "live", Scope: ScopeGateway, Window: "week", LimitUSD: 1}); err == nil || !strings.Contains(err.Error(), "window") {
		t.Fatalf("a bad window: %v", err)
	}
	if err := l.Set(ctx, Budget{ID: "live", Scope: ScopeGateway, Window: WindowDay, LimitUSD: 1}); err != nil {
		t.Fatal(err)
	}
	l2 := newLedger(t, db, clk, nil, cfg) // a restart
	var ee *ExceededError
	if _, err := l2.ReserveCall(ctx, "ses_a", 2); !errors.As(err, &ee) || ee.Budget != "live" {
		t.Fatalf("a call past the stored budget after a restart: %v, want refused by live", err)
	}
	st, err := l2.Budgets(ctx)
	if err != nil || len(st) != 2 || st[0].Source != "config" || st[1].ID != "live" || st[1].Source != "api" {
		t.Fatalf("budgets %+v %v, want cfg (config) and live (api)", st, err)
	}
	if err := l2.Remove(ctx, "cfg"); err == nil {
		t.Fatal("removed a configured budget")
	}
	if err := l2.Remove(ctx, "live"); err != nil {
		t.Fatal(err)
	}
	if err := l2.Remove(ctx, "live"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("removing it again: %v, want not found", err)
	}
	if _, err := l2.ReserveCall(ctx, "ses_a", 2); err != nil {
		t.Fatalf("a call once the budget is removed: %v", err)
	}
}

// A budget past its warnAt share is announced once in its window, and again in the next.
func TestABudgetWarnsOnceAWindow(t *testing.T) {
	ctx := context.Background()
	db := storetest.Open(t)
	clk := clock.NewManual(time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC))
	var mu sync.Mutex
	var got []string
	l, err := New(Config{DB: db, Clock: clk, Budgets: []Budget{{ID: "daily", Scope: ScopeGateway, Window: WindowDay, LimitUSD: 1, WarnAt: 0.5}},
		Notify: func(kind, id string) { mu.Lock(); got = append(got, kind+" "+id); mu.Unlock() }})
	if err != nil {
		t.Fatal(err)
	}
	session(t, db, "ses_a", "")
	call := func(usd float64) {
		t.Helper()
		r, err := l.ReserveCall(ctx, "ses_a", 0.1)
		if err != nil {
			t.Fatal(err)
		}
		r.Settle(ctx, "p/m", usage(usd))
	}
	call(0.3)
	call(0.3) // past half of $1
	call(0.1)
	clk.Advance(24 * time.Hour)
	call(0.6) // the next day's window
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 2 || got[0] != ChangeBudgetWarning+" daily" || got[1] != ChangeBudgetWarning+" daily" {
		t.Fatalf("warnings %v, want one on the first day and one on the next", got)
	}
}

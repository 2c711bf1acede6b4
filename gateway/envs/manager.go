package envs

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/openclaw/cloudworkers/gateway/profiles"
	"github.com/openclaw/cloudworkers/gateway/store"
	"github.com/openclaw/cloudworkers/internal/clock"
	"github.com/openclaw/cloudworkers/internal/ids"
	"github.com/openclaw/cloudworkers/internal/shutdown"
	"github.com/openclaw/cloudworkers/providers"
)

// Errors the API maps to HTTP statuses.
var (
	ErrCapacity = errors.New("profile is at its maxEnvironments limit")
	ErrConflict = errors.New("conflict")
	// ErrCapacityExceeded: the gateway is at a capacity limit; a *CapacityError says which and when
	// to retry.
	ErrCapacityExceeded = errors.New("capacity-exceeded")
)

// CapacityError refuses a new environment because the gateway is at a capacity limit. Nothing was
// recorded or leased.
type CapacityError struct {
	Reason     string        // the limit, as in openclaw_capacity_rejections_total{reason}
	Message    string        // what is at its limit, naming the config field
	RetryAfter time.Duration // when asking again makes sense
}

func (e *CapacityError) Error() string { return e.Message }
func (e *CapacityError) Unwrap() error { return ErrCapacityExceeded }

// Bootstrapper brings a leased machine from bootstrapping to ready (installs and admits the worker).
// Until one is configured, environments stay in bootstrapping: readiness is never faked.
type Bootstrapper interface {
	Bootstrap(ctx context.Context, env Environment) error
}

// Resumer is implemented by bootstrappers that can re-attach to a running worker after a gateway
// restart (re-dial the box, re-open the tunnel, relaunch a dead worker, wait for re-admission).
type Resumer interface {
	Resume(ctx context.Context, env Environment) error
}

// Releaser is implemented by bootstrappers that must stop the worker and its tunnel before the
// machine is destroyed. boxSide false (a forced destroy) skips everything that talks to the box.
// Release must return within its own deadline; its error is reported, never a reason not to call
// the provider's destroy.
type Releaser interface {
	Release(ctx context.Context, env Environment, boxSide bool) error
}

// Config configures a Manager.
type Config struct {
	DB        *store.DB
	Profiles  *profiles.Store
	Providers providers.Registry
	GatewayID string
	Log       *slog.Logger
	// ProvisionTimeout bounds one provider Provision call (the command provider has its own
	// per-command timeouts inside this).
	ProvisionTimeout time.Duration
	// RetryMin and RetryMax bound the jittered backoff of destroy retries.
	RetryMin, RetryMax time.Duration
	// SweepInterval is how often the orphan sweep runs; 0 means the default, negative disables it.
	SweepInterval time.Duration
	// LifecycleInterval is how often idle, TTL and renewal policy is applied; 0 means 30s,
	// negative disables it.
	LifecycleInterval time.Duration
	Bootstrapper      Bootstrapper
	// TunnelStatus reports the tunnel state of an environment; nil means "stopped".
	TunnelStatus func(envID string) string
	// Clock tells the time of lifecycle policy and paces destroy retries; the real clock when nil.
	Clock clock.Clock
	// MaxEnvironments bounds the live environments of the gateway (capacity.maxWorkers: each holds
	// a worker); a new one beyond it is refused with a *CapacityError. 0 means unbounded.
	MaxEnvironments int
	// OnRefused is told the reason of each new environment refused with a *CapacityError.
	OnRefused func(reason string)
	// Busy reports whether an environment is in use right now although nothing may pass through
	// the gateway (a session attached to it has a turn in flight: a long tool run); nil means
	// never. A busy environment counts as active for idle policy and provider heartbeats.
	Busy func(envID string) bool
	// AdmitLease admits a new lease of the profile against the spend budgets (its minimum
	// billing), or refuses it before anything is recorded; release is called once the lease is
	// recorded (or not made). nil: no budgets.
	AdmitLease func(ctx context.Context, prof providers.Profile) (release func(), err error)
}

func (c *Config) setDefaults() {
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	if c.ProvisionTimeout == 0 {
		c.ProvisionTimeout = 30 * time.Minute
	}
	if c.RetryMin == 0 {
		c.RetryMin = time.Second
	}
	if c.RetryMax == 0 {
		c.RetryMax = time.Minute
	}
	if c.SweepInterval == 0 {
		c.SweepInterval = 5 * time.Minute
	}
	c.Clock = clock.Or(c.Clock)
	if c.LifecycleInterval == 0 {
		c.LifecycleInterval = 30 * time.Second
	}
}

// Manager runs the environment state machine.
type Manager struct {
	cfg Config
	db  *store.DB
	log *slog.Logger

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu       sync.Mutex
	running  map[string]chan struct{}             // env id → closed when its background job ends
	pending  map[string]func(ctx context.Context) // env id → job asked for while another ran
	booting  map[string]context.CancelFunc        // env id → cancels its running bootstrap
	forced   map[string]bool                      // env ids whose destroy skips box-side cleanup
	act      map[string]*activity                 // env id → activity seen at the gateway
	changed  chan struct{}                        // closed and replaced on every state change
	started  bool
	stopping bool

	provisionSeconds *prometheus.HistogramVec
}

// New returns a Manager; call Start to reconcile and run background work.
func New(cfg Config) *Manager {
	cfg.setDefaults()
	ctx, cancel := context.WithCancel(context.Background())
	return &Manager{cfg: cfg, db: cfg.DB, log: cfg.Log, ctx: ctx, cancel: cancel,
		running: map[string]chan struct{}{}, pending: map[string]func(context.Context){}, changed: make(chan struct{}),
		booting: map[string]context.CancelFunc{}, forced: map[string]bool{}, act: map[string]*activity{}, provisionSeconds: newProvisionHistogram()}
}

// Start reconciles every non-terminal environment with its provider and starts the periodic sweep.
func (m *Manager) Start(ctx context.Context) error {
	m.mu.Lock()
	m.started = true
	m.mu.Unlock()
	if err := m.Reconcile(ctx); err != nil {
		return err
	}
	if m.cfg.LifecycleInterval > 0 {
		// the profiles' lifetime policy: idle auto-stop, TTL and lease renewal
		m.every(m.cfg.LifecycleInterval, func() { m.ApplyLifecycle(m.ctx) })
	}
	if m.cfg.SweepInterval > 0 {
		m.every(m.cfg.SweepInterval, func() {
			if _, err := m.Sweep(m.ctx); err != nil && m.ctx.Err() == nil {
				m.log.Warn("orphan sweep", "err", err)
			}
		})
	}
	return nil
}

// every runs fn every interval until the manager closes.
func (m *Manager) every(interval time.Duration, fn func()) {
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		t := m.cfg.Clock.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-m.ctx.Done():
				return
			case <-t.C():
				fn()
			}
		}
	}()
}

// Close stops background work and waits for it. In-flight provider calls are cancelled; a
// restarted gateway resumes them with the same operation ids.
func (m *Manager) Close(ctx context.Context) error {
	m.mu.Lock()
	m.stopping = true
	m.mu.Unlock()
	m.cancel()
	return shutdown.Wait(ctx, &m.wg, "environment manager")
}

func (m *Manager) notify() {
	m.mu.Lock()
	close(m.changed)
	m.changed = make(chan struct{})
	m.mu.Unlock()
}

// Changed returns a channel closed at the next state change of any environment.
func (m *Manager) Changed() <-chan struct{} {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.changed
}

// goJob runs fn for environment id in the background unless a job for it is already running.
func (m *Manager) goJob(id string, fn func(ctx context.Context)) {
	m.mu.Lock()
	if m.stopping {
		m.mu.Unlock()
		return
	}
	if _, busy := m.running[id]; busy {
		// run it after the current job: a destroy requested while provisioning still runs
		m.pending[id] = fn
		m.mu.Unlock()
		return
	}
	done := make(chan struct{})
	m.running[id] = done
	m.wg.Add(1)
	m.mu.Unlock()
	go func() {
		defer m.wg.Done()
		defer func() {
			m.mu.Lock()
			delete(m.running, id)
			next, again := m.pending[id]
			delete(m.pending, id)
			m.mu.Unlock()
			close(done)
			m.notify()
			if again {
				m.goJob(id, next)
			}
		}()
		fn(m.ctx)
	}()
}

// jobDone returns a channel closed when the current background job of id ends (nil if none).
func (m *Manager) jobDone(id string) <-chan struct{} {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.running[id]
}

// Get returns one environment with its derived fields.
func (m *Manager) Get(ctx context.Context, id string) (Environment, error) {
	e, err := getEnv(ctx, m.db.R, id)
	if err != nil {
		return e, err
	}
	return m.present(e), nil
}

// List returns all environments, newest first. Destroyed ones are included only when all is set.
func (m *Manager) List(ctx context.Context, all bool) ([]Environment, error) {
	where := ``
	if !all {
		where = `WHERE state != 'destroyed' `
	}
	list, err := m.queryEnvs(ctx, where+`ORDER BY created_at DESC, id`)
	for i := range list {
		list[i] = m.present(list[i])
	}
	return list, err
}

func (m *Manager) present(e Environment) Environment {
	now := m.cfg.Clock.Now()
	e.AgeMs = now.Sub(e.CreatedAt).Milliseconds()
	e.IdleMs = now.Sub(e.LastActivityAt).Milliseconds()
	e.TunnelStatus = "stopped"
	if ttl := e.Profile.Lifetime.TTL.D(); ttl > 0 {
		e.TTLDeadline = e.CreatedAt.Add(ttl)
	}
	if m.cfg.TunnelStatus != nil && e.State.HasMachine() {
		e.TunnelStatus = m.cfg.TunnelStatus(e.ID)
	}
	return e
}

// Events returns the recorded state changes of an environment, oldest first.
func (m *Manager) Events(ctx context.Context, id string) ([]Event, error) {
	if _, err := getEnv(ctx, m.db.R, id); err != nil {
		return nil, err
	}
	return store.Query(ctx, m.db.R, func(r store.Scanner) (Event, error) {
		var ev Event
		var at, started string
		var st Step
		if err := r.Scan(&ev.ID, &at, &ev.From, &ev.To, &ev.Reason, &st.Name, &st.Kind, &started, &st.DurationMs,
			&st.Result, &st.ExitCode, &st.Output); err != nil {
			return ev, err
		}
		ev.At = store.ParseTime(at)
		if st.Kind != "" {
			st.StartedAt = store.ParseTime(started)
			st.Detail = strings.TrimPrefix(strings.TrimPrefix(ev.Reason, st.Summary()), ": ")
			ev.Step = &st
		}
		return ev, nil
	}, `SELECT id, at, from_state, to_state, reason, step, step_kind, started_at, duration_ms,
		result, exit_code, output FROM environment_events WHERE environment_id=? ORDER BY id`, id)
}

// WaitFor blocks until cond holds for the environment, or ctx ends.
func (m *Manager) WaitFor(ctx context.Context, id string, cond func(Environment) bool) (Environment, error) {
	for {
		ch := m.Changed()
		e, err := m.Get(ctx, id)
		if err != nil || cond(e) {
			return e, err
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return e, ctx.Err()
		}
	}
}

// Create records the intent to lease a machine for profileID, then provisions it in the
// background. A repeated idempotency key returns the environment created by the first call.
func (m *Manager) Create(ctx context.Context, profileID, idempotencyKey string) (env Environment, created bool, err error) {
	return m.CreateClass(ctx, profileID, idempotencyKey, "")
}

// CreateClass is Create with a machine class that overrides the profile's (settings.class) for this
// environment only; providers without machine classes refuse one.
func (m *Manager) CreateClass(ctx context.Context, profileID, idempotencyKey, class string) (env Environment, created bool, err error) {
	prof, err := m.cfg.Profiles.Get(ctx, profileID)
	if err != nil {
		return env, false, err
	}
	if _, err := m.cfg.Providers.Get(prof.Provider); err != nil {
		return env, false, err
	}
	if class != "" {
		if prof, err = WithClass(prof, class); err != nil {
			return env, false, err
		}
		if err := m.cfg.Providers.ValidateProfile(&prof); err != nil {
			return env, false, err
		}
	}
	snapshot, _ := json.Marshal(prof)
	var id string
	// the budgets' reservation is its own write, made before the lease's transaction (one writer),
	// and only for a lease that will be made: a repeated idempotency key finds its lease
	release := func() {}
	var existing string
	if idempotencyKey != "" {
		_ = m.db.R.QueryRowContext(ctx, `SELECT id FROM environments WHERE idempotency_key=?`, idempotencyKey).Scan(&existing)
	}
	if m.cfg.AdmitLease != nil && existing == "" {
		if release, err = m.cfg.AdmitLease(ctx, prof); err != nil {
			return env, false, err
		}
	}
	defer func() { release() }()
	err = m.db.InTx(ctx, func(tx *sql.Tx) error {
		if idempotencyKey != "" {
			var existing, existingProfile string
			err := tx.QueryRowContext(ctx, `SELECT id, profile_id FROM environments WHERE idempotency_key=?`, idempotencyKey).Scan(&existing, &existingProfile)
			if err == nil {
				if existingProfile != profileID {
					return fmt.Errorf("idempotency key %q was used for profile %q: %w", idempotencyKey, existingProfile, ErrConflict)
				}
				id = existing
				return nil
			}
			if !errors.Is(err, sql.ErrNoRows) {
				return err
			}
		}
		if err := m.admitNew(ctx, tx); err != nil {
			return err
		}

		var live int
		if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM environments WHERE profile_id=? AND state NOT IN ('destroyed','failed','orphaned')`, profileID).Scan(&live); err != nil {
			return err
		}
		if live >= prof.MaxEnvironments {
			return fmt.Errorf("profile %q has %d live environments: %w", profileID, live, ErrCapacity)
		}
		id = ids.New("env_", 8)
		created = true
		now := store.FormatTime(m.cfg.Clock.Now())
		var key any
		if idempotencyKey != "" {
			key = idempotencyKey
		}
		_, err := tx.ExecContext(ctx, `INSERT INTO environments(id, profile_id, provider_id, idempotency_key, operation_id, state,
			profile_snapshot, created_at, updated_at, last_activity_at) VALUES(?,?,?,?,?,?,?,?,?,?)`,
			id, prof.ID, prof.Provider, key, OperationID(m.cfg.GatewayID, id), string(Requested), string(snapshot), now, now, now)
		if err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, `INSERT INTO environment_events(environment_id, at, from_state, to_state, reason) VALUES(?,?,?,?,?)`,
			id, now, "", string(Requested), "created for profile "+prof.ID)
		if err != nil {
			return err
		}
		return store.Audit(ctx, tx, m.cfg.Clock.Now(), "environment.create", id, "profile "+prof.ID)
	})
	if err != nil {
		return env, false, err
	}
	if created {
		m.notify()
		m.goJob(id, func(ctx context.Context) { m.provision(ctx, id); m.chainDestroy(ctx, id) })
	}
	env, err = m.Get(ctx, id)
	return env, created, err
}

// admitNew refuses a new environment while the gateway is at a capacity limit, before anything is
// recorded; tx is the transaction that would record it.
func (m *Manager) admitNew(ctx context.Context, tx *sql.Tx) error {
	var ce *CapacityError
	if m.cfg.MaxEnvironments > 0 {
		var live int
		if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM environments WHERE state NOT IN ('destroyed','failed','orphaned')`).Scan(&live); err != nil {
			return err
		}
		if live >= m.cfg.MaxEnvironments {
			ce = &CapacityError{Reason: EnvironmentsReason, RetryAfter: 30 * time.Second,
				Message: fmt.Sprintf("the gateway holds %d live environments, at most %d (capacity.maxWorkers)", live, m.cfg.MaxEnvironments)}
		}
	}
	if ce == nil {
		return nil
	}
	if m.cfg.OnRefused != nil {
		m.cfg.OnRefused(ce.Reason)
	}
	m.log.Warn("new environment refused", "reason", ce.Reason, "detail", ce.Message)
	return ce
}

// EnvironmentsReason is the CapacityError reason of a gateway at its MaxEnvironments.
const EnvironmentsReason = "max-workers-environments"

// move applies one checked transition in its own transaction.
func (m *Manager) move(ctx context.Context, id string, from, to State, reason string) error {
	err := m.db.InTx(ctx, func(tx *sql.Tx) error { return m.transition(ctx, tx, id, from, to, reason) })
	if err == nil {
		m.log.Info("environment state", "env", id, "from", from, "to", to, "reason", reason)
		m.notify()
	}
	return err
}

// fail moves the environment to failed from whatever live state it is in.
func (m *Manager) fail(ctx context.Context, id, reason string) { m.failStep(ctx, id, reason, nil) }

// failStep is fail with the timeline entry of the step that failed on the transition's event.
func (m *Manager) failStep(ctx context.Context, id, reason string, step *Step) {
	reason = Sanitize(reason)
	var provisioning *Environment // failed before it was ready: a failed provision
	err := m.db.InTx(ctx, func(tx *sql.Tx) error {
		e, err := getEnv(ctx, tx, id)
		if err != nil {
			return err
		}
		if e.State.Dead() || e.State == Destroying {
			return nil
		}
		if err := m.transition(ctx, tx, id, e.State, Failed, reason); err != nil {
			return err
		}
		if e.State == Requested || e.State == Provisioning || e.State == Bootstrapping {
			provisioning = &e
		}
		if err := attachStep(ctx, tx, id, step); err != nil {
			return err
		}
		return store.Audit(ctx, tx, m.cfg.Clock.Now(), "environment.failed", id, reason)
	})
	if err != nil {
		m.log.Error("record environment failure", "env", id, "err", err, "reason", reason)
		return
	}
	if provisioning != nil {
		m.observeProvision(*provisioning, "failed")
	}
	m.log.Warn("environment failed", "env", id, "reason", reason)
	m.notify()
}

func (m *Manager) leaseIDFor(prov providers.Provider, e Environment) string {
	if e.LeaseID != "" {
		return e.LeaseID
	}
	return derivedLeaseID(prov, e.Profile, e.OperationID)
}

// provision runs (or resumes, with the same operation id) the provider call for an environment.
func (m *Manager) provision(ctx context.Context, id string) {
	e, err := getEnv(ctx, m.db.R, id)
	if err != nil {
		m.log.Error("provision: load environment", "env", id, "err", err)
		return
	}
	prov, err := m.cfg.Providers.Get(e.ProviderID)
	if err != nil {
		m.fail(ctx, id, "provision: "+err.Error())
		return
	}
	leaseID := m.leaseIDFor(prov, e)
	if e.State == Requested {
		// The lease id is derived from the operation id and recorded before the provider is called,
		// so a restart (or the sweep) can always find the lease.
		err := m.db.InTx(ctx, func(tx *sql.Tx) error {
			if _, err := tx.ExecContext(ctx, `UPDATE environments SET lease_id=? WHERE id=?`, leaseID, id); err != nil {
				return err
			}
			return m.transition(ctx, tx, id, Requested, Provisioning, "provider "+e.ProviderID+" operation "+e.OperationID)
		})
		if err != nil {
			m.log.Error("provision: start", "env", id, "err", err)
			return
		}
		m.notify()
		e.State = Provisioning
	}
	if e.State != Provisioning && e.State != Draining {
		return
	}
	var lease providers.Lease
	var step Step
	for {
		start := m.cfg.Clock.Now()
		lease, err = m.provisionOnce(ctx, id, prov, e, leaseID)
		if ctx.Err() != nil {
			return // gateway stopping: resumed on restart with the same operation id
		}
		if err == nil {
			err = lease.Validate()
			if lease.ID == "" {
				lease.ID = leaseID
			}
		}
		step = Step{Kind: StepProvision, Name: e.Profile.ID, StartedAt: start, DurationMs: m.cfg.Clock.Now().Sub(start).Milliseconds(), Result: ResultOK}
		if err == nil {
			step.Detail = fmt.Sprintf("lease %s at %s:%d", lease.ID, lease.SSHHost, lease.SSHPort)
			break // recorded with the move to bootstrapping
		}
		step.Result, step.Detail = ResultFailed, err.Error()
		next, fb := m.nextFallback(ctx, e, err)
		if fb != "" {
			step.Detail += " — " + fb
		}
		// Release first, so an operator who sees "failed" is not paying for the machine any more.
		m.releaseLease(ctx, id, prov, e.Profile, providers.Lease{ID: leaseID}, "provisioning failed")
		if next == nil {
			m.failStep(ctx, id, "provision: "+step.Detail, &step)
			return
		}
		m.RecordStep(ctx, id, step)
		if e, prov, leaseID, err = m.fallBack(ctx, e, *next, err); err != nil {
			if ctx.Err() == nil && !errors.Is(err, errNotProvisioning) {
				m.fail(ctx, id, "provision: fall back to profile "+next.ID+": "+err.Error())
			}
			return
		}
	}
	hostKeys, _ := json.Marshal(lease.HostKeys)
	labels, _ := json.Marshal(lease.Labels)
	moved := false
	err = m.db.InTx(ctx, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `UPDATE environments SET lease_id=?, ssh_host=?, ssh_port=?, ssh_user=?, ssh_key_path=?,
			host_keys=?, lease_labels=?, lease_expires_at=?, updated_at=? WHERE id=?`,
			lease.ID, lease.SSHHost, lease.SSHPort, lease.SSHUser, lease.SSHKeyPath, string(hostKeys), string(labels),
			store.FormatTime(lease.ExpiresAt), store.FormatTime(m.cfg.Clock.Now()), id)
		if err != nil {
			return err
		}
		cur, err := getEnv(ctx, tx, id)
		if err != nil {
			return err
		}
		if cur.State != Provisioning {
			return nil // destroy was requested meanwhile; the lease is recorded for it
		}
		moved = true
		if err := m.transition(ctx, tx, id, Provisioning, Bootstrapping, fmt.Sprintf("lease %s at %s:%d", lease.ID, lease.SSHHost, lease.SSHPort)); err != nil {
			return err
		}
		return attachStep(ctx, tx, id, &step)
	})
	if err != nil {
		m.log.Error("provision: record lease", "env", id, "err", err)
		return
	}
	m.notify()
	if moved {
		m.bootstrap(ctx, id)
	}
}

// provisionOnce is one provider call for an environment (e is its row as the call starts).
func (m *Manager) provisionOnce(ctx context.Context, id string, prov providers.Provider, e Environment, leaseID string) (providers.Lease, error) {
	pctx, cancel := context.WithTimeout(ctx, m.cfg.ProvisionTimeout)
	defer cancel()
	m.log.Info("provisioning", "env", id, "provider", e.ProviderID, "profile", e.Profile.ID, "op", e.OperationID, "lease", leaseID)
	return prov.Provision(pctx, e.Profile, e.OperationID, providers.ProvisionRequest{
		EnvironmentID: id, GatewayID: m.cfg.GatewayID, LeaseID: leaseID,
		// A lease CLI that chooses its own ids reports one mid-provision: it is recorded at once, so
		// teardown, the sweep and a restart know the lease even if this gateway dies before the call returns.
		Reported: func(reported string, labels map[string]string) error {
			lb, _ := json.Marshal(labels)
			_, err := m.db.W.ExecContext(ctx, `UPDATE environments SET lease_id=?, lease_labels=?, updated_at=? WHERE id=? AND state IN ('provisioning','draining','destroying')`,
				reported, string(lb), store.FormatTime(m.cfg.Clock.Now()), id)
			if err == nil {
				m.log.Info("lease reported", "env", id, "lease", reported)
			}
			return err
		},
	})
}

// bootstrap hands a leased machine to the bootstrapper, if one is configured.
func (m *Manager) bootstrap(ctx context.Context, id string) {
	if m.cfg.Bootstrapper == nil {
		return
	}
	e, err := m.Get(ctx, id)
	if err != nil || e.State != Bootstrapping {
		return
	}
	bctx, cancel := context.WithCancel(ctx)
	m.mu.Lock()
	m.booting[id] = cancel
	m.mu.Unlock()
	err = m.cfg.Bootstrapper.Bootstrap(bctx, e)
	m.mu.Lock()
	delete(m.booting, id)
	m.mu.Unlock()
	stopped := bctx.Err() != nil // cancelled by RequestDestroy (or ctx), not by its own failure
	cancel()
	if err != nil {
		if ctx.Err() != nil {
			return
		}
		if stopped { // a destroy was requested: it takes over from here
			m.log.Info("bootstrap stopped for destroy", "env", id)
			return
		}
		m.fail(ctx, id, "bootstrap: "+err.Error())
		return
	}
	if err := m.move(ctx, id, Bootstrapping, Ready, "worker admitted"); err != nil {
		m.log.Warn("bootstrap: mark ready", "env", id, "err", err)
		return
	}
	m.observeProvision(e, "ready")
}

// Note records a progress note (an event without a state change) on an environment.
func (m *Manager) Note(ctx context.Context, id, text string) {
	text = Sanitize(text)
	err := m.db.InTx(ctx, func(tx *sql.Tx) error {
		var st string
		if err := tx.QueryRowContext(ctx, `SELECT state FROM environments WHERE id=?`, id).Scan(&st); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, `INSERT INTO environment_events(environment_id, at, from_state, to_state, reason) VALUES(?,?,?,?,?)`,
			id, store.FormatTime(m.cfg.Clock.Now()), st, st, text)
		return err
	})
	if err != nil {
		m.log.Warn("note", "env", id, "err", err)
		return
	}
	m.log.Info("environment note", "env", id, "note", text)
	m.notify()
}

// SetWorker records the bundle installed on an environment's box and where its worker lives.
func (m *Manager) SetWorker(ctx context.Context, id, bundleHash, socket, home string) error {
	_, err := m.db.W.ExecContext(ctx, `UPDATE environments SET bundle_hash=?, worker_socket=?, worker_home=?, updated_at=? WHERE id=?`,
		bundleHash, socket, home, store.FormatTime(m.cfg.Clock.Now()), id)
	return err
}

// BundleHash returns the bundle hash recorded for an environment (for worker admission).
func (m *Manager) BundleHash(id string) (string, bool) {
	var h string
	err := m.db.R.QueryRowContext(context.Background(), `SELECT bundle_hash FROM environments WHERE id=?`, id).Scan(&h)
	return h, err == nil && h != ""
}

// Touch records activity on an environment (idle time is measured from it).
func (m *Manager) Touch(ctx context.Context, id string) {
	_, _ = m.db.W.ExecContext(ctx, `UPDATE environments SET last_activity_at=? WHERE id=?`, store.FormatTime(m.cfg.Clock.Now()), id)
}

// releaseLease destroys a lease whose environment is failed or unknown, best effort, audited.
// A lease that cannot be released now is found again by the orphan sweep.
func (m *Manager) releaseLease(ctx context.Context, envID string, prov providers.Provider, prof providers.Profile, lease providers.Lease, why string) {
	if lease.ID == "" {
		return
	}
	err := prov.Destroy(ctx, prof, lease)
	detail := fmt.Sprintf("lease %s (%s)", lease.ID, why)
	if err != nil {
		detail += ": " + Sanitize(err.Error())
		m.log.Warn("release lease", "env", envID, "lease", lease.ID, "err", err)
	}
	if aerr := m.db.InTx(ctx, func(tx *sql.Tx) error { return store.Audit(ctx, tx, m.cfg.Clock.Now(), "lease.release", envID, detail) }); aerr != nil {
		m.log.Error("audit lease release", "err", aerr)
	}
}

// WithClass returns the profile with its machine class (settings.class) set; only providers driven by
// a lease CLI (command, crabbox) have machine classes.
func WithClass(p providers.Profile, class string) (providers.Profile, error) {
	if err := providers.CheckMachineClass(class); err != nil {
		return p, err
	}
	if p.Provider != "command" && p.Provider != "crabbox" {
		return p, providers.Fieldf("machineClass", "provider %s of profile %s has no machine classes", p.Provider, p.ID)
	}
	settings := map[string]any{}
	if len(p.Settings) > 0 {
		if err := json.Unmarshal(p.Settings, &settings); err != nil {
			return p, providers.Fieldf("settings", "%v", err)
		}
	}
	settings["class"] = class
	b, err := json.Marshal(settings)
	if err != nil {
		return p, err
	}
	p.Settings = b
	return p, nil
}

// Class is the machine class an environment was leased with ("" when its profile names none).
func (e Environment) Class() string {
	var s struct {
		Class string `json:"class"`
	}
	_ = json.Unmarshal(e.Profile.Settings, &s)
	return s.Class
}

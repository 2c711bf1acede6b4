package envs

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/openclaw/cloudworkers/gateway/store"
	"github.com/openclaw/cloudworkers/internal/backoff"
	"github.com/openclaw/cloudworkers/providers"
)

// ErrAttached is returned by a non-forced destroy of an environment that serves a session.
var ErrAttached = errors.New("environment is attached to a session (use force)")

// RequestDestroy records the intent to destroy an environment and starts tearing it down in the
// background. It is idempotent. Without force, an attached environment is refused.
func (m *Manager) RequestDestroy(ctx context.Context, id string, force bool) (Environment, error) {
	err := m.db.InTx(ctx, func(tx *sql.Tx) error {
		e, err := getEnv(ctx, tx, id)
		if err != nil {
			return err
		}
		reason := "destroy requested"
		if force {
			reason = "destroy requested (force)"
		}
		switch e.State {
		case Destroyed, Destroying, Draining:
			return nil
		case Failed, Orphaned:
			return m.transition(ctx, tx, id, e.State, Destroying, reason)
		case Attached:
			if !force {
				return fmt.Errorf("environment %s: %w", id, ErrAttached)
			}
		}
		if err := m.transition(ctx, tx, id, e.State, Draining, reason); err != nil {
			return err
		}
		return store.Audit(ctx, tx, m.cfg.Clock.Now(), "environment.destroy", id, reason)
	})
	if err != nil {
		return Environment{}, err
	}
	m.mu.Lock()
	if force {
		m.forced[id] = true
	}
	// a bootstrap still talking to the box must not hold teardown up
	if cancel, ok := m.booting[id]; ok {
		cancel()
	}
	m.mu.Unlock()
	m.notify()
	m.goJob(id, func(ctx context.Context) { m.destroyLoop(ctx, id) })
	return m.Get(ctx, id)
}

// Destroy requests destruction and waits for proof of teardown (the provider's inspect says the
// lease is gone) or for ctx to end, in which case the teardown goes on in the background.
func (m *Manager) Destroy(ctx context.Context, id string, force bool) (Environment, error) {
	if _, err := m.RequestDestroy(ctx, id, force); err != nil {
		return Environment{}, err
	}
	return m.WaitFor(ctx, id, func(e Environment) bool { return e.State == Destroyed })
}

// destroyLoop drives draining → destroying → destroyed, retrying with backoff until the
// provider proves the lease is gone.
func (m *Manager) destroyLoop(ctx context.Context, id string) {
	bo := backoff.Backoff{Min: m.cfg.RetryMin, Max: m.cfg.RetryMax, Clock: m.cfg.Clock}
	for attempt := 1; ; attempt++ {
		done, err := m.destroyStep(ctx, id)
		if done || ctx.Err() != nil {
			return
		}
		if err == nil { // progressed (draining → destroying): go on at once
			attempt--
			continue
		}
		{
			msg := Sanitize(fmt.Sprintf("destroy attempt %d: %v", attempt, err))
			m.log.Warn("destroy", "env", id, "attempt", attempt, "err", err)
			_, _ = m.db.W.ExecContext(ctx, `UPDATE environments SET error=?, destroy_attempts=?, updated_at=? WHERE id=?`,
				msg, attempt, store.FormatTime(m.cfg.Clock.Now()), id)
			m.notify()
		}
		if bo.Wait(ctx) != nil {
			return
		}
	}
}

// destroyStep does one attempt; done reports that nothing is left to do.
func (m *Manager) destroyStep(ctx context.Context, id string) (done bool, err error) {
	e, err := getEnv(ctx, m.db.R, id)
	if err != nil {
		return true, err
	}
	prov, err := m.cfg.Providers.Get(e.ProviderID)
	if err != nil {
		return false, err
	}
	switch e.State {
	case Destroyed:
		return true, nil
	case Draining:
		// Sessions are detached by their owners (placement); nothing here holds the box any more.
		if err := m.move(ctx, id, Draining, Destroying, "drained"); err != nil {
			return false, err
		}
		return false, nil
	case Destroying:
	default:
		return true, nil
	}
	if e.LeaseID == "" {
		// The provider was never called (provisioning records the lease id before its call).
		return true, m.finishDestroy(ctx, id, "no lease was created")
	}
	// Box-side cleanup is best effort and bounded by the releaser's own deadline; a forced
	// destroy skips it. The provider's destroy below is the proof, whatever the box did.
	if r, ok := m.cfg.Bootstrapper.(Releaser); ok {
		m.mu.Lock()
		boxSide := !m.forced[id]
		m.mu.Unlock()
		if err := r.Release(ctx, e, boxSide); err != nil && ctx.Err() == nil {
			m.Note(ctx, id, "release: box-side cleanup skipped: "+err.Error()+"; destroying the lease anyway")
		} else if !boxSide {
			m.Note(ctx, id, "release: box-side cleanup skipped (force)")
		}
	}
	lease := e.ProviderLease()
	if err := prov.Destroy(ctx, e.Profile, lease); err != nil {
		return false, fmt.Errorf("provider destroy: %w", err)
	}
	st, err := prov.Inspect(ctx, e.Profile, lease)
	if err != nil {
		return false, fmt.Errorf("inspect after destroy: %w", err)
	}
	if !st.Gone {
		return false, fmt.Errorf("lease %s still present after destroy (state %q)", lease.ID, st.State)
	}
	return true, m.finishDestroy(ctx, id, "provider reports lease "+lease.ID+" gone")
}

func (m *Manager) finishDestroy(ctx context.Context, id, reason string) error {
	err := m.db.InTx(ctx, func(tx *sql.Tx) error {
		if err := m.transition(ctx, tx, id, Destroying, Destroyed, reason); err != nil {
			return err
		}
		// A retry message is history once teardown is proven; a failure reason stays.
		if _, err := tx.ExecContext(ctx, `UPDATE environments SET error='' WHERE id=? AND error LIKE 'destroy attempt %'`, id); err != nil {
			return err
		}
		return store.Audit(ctx, tx, m.cfg.Clock.Now(), "environment.destroyed", id, reason)
	})
	if err == nil {
		m.mu.Lock()
		delete(m.forced, id)
		m.mu.Unlock()
		m.log.Info("environment destroyed", "env", id, "reason", reason)
		m.notify()
	}
	return err
}

// Reconcile re-inspects every non-terminal environment after a restart: in-flight provisioning
// resumes with the same operation id, teardown resumes, and a lease the provider no longer has
// moves its environment to orphaned.
func (m *Manager) Reconcile(ctx context.Context) error {
	rows, err := m.db.R.QueryContext(ctx, `SELECT `+envCols+` FROM environments WHERE state NOT IN ('destroyed','failed','orphaned') ORDER BY created_at`)
	if err != nil {
		return fmt.Errorf("reconcile: %w", err)
	}
	var list []Environment
	for rows.Next() {
		e, err := scanEnv(rows)
		if err != nil {
			rows.Close()
			return fmt.Errorf("reconcile: %w", err)
		}
		list = append(list, e)
	}
	rows.Close()
	for _, e := range list {
		id := e.ID
		switch {
		case e.State == Requested || e.State == Provisioning:
			m.log.Info("reconcile: resuming provisioning", "env", id, "op", e.OperationID)
			m.goJob(id, func(ctx context.Context) { m.provision(ctx, id); m.chainDestroy(ctx, id) })
		case e.State == Draining || e.State == Destroying:
			m.log.Info("reconcile: resuming destroy", "env", id)
			m.goJob(id, func(ctx context.Context) { m.destroyLoop(ctx, id) })
		case e.State.HasMachine():
			m.goJob(id, func(ctx context.Context) {
				if m.checkLease(ctx, e) {
					if e.State == Bootstrapping {
						m.bootstrap(ctx, id)
					} else if r, ok := m.cfg.Bootstrapper.(Resumer); ok {
						if err := r.Resume(ctx, e); err != nil && ctx.Err() == nil {
							m.Note(ctx, id, "resume after restart: "+err.Error())
						}
					}
				}
				m.chainDestroy(ctx, id)
			})
		}
	}
	return nil
}

// chainDestroy continues with teardown when a destroy was requested while another job ran.
func (m *Manager) chainDestroy(ctx context.Context, id string) {
	e, err := getEnv(ctx, m.db.R, id)
	if err == nil && (e.State == Draining || e.State == Destroying) {
		m.destroyLoop(ctx, id)
	}
}

// checkLease inspects the lease of an environment that should hold a machine. It reports
// whether the lease is still there; a lease proven gone orphans the environment.
func (m *Manager) checkLease(ctx context.Context, e Environment) bool {
	prov, err := m.cfg.Providers.Get(e.ProviderID)
	if err != nil {
		m.log.Warn("inspect lease", "env", e.ID, "err", err)
		return false
	}
	st, err := prov.Inspect(ctx, e.Profile, e.ProviderLease())
	if err != nil {
		m.log.Warn("inspect lease", "env", e.ID, "lease", e.LeaseID, "err", err)
		return true // not proof of anything; try again later
	}
	if !st.Gone {
		return true
	}
	reason := fmt.Sprintf("provider no longer has lease %s (state %q)", e.LeaseID, st.State)
	err = m.db.InTx(ctx, func(tx *sql.Tx) error {
		if err := m.transition(ctx, tx, e.ID, e.State, Orphaned, reason); err != nil {
			return err
		}
		return store.Audit(ctx, tx, m.cfg.Clock.Now(), "environment.orphaned", e.ID, reason)
	})
	if err != nil {
		m.log.Warn("orphan environment", "env", e.ID, "err", err)
		return false
	}
	m.log.Warn("environment orphaned", "env", e.ID, "reason", reason)
	m.notify()
	return false
}

// SweepReport says what one orphan sweep did.
type SweepReport struct {
	Checked   int           `json:"checked"`
	Destroyed []SweptLease  `json:"destroyed"`
	Orphaned  []string      `json:"orphaned"`
	Errors    []string      `json:"errors"`
	Duration  time.Duration `json:"durationMs"`
}

// SweptLease is one lease the sweep destroyed.
type SweptLease struct {
	LeaseID       string `json:"leaseId"`
	ProfileID     string `json:"profileId"`
	EnvironmentID string `json:"environmentId,omitempty"`
	Reason        string `json:"reason"`
}

// Sweep compares provider inventories with our rows and destroys (and audits) leases that are
// ours but whose environment is dead or unknown. What is ours: a lease labelled with this
// gateway's id (lease CLIs that take labels), or, for a lease without our labels, one whose id or
// slug this gateway derived and recorded on an environment row before it called the CLI; a lease
// of others, or one we did not record, is never destroyed. Environments whose lease is proven gone
// become orphaned.
func (m *Manager) Sweep(ctx context.Context) (SweepReport, error) {
	start := time.Now()
	rep := SweepReport{Destroyed: []SweptLease{}, Orphaned: []string{}, Errors: []string{}}
	profs, err := m.cfg.Profiles.List(ctx)
	if err != nil {
		return rep, err
	}
	seen := map[string]bool{} // provider + lease id
	for _, prof := range profs {
		prov, err := m.cfg.Providers.Get(prof.Provider)
		if err != nil {
			continue
		}
		lister, ok := prov.(providers.Lister)
		if !ok {
			continue
		}
		leases, err := lister.List(ctx, prof)
		if err != nil {
			rep.Errors = append(rep.Errors, Sanitize(fmt.Sprintf("list %s: %v", prof.ID, err)))
			continue
		}
		for _, st := range leases {
			id := st.LeaseID
			if id == "" {
				id = st.Lease.ID
			}
			key := prof.Provider + "\x00" + id + "\x00" + st.Slug
			if id == "" || seen[key] || st.Gone {
				continue
			}
			seen[key] = true
			rep.Checked++
			labels := st.Labels
			if labels == nil {
				labels = st.Lease.Labels
			}
			var reason, owner string
			switch gw, labelled := labels[providers.LabelGateway]; {
			case labelled && gw != m.cfg.GatewayID:
				continue
			case labelled:
				reason, owner = m.orphanReason(ctx, prof.Provider, id, labels[providers.LabelEnvironment])
			default:
				reason, owner = m.recordedOrphanReason(ctx, prov, prof.Provider, id, st.Slug)
			}
			if reason == "" {
				continue
			}
			lease := st.Lease
			lease.ID = id
			if err := prov.Destroy(ctx, prof, lease); err != nil {
				rep.Errors = append(rep.Errors, Sanitize(fmt.Sprintf("destroy orphan lease %s: %v", id, err)))
				continue
			}
			detail := fmt.Sprintf("lease %s of profile %s destroyed: %s", id, prof.ID, reason)
			if err := m.db.InTx(ctx, func(tx *sql.Tx) error { return store.Audit(ctx, tx, m.cfg.Clock.Now(), "sweep.destroy", owner, detail) }); err != nil {
				return rep, err
			}
			m.log.Warn("orphan sweep destroyed lease", "lease", id, "profile", prof.ID, "reason", reason)
			rep.Destroyed = append(rep.Destroyed, SweptLease{LeaseID: id, ProfileID: prof.ID, EnvironmentID: owner, Reason: reason})
		}
	}
	// Live rows whose lease is proven gone.
	list, err := m.List(ctx, false)
	if err != nil {
		return rep, err
	}
	for _, e := range list {
		if !e.State.HasMachine() || m.jobDone(e.ID) != nil {
			continue
		}
		if !m.checkLease(ctx, e) {
			if cur, err := m.Get(ctx, e.ID); err == nil && cur.State == Orphaned {
				rep.Orphaned = append(rep.Orphaned, e.ID)
			}
		}
	}
	rep.Duration = time.Since(start) / time.Millisecond
	return rep, nil
}

// recordedOrphanReason says why an unlabelled listed lease (id, slug) should be destroyed, or "" to
// keep it. It is ours only when an environment row of this provider recorded id or slug as its
// lease before the CLI was called, and that row's own derivation (operation id → lease id or
// slug) gives the same name: a static box re-leased under another slug is not ours any more.
func (m *Manager) recordedOrphanReason(ctx context.Context, prov providers.Provider, provider, id, slug string) (reason, envID string) {
	list, err := m.queryEnvs(ctx, `WHERE provider_id=? AND lease_id IN (?,?) ORDER BY created_at DESC LIMIT 100`, provider, id, slug)
	if err != nil {
		return "", ""
	}
	for _, e := range list {
		derived := derivedLeaseID(prov, e.Profile, e.OperationID)
		if derived != id && (slug == "" || derived != slug) {
			continue
		}
		if !e.State.Dead() {
			return "", e.ID
		}
		return "environment " + e.ID + " is " + string(e.State), e.ID
	}
	return m.attemptOrphanReason(ctx, prov, provider, id, slug)
}

// queryEnvs returns the environments a WHERE (and ORDER, LIMIT) clause selects.
func (m *Manager) queryEnvs(ctx context.Context, where string, args ...any) ([]Environment, error) {
	return store.Query(ctx, m.db.R, scanEnv, `SELECT `+envCols+` FROM environments `+where, args...)
}

// derivedLeaseID is the lease id (or slug) the gateway derives for an operation of a profile.
func derivedLeaseID(prov providers.Provider, prof providers.Profile, opID string) string {
	if d, ok := prov.(providers.LeaseIDer); ok {
		return d.LeaseID(prof, opID)
	}
	return DefaultLeaseID(opID)
}

// orphanReason says why a lease labelled as ours should be destroyed, or "" to keep it.
func (m *Manager) orphanReason(ctx context.Context, provider, leaseID, labelledEnv string) (reason, envID string) {
	e, err := scanEnv(m.db.R.QueryRowContext(ctx, `SELECT `+envCols+` FROM environments WHERE provider_id=? AND lease_id=? ORDER BY created_at DESC LIMIT 1`, provider, leaseID))
	if errors.Is(err, sql.ErrNoRows) && labelledEnv != "" {
		e, err = getEnv(ctx, m.db.R, labelledEnv)
		if errors.Is(err, store.ErrNotFound) {
			err = sql.ErrNoRows
		}
	}
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return "no environment row for this lease", labelledEnv
	case err != nil:
		return "", ""
	case e.State.Dead():
		return "environment " + e.ID + " is " + string(e.State), e.ID
	case e.LeaseID != leaseID || e.ProviderID != provider:
		// labelled for an environment that holds another lease: one of its abandoned attempts
		for _, a := range e.Attempts {
			if a.ProviderID == provider && a.LeaseID == leaseID {
				return fmt.Sprintf("left by environment %s's attempt on profile %s (%s), which fell back", e.ID, a.ProfileID, a.Reason), e.ID
			}
		}
	}
	return "", e.ID
}

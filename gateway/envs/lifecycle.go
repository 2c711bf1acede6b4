package envs

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/openclaw/cloudworkers/providers"
)

// Attach marks an environment as serving a session (ready|idle → attached). Attached
// environments are never stopped for idleness or TTL.
func (m *Manager) Attach(ctx context.Context, id, sessionID string) error {
	var committed func()
	if err := m.db.InTx(ctx, func(tx *sql.Tx) (err error) {
		committed, err = m.AttachTx(ctx, tx, id, sessionID)
		return err
	}); err != nil {
		return err
	}
	committed()
	return nil
}

// AttachTx is Attach inside tx: the placement state machine attaches the environment in the
// transaction of the transition that makes the session active on it, so the two never disagree.
// Call committed once tx has committed: it records the activity and wakes the watchers.
func (m *Manager) AttachTx(ctx context.Context, tx *sql.Tx, id, sessionID string) (committed func(), err error) {
	e, err := getEnv(ctx, tx, id)
	if err != nil {
		return nil, err
	}
	if e.State == Attached {
		return func() {}, nil
	}
	reason := "session " + sessionID + " attached"
	if err := m.transition(ctx, tx, id, e.State, Attached, reason); err != nil {
		return nil, err
	}
	return func() {
		m.log.Info("environment state", "env", id, "from", e.State, "to", Attached, "reason", reason)
		m.notify()
		m.Touch(context.WithoutCancel(ctx), id)
	}, nil
}

// Detach marks an attached environment idle again; idle time counts from now.
func (m *Manager) Detach(ctx context.Context, id, sessionID string) error {
	e, err := m.Get(ctx, id)
	if err != nil {
		return err
	}
	if e.State != Attached {
		return nil
	}
	m.Touch(ctx, id)
	return m.move(ctx, id, Attached, Idle, "session "+sessionID+" detached")
}

// lifecycleLoop applies the profiles' lifetime policy: idle auto-stop, TTL and lease renewal.
func (m *Manager) lifecycleLoop(interval time.Duration) {
	defer m.wg.Done()
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-m.ctx.Done():
			return
		case <-t.C:
			m.ApplyLifecycle(m.ctx)
		}
	}
}

// ApplyLifecycle runs one pass of the lifetime policy over live environments:
//   - an environment not attached to a session and idle longer than its profile's idleTimeout is
//     destroyed (activity is measured at the gateway: admissions, turns, inference, sync);
//   - one not attached and older than its profile's ttl is destroyed;
//   - leases that expire within a renewal margin are renewed through the provider, so days-long
//     sessions keep their machine.
//
// It returns the ids it destroyed.
func (m *Manager) ApplyLifecycle(ctx context.Context) []string {
	list, err := m.List(ctx, false)
	if err != nil {
		m.log.Warn("lifecycle", "err", err)
		return nil
	}
	var stopped []string
	now := m.cfg.Clock.Now()
	for _, e := range list {
		if !e.State.HasMachine() || e.State == Bootstrapping {
			continue
		}
		lt := e.Profile.Lifetime
		reason := ""
		switch {
		case e.State == Attached:
		case lt.IdleTimeout > 0 && time.Duration(e.IdleMs)*time.Millisecond > lt.IdleTimeout.D():
			reason = fmt.Sprintf("idle for %s (idleTimeout %s)", (time.Duration(e.IdleMs) * time.Millisecond).Round(time.Second), lt.IdleTimeout)
		case lt.TTL > 0 && time.Duration(e.AgeMs)*time.Millisecond > lt.TTL.D():
			reason = fmt.Sprintf("older than its ttl %s", lt.TTL)
		}
		if reason != "" {
			m.Note(ctx, e.ID, "lifecycle: "+reason)
			if _, err := m.RequestDestroy(ctx, e.ID, false); err != nil {
				m.log.Warn("lifecycle destroy", "env", e.ID, "err", err)
				continue
			}
			stopped = append(stopped, e.ID)
			continue
		}
		m.maybeRenew(ctx, e, now)
	}
	return stopped
}

// renewMargin is how long before a lease's expiry it is renewed.
const renewMargin = 30 * time.Minute

func (m *Manager) maybeRenew(ctx context.Context, e Environment, now time.Time) {
	if e.Lease.ExpiresAt.IsZero() || e.Lease.ExpiresAt.Sub(now) > renewMargin {
		return
	}
	prov, err := m.cfg.Providers.Get(e.ProviderID)
	if err != nil {
		return
	}
	r, ok := prov.(providers.Renewer)
	if !ok {
		return
	}
	if err := r.Renew(ctx, e.Profile, e.ProviderLease()); err != nil {
		m.Note(ctx, e.ID, "renew lease: "+err.Error())
		return
	}
	st, err := prov.Inspect(ctx, e.Profile, e.ProviderLease())
	if err == nil && !st.Lease.ExpiresAt.IsZero() {
		_, _ = m.db.W.ExecContext(ctx, `UPDATE environments SET lease_expires_at=? WHERE id=?`, st.Lease.ExpiresAt.UTC().Format("2006-01-02T15:04:05.000Z07:00"), e.ID)
	}
	m.Note(ctx, e.ID, "lease renewed")
}

// Recheck asks the provider about an environment's lease now; a lease proven gone orphans the
// environment. It returns the environment as it is afterwards.
func (m *Manager) Recheck(ctx context.Context, id string) (Environment, error) {
	e, err := m.Get(ctx, id)
	if err != nil || !e.State.HasMachine() {
		return e, err
	}
	m.checkLease(ctx, e)
	return m.Get(ctx, id)
}

// Profile returns a stored profile (store.ErrNotFound when there is none).
func (m *Manager) Profile(ctx context.Context, id string) (providers.Profile, error) {
	return m.cfg.Profiles.Get(ctx, id)
}

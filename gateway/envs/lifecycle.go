package envs

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/openclaw/cloudworkers/gateway/store"
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

// ApplyLifecycle runs one pass of the lifetime policy over live environments:
//   - an environment not attached to a session, not in use (Hold, Config.Busy) and idle longer
//     than its profile's idleTimeout is destroyed; activity is measured at the gateway from what
//     passes through it (admissions, worker calls: turns, inference, live events; sync; setup);
//   - one not attached and older than its profile's ttl is destroyed; an attached one is never
//     destroyed by policy, it is renewed;
//   - leases that expire within a renewal margin are renewed through the provider, so days-long
//     sessions keep their machine; a provider that refuses while the lease runs out fails the
//     environment with the reason (its session is reclaimed);
//   - the provider is heartbeaten (renew) while the environment is active, at half the profile's
//     idleTimeout, so a provider-side idle timer never fires on a box that is working without
//     talking to a model.
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
		last, inUse := m.lastActive(e, now)
		idle := now.Sub(last)
		reason := ""
		switch {
		case e.State == Attached || inUse:
		case lt.IdleTimeout > 0 && idle > lt.IdleTimeout.D():
			reason = fmt.Sprintf("idle for %s (idleTimeout %s)", idle.Round(time.Second), lt.IdleTimeout)
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
		m.keepAlive(ctx, e, now, last)
	}
	return stopped
}

// activity is what the gateway saw of one environment since this process started.
type activity struct {
	seen      time.Time // last worker call, sync or setup step seen
	touched   time.Time // last time seen was written to the row
	holds     int       // Hold calls not yet released
	heartbeat time.Time // last successful renew (expiry or heartbeat)
	refused   string    // the last renewal refusal noted ("" after a success)
}

// touchEvery bounds how often Seen writes an environment's activity to its row.
const touchEvery = 10 * time.Second

func (m *Manager) activityLocked(id string) *activity {
	a := m.act[id]
	if a == nil {
		a = &activity{}
		m.act[id] = a
	}
	return a
}

// Seen records activity on an environment that passed through the gateway (a worker call: a
// turn's transcript, an inference call, a live event). It is cheap: the row is written at most
// every 10s.
func (m *Manager) Seen(id string) {
	now := m.cfg.Clock.Now()
	m.mu.Lock()
	a := m.activityLocked(id)
	a.seen = now
	write := now.Sub(a.touched) >= touchEvery
	if write {
		a.touched = now
	}
	m.mu.Unlock()
	if write {
		m.Touch(context.Background(), id)
	}
}

// Hold marks an environment in use until release is called (a setup phase running on its box):
// it is not stopped for idleness meanwhile and its provider is heartbeaten.
func (m *Manager) Hold(id string) (release func()) {
	m.mu.Lock()
	m.activityLocked(id).holds++
	m.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			m.mu.Lock()
			a := m.activityLocked(id)
			a.holds--
			a.seen = m.cfg.Clock.Now()
			m.mu.Unlock()
			m.Touch(context.Background(), id)
		})
	}
}

// lastActive is the last activity of an environment and whether it is in use right now (held,
// or busy by Config.Busy): then it is active now.
func (m *Manager) lastActive(e Environment, now time.Time) (time.Time, bool) {
	last := e.LastActivityAt
	m.mu.Lock()
	a := m.act[e.ID]
	held := a != nil && a.holds > 0
	if a != nil && a.seen.After(last) {
		last = a.seen
	}
	m.mu.Unlock()
	if held || (m.cfg.Busy != nil && m.cfg.Busy(e.ID)) {
		return now, true
	}
	return last, false
}

// renewMargin is how long before a lease's expiry it is renewed at the latest.
const renewMargin = 30 * time.Minute

// keepAlive renews a lease that nears its expiry, and heartbeats the provider while the
// environment is active.
func (m *Manager) keepAlive(ctx context.Context, e Environment, now, last time.Time) {
	prov, err := m.cfg.Providers.Get(e.ProviderID)
	if err != nil {
		return
	}
	r, ok := prov.(providers.Renewer)
	if !ok {
		return
	}
	m.mu.Lock()
	beat := m.activityLocked(e.ID).heartbeat
	m.mu.Unlock()
	if beat.IsZero() {
		beat = e.CreatedAt
	}
	expiring := !e.Lease.ExpiresAt.IsZero() && e.Lease.ExpiresAt.Sub(now) <= renewMargin
	idle := e.Profile.Lifetime.IdleTimeout.D()
	heartbeat := idle > 0 && last.After(beat) && now.Sub(beat) >= idle/2
	if !expiring && !heartbeat {
		return
	}
	err = r.Renew(ctx, e.Profile, e.ProviderLease())
	if errors.Is(err, providers.ErrUnsupported) {
		return
	}
	if err != nil {
		m.renewRefused(ctx, e, now, err)
		return
	}
	m.mu.Lock()
	a := m.activityLocked(e.ID)
	a.heartbeat, a.refused = now, ""
	m.mu.Unlock()
	if !expiring {
		m.log.Debug("provider heartbeat", "env", e.ID, "lease", e.LeaseID, "active", now.Sub(last))
		return
	}
	st, err := prov.Inspect(ctx, e.Profile, e.ProviderLease())
	expires := e.Lease.ExpiresAt
	if err == nil && !st.Lease.ExpiresAt.IsZero() {
		expires = st.Lease.ExpiresAt
		_, _ = m.db.W.ExecContext(ctx, `UPDATE environments SET lease_expires_at=? WHERE id=?`, store.FormatTime(expires), e.ID)
	}
	m.Note(ctx, e.ID, "lease renewed (expires "+expires.UTC().Format(time.RFC3339)+")")
}

// renewRefused handles a renewal the provider refused: a lease it proves gone orphans the
// environment; one that runs out before the next pass could renew it fails the environment
// (attached or not: the provider takes the box), with a reason its session's reclaim repeats;
// otherwise the refusal is noted and the next pass tries again.
func (m *Manager) renewRefused(ctx context.Context, e Environment, now time.Time, err error) {
	msg := Sanitize(err.Error())
	if errors.Is(err, providers.ErrLeaseGone) {
		m.Note(ctx, e.ID, "renew lease: "+msg)
		m.checkLease(ctx, e)
		return
	}
	interval := m.cfg.LifecycleInterval
	if interval <= 0 {
		interval = 30 * time.Second
	}
	if !e.Lease.ExpiresAt.IsZero() && e.Lease.ExpiresAt.Sub(now) <= 2*interval {
		m.Fail(ctx, e.ID, fmt.Sprintf("provider refused to renew lease %s, which expires at %s: %s",
			e.LeaseID, e.Lease.ExpiresAt.UTC().Format(time.RFC3339), msg))
		return
	}
	m.mu.Lock()
	a := m.activityLocked(e.ID)
	again := a.refused == msg
	a.refused = msg
	m.mu.Unlock()
	if !again { // one note per refusal message, not one per pass
		m.Note(ctx, e.ID, "renew lease: "+msg+" (retried at each lifecycle pass)")
	}
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

// Profiles lists the stored profiles.
func (m *Manager) Profiles(ctx context.Context) ([]providers.Profile, error) {
	return m.cfg.Profiles.List(ctx)
}

// Profile returns a stored profile (store.ErrNotFound when there is none).
func (m *Manager) Profile(ctx context.Context, id string) (providers.Profile, error) {
	return m.cfg.Profiles.Get(ctx, id)
}

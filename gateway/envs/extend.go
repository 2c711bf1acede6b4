package envs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/openclaw/cloudworkers/gateway/store"
	"github.com/openclaw/cloudworkers/providers"
)

// ErrNotRenewable refuses an extension the environment's provider cannot carry out.
var ErrNotRenewable = errors.New("not renewable")

// RenewError is a renewal the provider refused; nothing of the environment changed.
type RenewError struct {
	Provider, LeaseID string
	Err               error
}

func (e *RenewError) Error() string {
	return fmt.Sprintf("provider %s refused to renew lease %s: %s", e.Provider, e.LeaseID, Sanitize(e.Err.Error()))
}

func (e *RenewError) Unwrap() error { return e.Err }

// Extend renews an environment's lease for ttl from now. The provider's renew runs first (with
// the profile's lifetime.ttl set to ttl, the {ttl} of a lease CLI); only when it succeeds is the
// environment's own ttl deadline (its profile snapshot's lifetime.ttl, counted from its creation)
// moved to at least now+ttl and the expiry the provider reports stored. A bad ttl, an environment
// without a machine or a provider that has no renew is refused before anything is called.
func (m *Manager) Extend(ctx context.Context, id string, ttl, maxTTL time.Duration) (Environment, error) {
	if ttl <= 0 || (maxTTL > 0 && ttl > maxTTL) {
		return Environment{}, providers.Fieldf("ttl", "must be a positive duration up to %s (boxAccess.maxExtend), got %s", maxTTL, ttl)
	}
	e, err := m.Get(ctx, id)
	if err != nil {
		return e, err
	}
	if !e.State.HasMachine() || e.State == Bootstrapping {
		return e, fmt.Errorf("environment %s is %s: only a ready, attached or idle environment can be extended: %w", id, e.State, ErrConflict)
	}
	prov, err := m.cfg.Providers.Get(e.ProviderID)
	if err != nil {
		return e, err
	}
	r, ok := prov.(providers.Renewer)
	if !ok {
		return e, fmt.Errorf("provider %s cannot renew leases: %w", e.ProviderID, ErrNotRenewable)
	}
	renewal := e.Profile
	renewal.Lifetime.TTL = providers.Duration(ttl)
	if err := r.Renew(ctx, renewal, e.ProviderLease()); err != nil {
		if errors.Is(err, providers.ErrUnsupported) {
			return e, fmt.Errorf("profile %s (provider %s) has no renew operation: %w", e.LeasedProfileID, e.ProviderID, ErrNotRenewable)
		}
		return e, &RenewError{Provider: e.ProviderID, LeaseID: e.LeaseID, Err: err}
	}
	now := m.cfg.Clock.Now()
	snapshot := e.Profile
	if old := snapshot.Lifetime.TTL.D(); old > 0 {
		snapshot.Lifetime.TTL = providers.Duration(max(old, now.Sub(e.CreatedAt)+ttl).Round(time.Second))
	}
	expires := e.Lease.ExpiresAt
	if st, err := prov.Inspect(ctx, e.Profile, e.ProviderLease()); err == nil && !st.Lease.ExpiresAt.IsZero() {
		expires = st.Lease.ExpiresAt
	}
	snap, err := json.Marshal(snapshot)
	if err != nil {
		return e, err
	}
	if _, err := m.db.W.ExecContext(ctx, `UPDATE environments SET profile_snapshot=?, lease_expires_at=?, updated_at=? WHERE id=?`,
		string(snap), store.FormatTime(expires), store.FormatTime(now), id); err != nil {
		return e, err
	}
	m.mu.Lock()
	a := m.activityLocked(id)
	a.heartbeat, a.refused = now, ""
	m.mu.Unlock()
	note := fmt.Sprintf("lease extended by %s", ttl)
	if !expires.IsZero() {
		note += " (lease expires " + expires.UTC().Format(time.RFC3339) + ")"
	}
	if d := snapshot.Lifetime.TTL.D(); d > 0 {
		note += " (ttl deadline " + e.CreatedAt.Add(d).UTC().Format(time.RFC3339) + ")"
	}
	m.Note(ctx, id, note)
	return m.Get(ctx, id)
}

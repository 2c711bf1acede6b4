package envs

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/openclaw/cloudworkers/gateway/store"
	"github.com/openclaw/cloudworkers/providers"
)

// errNotProvisioning: a destroy was requested while an attempt ran; it takes over.
var errNotProvisioning = errors.New("the environment is no longer provisioning")

// nextFallback returns the profile to provision from after err, or nil with no fallback: only a
// capacity-type error (the profile's capacityPattern) falls back, to the first profile of its
// fallback list. The text says which (for the attempt's timeline entry).
func (m *Manager) nextFallback(ctx context.Context, e Environment, err error) (*providers.Profile, string) {
	if len(e.Profile.Fallback) == 0 {
		return nil, ""
	}
	if !e.Profile.IsCapacityError(err) {
		return nil, "not a capacity error (capacityPattern), no fallback"
	}
	name := e.Profile.Fallback[0]
	next, gerr := m.cfg.Profiles.Get(ctx, name)
	if gerr != nil {
		return nil, fmt.Sprintf("no capacity; fallback profile %s: %v", name, gerr)
	}
	// The rest of the first choice's list (and its capacity pattern) travel with the fallback, so
	// the row carries the whole decision across a restart.
	next.Fallback = e.Profile.Fallback[1:]
	next.CapacityPattern = e.Profile.CapacityPattern
	return &next, "no capacity; falling back to profile " + name
}

// fallbackOperationID is the operation id of the attempt on another profile: derived from the
// environment's, so a restart resumes it, and distinct, so a lease CLI does not adopt the failed
// attempt's lease.
func fallbackOperationID(opID, profileID string) string {
	sum := sha256.Sum256([]byte("openclaw-fallback\x00" + opID + "\x00" + profileID))
	return "op_" + hex.EncodeToString(sum[:12])
}

// fallBack moves a provisioning environment to the next profile: the failed attempt is kept on
// the row (so the sweep still knows its lease), and the new profile, provider, operation id and
// lease id are recorded before the provider is called, as the first attempt's were.
func (m *Manager) fallBack(ctx context.Context, e Environment, next providers.Profile, cause error) (Environment, providers.Provider, string, error) {
	prov, err := m.cfg.Providers.Get(next.Provider)
	if err != nil {
		return e, nil, "", err
	}
	cur, err := getEnv(ctx, m.db.R, e.ID)
	if err != nil {
		return e, nil, "", err
	}
	attempts := append(cur.Attempts, Attempt{ProfileID: e.Profile.ID, ProviderID: e.ProviderID, OperationID: e.OperationID,
		LeaseID: cur.LeaseID, Reason: Sanitize(cause.Error())})
	ne := cur
	ne.Profile, ne.ProviderID, ne.OperationID, ne.LeaseID = next, next.Provider, fallbackOperationID(cur.OperationID, next.ID), ""
	leaseID := m.leaseIDFor(prov, ne)
	ne.LeaseID, ne.Attempts, ne.LeasedProfileID = leaseID, attempts, next.ID
	snapshot, _ := json.Marshal(next)
	ab, _ := json.Marshal(attempts)
	err = m.db.InTx(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `UPDATE environments SET provider_id=?, profile_snapshot=?, operation_id=?, lease_id=?,
			lease_labels='{}', lease_attempts=?, updated_at=? WHERE id=? AND state='provisioning'`,
			next.Provider, string(snapshot), ne.OperationID, leaseID, string(ab), store.FormatTime(m.cfg.Clock.Now()), e.ID)
		if err != nil {
			return err
		}
		if n, _ := res.RowsAffected(); n != 1 {
			return errNotProvisioning
		}
		return store.Audit(ctx, tx, m.cfg.Clock.Now(), "environment.fallback", e.ID, fmt.Sprintf("profile %s → %s (operation %s, lease %s)", e.Profile.ID, next.ID, ne.OperationID, leaseID))
	})
	if err != nil {
		return e, nil, "", err
	}
	m.log.Info("provision: falling back", "env", e.ID, "from", e.Profile.ID, "to", next.ID, "cause", cause)
	m.notify()
	return ne, prov, leaseID, nil
}

// attemptOrphanReason says why a listed lease (id or slug) of provider that an earlier, abandoned
// provisioning attempt of an environment derived should be destroyed ("" to keep it): the
// environment moved to another profile, so that lease serves nothing.
func (m *Manager) attemptOrphanReason(ctx context.Context, prov providers.Provider, provider, id, slug string) (reason, envID string) {
	list, err := m.queryEnvs(ctx, `WHERE lease_attempts LIKE ? ESCAPE '\' OR (? != '' AND lease_attempts LIKE ? ESCAPE '\')
		ORDER BY created_at DESC LIMIT 100`, "%"+likeEscape(`"leaseId":"`+id+`"`)+"%", slug, "%"+likeEscape(`"leaseId":"`+slug+`"`)+"%")
	if err != nil {
		return "", ""
	}
	for _, e := range list {
		for _, a := range e.Attempts {
			if a.ProviderID != provider || (a.LeaseID != id && (slug == "" || a.LeaseID != slug)) {
				continue
			}
			prof, err := m.cfg.Profiles.Get(ctx, a.ProfileID)
			if err != nil {
				prof = providers.Profile{ID: a.ProfileID, Provider: a.ProviderID}
			}
			derived := derivedLeaseID(prov, prof, a.OperationID)
			if derived != a.LeaseID {
				continue // a lease id the CLI chose: only its labels can prove it ours
			}
			return fmt.Sprintf("left by environment %s's attempt on profile %s (%s), which fell back", e.ID, a.ProfileID, a.Reason), e.ID
		}
	}
	return "", ""
}

// likeEscape escapes s for a LIKE pattern with ESCAPE '\'.
func likeEscape(s string) string {
	return strings.NewReplacer(`\`, `\\`, `%`, `\%`, `_`, `\_`).Replace(s)
}

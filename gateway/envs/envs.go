package envs

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/openclaw/cloudworkers/gateway/store"
	"github.com/openclaw/cloudworkers/internal/untrusted"
	"github.com/openclaw/cloudworkers/providers"
)

// Environment is one leased machine as the gateway records it.
type Environment struct {
	ID             string    `json:"id"`
	ProfileID      string    `json:"profileId"`
	ProviderID     string    `json:"providerId"`
	LeaseID        string    `json:"leaseId"`
	OperationID    string    `json:"operationId"`
	IdempotencyKey string    `json:"idempotencyKey,omitempty"`
	State          State     `json:"state"`
	Error          string    `json:"error"`
	CreatedAt      time.Time `json:"createdAt"`
	UpdatedAt      time.Time `json:"updatedAt"`
	LastActivityAt time.Time `json:"lastActivityAt"`
	Lease          LeaseInfo `json:"lease"`
	// BundleHash is the worker bundle installed on the box; WorkerSocket and WorkerHome say where
	// the worker lives there. Set by bootstrap.
	BundleHash   string `json:"bundleHash,omitempty"`
	WorkerSocket string `json:"workerSocket,omitempty"`
	WorkerHome   string `json:"workerHome,omitempty"`
	// SetupKey is the cache key of the setup phase that last succeeded on the box ("" = none).
	SetupKey string `json:"setupKey,omitempty"`
	// LeasedProfileID is the profile the lease came from: a fallback of ProfileID when the
	// first choice had no capacity. Derived from the profile snapshot.
	LeasedProfileID string `json:"leasedProfileId,omitempty"`
	// Attempts are the earlier provisioning attempts of an environment that fell back.
	Attempts []Attempt         `json:"attempts,omitempty"`
	Profile  providers.Profile `json:"-"`
	// Derived when presented; never stored.
	AgeMs              int64    `json:"ageMs"`
	IdleMs             int64    `json:"idleMs"`
	AttachedSessionIDs []string `json:"attachedSessionIds"`
	TunnelStatus       string   `json:"tunnelStatus"`
	// TTLDeadline is when the gateway's ttl policy destroys the environment if it is not
	// attached (its creation plus its profile snapshot's lifetime.ttl; zero when it has none).
	TTLDeadline time.Time `json:"ttlDeadline,omitzero"`
}

// LeaseInfo is the stored part of a lease. The private key path is kept but never shown.
type LeaseInfo struct {
	SSHHost    string            `json:"sshHost,omitempty"`
	SSHPort    int               `json:"sshPort,omitempty"`
	SSHUser    string            `json:"sshUser,omitempty"`
	SSHKeyPath string            `json:"-"`
	HostKeys   []string          `json:"hostKeys"`
	ExpiresAt  time.Time         `json:"expiresAt,omitzero"`
	Labels     map[string]string `json:"labels,omitempty"`
}

// ProviderLease rebuilds the provider lease from the stored row.
func (e Environment) ProviderLease() providers.Lease {
	return providers.Lease{
		ID: e.LeaseID, SSHHost: e.Lease.SSHHost, SSHPort: e.Lease.SSHPort, SSHUser: e.Lease.SSHUser,
		SSHKeyPath: e.Lease.SSHKeyPath, HostKeys: e.Lease.HostKeys, ExpiresAt: e.Lease.ExpiresAt, Labels: e.Lease.Labels,
	}
}

// Attempt is an earlier provisioning attempt of an environment, on a profile that had no capacity.
type Attempt struct {
	ProfileID   string `json:"profileId"`
	ProviderID  string `json:"providerId"`
	OperationID string `json:"operationId"`
	LeaseID     string `json:"leaseId"`
	Reason      string `json:"reason"`
}

// Event is one recorded state change.
type Event struct {
	ID     int64     `json:"id"`
	At     time.Time `json:"at"`
	From   State     `json:"from"`
	To     State     `json:"to"`
	Reason string    `json:"reason,omitempty"`
	// Step is set on timeline entries (provisioning attempts, bootstrap and setup steps).
	Step *Step `json:"step,omitempty"`
}

const envCols = `id, profile_id, provider_id, COALESCE(idempotency_key,''), operation_id, lease_id, state, error,
	ssh_host, ssh_port, ssh_user, ssh_key_path, host_keys, lease_labels, lease_expires_at, profile_snapshot,
	created_at, updated_at, last_activity_at, bundle_hash, worker_socket, worker_home, setup_key, lease_attempts`

func scanEnv(row store.Scanner) (Environment, error) {
	var e Environment
	var hostKeys, labels, expires, snapshot, created, updated, activity, attempts string
	err := row.Scan(&e.ID, &e.ProfileID, &e.ProviderID, &e.IdempotencyKey, &e.OperationID, &e.LeaseID, &e.State, &e.Error,
		&e.Lease.SSHHost, &e.Lease.SSHPort, &e.Lease.SSHUser, &e.Lease.SSHKeyPath, &hostKeys, &labels, &expires, &snapshot,
		&created, &updated, &activity, &e.BundleHash, &e.WorkerSocket, &e.WorkerHome, &e.SetupKey, &attempts)
	if err != nil {
		return e, err
	}
	_ = json.Unmarshal([]byte(attempts), &e.Attempts)
	_ = json.Unmarshal([]byte(hostKeys), &e.Lease.HostKeys)
	_ = json.Unmarshal([]byte(labels), &e.Lease.Labels)
	_ = json.Unmarshal([]byte(snapshot), &e.Profile)
	if e.Lease.HostKeys == nil {
		e.Lease.HostKeys = []string{}
	}
	e.Lease.ExpiresAt = store.ParseTime(expires)
	e.CreatedAt = store.ParseTime(created)
	e.UpdatedAt = store.ParseTime(updated)
	e.LastActivityAt = store.ParseTime(activity)
	e.AttachedSessionIDs = []string{}
	e.LeasedProfileID = e.Profile.ID
	return e, nil
}

func getEnv(ctx context.Context, q interface {
	QueryRowContext(context.Context, string, ...any) *sql.Row
}, id string) (Environment, error) {
	e, err := scanEnv(q.QueryRowContext(ctx, `SELECT `+envCols+` FROM environments WHERE id=?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return e, fmt.Errorf("environment %q: %w", id, store.ErrNotFound)
	}
	return e, err
}

// transition moves an environment from → to inside tx, writing the event row. It fails with a
// *TransitionError when the table forbids the move or the row is no longer in from.
func (m *Manager) transition(ctx context.Context, tx *sql.Tx, id string, from, to State, reason string) error {
	if !CanTransition(from, to) {
		return &TransitionError{ID: id, From: from, To: to}
	}
	now := store.FormatTime(m.cfg.Clock.Now())
	set := `state=?, updated_at=?`
	args := []any{string(to), now}
	if to == Failed || to == Orphaned {
		set += `, error=?`
		args = append(args, reason)
	}
	args = append(args, id, string(from))
	res, err := tx.ExecContext(ctx, `UPDATE environments SET `+set+` WHERE id=? AND state=?`, args...)
	if err != nil {
		return fmt.Errorf("environment %s %s → %s: %w", id, from, to, err)
	}
	if n, _ := res.RowsAffected(); n != 1 {
		var cur State
		_ = tx.QueryRowContext(ctx, `SELECT state FROM environments WHERE id=?`, id).Scan(&cur)
		return &TransitionError{ID: id, From: cur, To: to}
	}
	_, err = tx.ExecContext(ctx, `INSERT INTO environment_events(environment_id, at, from_state, to_state, reason) VALUES(?,?,?,?,?)`,
		id, now, string(from), string(to), reason)
	if err != nil {
		return fmt.Errorf("environment %s event: %w", id, err)
	}
	return nil
}

// OperationID is the deterministic operation id of an environment's provisioning.
func OperationID(gatewayID, envID string) string {
	sum := sha256.Sum256([]byte("openclaw-provision\x00" + gatewayID + "\x00" + envID))
	return "op_" + hex.EncodeToString(sum[:12])
}

// DefaultLeaseID derives a lease id from the operation id for providers that do not derive their own.
func DefaultLeaseID(opID string) string {
	sum := sha256.Sum256([]byte(opID))
	return "ocl_" + hex.EncodeToString(sum[:6])
}

// maxReasonBytes bounds text copied from providers into errors and events.
const maxReasonBytes = 512

// Sanitize bounds provider output for display: control characters removed, at most maxReasonBytes.
func Sanitize(s string) string { return untrusted.Line(s, maxReasonBytes) }

package occ

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/openclaw/cloudworkers/gateway/envs"
	"github.com/openclaw/cloudworkers/gateway/store"
	"github.com/openclaw/cloudworkers/providers"
)

// RevState is a revision's lifecycle state, stored as-is.
type RevState string

// Revision states.
const (
	RevPreparing RevState = "preparing" // an environment is being leased and bootstrapped
	RevReady     RevState = "ready"     // its worker was admitted
	RevFailed    RevState = "failed"    // startup failed (runtimeFailure reported)
	RevStopped   RevState = "stopped"   // route removed, environment released; state kept
	RevRetired   RevState = "retired"   // credentials revoked, environment destroyed; terminal
)

var revTransitions = map[RevState][]RevState{
	RevPreparing: {RevReady, RevFailed, RevStopped, RevRetired},
	RevReady:     {RevPreparing, RevStopped, RevRetired},
	RevFailed:    {RevStopped, RevRetired},
	RevStopped:   {RevPreparing, RevRetired},
	RevRetired:   {},
}

// Terminal reports whether nothing follows s.
func (s RevState) Terminal() bool { return s == RevRetired }

// canMove reports whether from → to is allowed.
func canMove(from, to RevState) bool { return slices.Contains(revTransitions[from], to) }

// AgentRevision is OCC's AgentRevision (the fields the driver reads).
type AgentRevision struct {
	ID                 string          `json:"id"`
	NamespaceID        string          `json:"namespaceId"`
	AgentID            string          `json:"agentId"`
	Revision           int64           `json:"revision"`
	Configuration      json.RawMessage `json:"configuration"`
	Harness            Harness         `json:"harness"`
	ServicePrincipalID string          `json:"servicePrincipalId,omitempty"`
}

// Harness is a revision's harness.
type Harness struct {
	ID      string `json:"id"`
	Version string `json:"version,omitempty"`
	Mode    string `json:"mode"`
}

// RevisionConfig is the part of a revision's configuration the driver applies; every other key
// belongs to OCC and the agent runtime.
type RevisionConfig struct {
	ProfileID                   string `json:"profileId,omitempty"`
	MachineClass                string `json:"machineClass,omitempty"`
	Model                       string `json:"model,omitempty"`
	Workspace                   string `json:"workspace,omitempty"`
	RequiresStoppedPredecessors bool   `json:"requiresStoppedPredecessors,omitempty"`
}

const maxConfigString = 256

func parseRevisionConfig(field string, raw json.RawMessage) (RevisionConfig, error) {
	var rc RevisionConfig
	if len(raw) == 0 || string(raw) == "null" {
		return rc, nil
	}
	var probe map[string]json.RawMessage
	if json.Unmarshal(raw, &probe) != nil {
		return rc, Invalid(field, "must be an object")
	}
	if err := json.Unmarshal(raw, &rc); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return rc, Invalidf(field+"."+te.Field, "must be %s", jsonKind(te.Type.Kind().String()))
		}
		return rc, Invalid(field, "must be an object")
	}
	if rc.ProfileID != "" && !providers.ValidProfileID(rc.ProfileID) {
		return rc, Invalid(field+".profileId", "must be a profile id (lowercase letters, digits, '-' or '_')")
	}
	if rc.MachineClass != "" {
		if err := providers.CheckMachineClass(rc.MachineClass); err != nil {
			return rc, Invalid(field+".machineClass", err.(*providers.FieldError).Message)
		}
	}
	for name, v := range map[string]string{"model": rc.Model, "workspace": rc.Workspace} {
		if len(v) > maxConfigString || strings.ContainsFunc(v, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
			return rc, Invalidf(field+"."+name, "must be at most %d bytes without control characters", maxConfigString)
		}
	}
	return rc, nil
}

func (r AgentRevision) check(field string) error {
	if err := checkID(field+".id", r.ID); err != nil {
		return err
	}
	if err := checkID(field+".namespaceId", r.NamespaceID); err != nil {
		return err
	}
	return checkID(field+".agentId", r.AgentID)
}

// ComputeReadiness is prepareRevision's answer.
type ComputeReadiness struct {
	NamespaceID    string          `json:"namespaceId"`
	AgentID        string          `json:"agentId"`
	RevisionID     string          `json:"revisionId"`
	Ready          bool            `json:"ready"`
	PendingReason  string          `json:"pendingReason,omitempty"`
	RuntimeFailure *RuntimeFailure `json:"runtimeFailure,omitempty"`
}

// RuntimeFailure is a startup failure with safe fields only.
type RuntimeFailure struct {
	Component string        `json:"component"`
	Check     string        `json:"check"`
	CheckedAt string        `json:"checkedAt"`
	Code      string        `json:"code"`
	Cause     *FailureCause `json:"cause,omitempty"`
}

// FailureCause is a runtime failure's cause kind.
type FailureCause struct {
	Kind string `json:"kind"`
}

// Pending reasons and runtime failure codes.
const (
	PendingUnschedulable = "WORKLOAD_UNSCHEDULABLE"
	// CodeUnavailable is the runtime failure code of a bootstrap or provisioning that failed;
	// OCC records it as RUNTIME_STARTUP_FAILED.
	CodeUnavailable = "UNAVAILABLE"
)

type revisionRow struct {
	ID, NamespaceID, AgentID, ProfileID, MachineClass, Model string
	State                                                    RevState
	Attempt                                                  int
	EnvironmentID, PendingReason                             string
	FailureCode, FailureComponent, FailureCheck, FailureAt   string
	RequiresStopped                                          bool
}

func (c *Compute) getRevision(ctx context.Context, q queryer, id string) (revisionRow, error) {
	var r revisionRow
	err := q.QueryRowContext(ctx, `SELECT id, namespace_id, agent_id, profile_id, machine_class, model, state, attempt, environment_id,
		pending_reason, failure_code, failure_component, failure_check, failure_at, requires_stopped FROM occ_revisions WHERE id=?`, id).
		Scan(&r.ID, &r.NamespaceID, &r.AgentID, &r.ProfileID, &r.MachineClass, &r.Model, &r.State, &r.Attempt, &r.EnvironmentID,
			&r.PendingReason, &r.FailureCode, &r.FailureComponent, &r.FailureCheck, &r.FailureAt, &r.RequiresStopped)
	if errors.Is(err, sql.ErrNoRows) {
		return r, store.ErrNotFound
	}
	return r, err
}

// moveRev applies one checked transition with its event row in tx (compare-and-swap on from).
func (c *Compute) moveRev(ctx context.Context, tx *sql.Tx, id string, from, to RevState, reason string, set string, args ...any) error {
	if from != to && !canMove(from, to) {
		return fmt.Errorf("revision %s: %s → %s is not allowed", id, from, to)
	}
	now := store.FormatTime(c.now())
	q := `UPDATE occ_revisions SET state=?, updated_at=?`
	if set != "" {
		q += ", " + set
	}
	q += ` WHERE id=? AND state=?`
	res, err := tx.ExecContext(ctx, q, append(append([]any{string(to), now}, args...), id, string(from))...)
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n != 1 {
		return fmt.Errorf("revision %s is no longer %s: %w", id, from, errRaced)
	}
	if from == to {
		return nil
	}
	_, err = tx.ExecContext(ctx, `INSERT INTO occ_revision_events(revision_id, at, from_state, to_state, reason) VALUES(?,?,?,?,?)`,
		id, now, string(from), string(to), reason)
	return err
}

var errRaced = errors.New("changed concurrently")

// lookupRevision checks that rev is known and belongs to the namespace and agent the caller
// names; a revision recorded under another namespace is a permanent failure.
func (c *Compute) lookupRevision(ctx context.Context, rev AgentRevision) (revisionRow, error) {
	r, err := c.getRevision(ctx, c.d.DB.R, rev.ID)
	if err != nil {
		return r, err
	}
	if r.NamespaceID != rev.NamespaceID || r.AgentID != rev.AgentID {
		return r, Permanent(CodeForeignNamespace, "revision "+rev.ID+" belongs to another namespace or agent")
	}
	return r, nil
}

func decodeRevision(body json.RawMessage) (AgentRevision, error) {
	var in struct {
		Revision AgentRevision `json:"revision"`
	}
	if err := Bind(body, &in); err != nil {
		return AgentRevision{}, err
	}
	return in.Revision, in.Revision.check("revision")
}

func (c *Compute) prepareRevision(ctx context.Context, body json.RawMessage) (any, error) {
	rev, err := decodeRevision(body)
	if err != nil {
		return nil, err
	}
	if rev.Harness.Mode != "" && rev.Harness.Mode != "embedded" {
		return nil, Invalid("revision.harness.mode", "must be embedded: this driver runs the harness inside the agent runtime on the worker")
	}
	rc, err := parseRevisionConfig("revision.configuration", rev.Configuration)
	if err != nil {
		return nil, err
	}
	ns, err := c.getNamespace(ctx, c.d.DB.R, rev.NamespaceID)
	if errors.Is(err, store.ErrNotFound) {
		return nil, Permanent(CodeNamespaceNotPrepared, "namespace "+rev.NamespaceID+" was never ensured on this gateway")
	} else if err != nil {
		return nil, err
	}
	profileID, ok := c.d.Config.profileFor(ns.Name, rc.ProfileID)
	if !ok {
		return nil, Permanent("PROVISIONING_REJECTED", "revision.configuration.profileId: profile "+rc.ProfileID+" is not in occ.namespaces."+ns.Name+".allowedProfiles")
	}
	if rc.Model != "" && c.d.ModelKnown != nil && !c.d.ModelKnown(rc.Model) {
		return nil, Permanent("PROVISIONING_REJECTED", "revision.configuration.model: the gateway's model catalog has no model "+SafeReason(rc.Model))
	}
	if _, err := c.bind(ctx, rev.NamespaceID, rev.AgentID, rev.ServicePrincipalID); err != nil {
		return nil, err
	}
	r, err := c.lookupRevision(ctx, rev)
	if errors.Is(err, store.ErrNotFound) {
		if r, err = c.recordRevision(ctx, rev, rc, profileID); err != nil {
			return nil, err
		}
	} else if err != nil {
		return nil, err
	}
	if r.State == RevRetired {
		return nil, Permanent("REVISION_RETIRED", "revision "+rev.ID+" was retired")
	}
	if r.State == RevStopped { // prepared again after a stop: a new environment
		err := c.d.DB.InTx(ctx, func(tx *sql.Tx) error {
			return c.moveRev(ctx, tx, r.ID, RevStopped, RevPreparing, "prepared again after stop",
				"attempt=attempt+1, environment_id='', pending_reason='', failure_code='', failure_component='', failure_check='', failure_at=''")
		})
		if err != nil {
			return nil, err
		}
		if r, err = c.getRevision(ctx, c.d.DB.R, r.ID); err != nil {
			return nil, err
		}
	}
	return c.observe(ctx, r)
}

func (c *Compute) recordRevision(ctx context.Context, rev AgentRevision, rc RevisionConfig, profileID string) (revisionRow, error) {
	now := store.FormatTime(c.now())
	err := c.d.DB.InTx(ctx, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO occ_revisions(id, namespace_id, agent_id, revision, profile_id, machine_class, model,
			requires_stopped, state, attempt, created_at, updated_at) VALUES(?,?,?,?,?,?,?,?,?,1,?,?) ON CONFLICT(id) DO NOTHING`,
			rev.ID, rev.NamespaceID, rev.AgentID, rev.Revision, profileID, rc.MachineClass, rc.Model, rc.RequiresStoppedPredecessors,
			string(RevPreparing), now, now)
		if err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, `INSERT INTO occ_revision_events(revision_id, at, from_state, to_state, reason) VALUES(?,?,?,?,?)`,
			rev.ID, now, "", string(RevPreparing), "prepare on profile "+profileID)
		if err != nil {
			return err
		}
		return store.Audit(ctx, tx, c.now(), "occ.revision.prepare", "", "revision "+rev.ID+" namespace "+rev.NamespaceID+" profile "+profileID)
	})
	if err != nil {
		return revisionRow{}, err
	}
	return c.lookupRevision(ctx, rev)
}

// observe brings a preparing or ready revision up to date with its environment and answers its
// readiness. The environment of attempt n is found by its idempotency key, so a repeated call
// (also after a gateway restart, mid-provisioning) adopts it instead of leasing again.
func (c *Compute) observe(ctx context.Context, r revisionRow) (ComputeReadiness, error) {
	out := ComputeReadiness{NamespaceID: r.NamespaceID, AgentID: r.AgentID, RevisionID: r.ID}
	if r.State == RevFailed {
		out.RuntimeFailure = r.failure()
		return out, nil
	}
	for range 3 { // at most: a failed attempt moved on, then the new one observed
		env, created, err := c.d.Envs.CreateClass(ctx, r.ProfileID, envKey(r.NamespaceID, r.ID, r.Attempt), r.MachineClass)
		if errors.Is(err, envs.ErrCapacity) {
			// the profile's maxEnvironments: nothing was leased; the next call tries again
			return c.pending(ctx, r, PendingUnschedulable)
		}
		if errors.Is(err, store.ErrNotFound) {
			return out, Permanent("PROVISIONING_REJECTED", "worker profile "+r.ProfileID+" does not exist on the gateway")
		}
		if err != nil {
			var fe *providers.FieldError
			if errors.As(err, &fe) {
				return out, Permanent("PROVISIONING_REJECTED", SafeReason("worker profile "+r.ProfileID+": "+fe.Field+" refused"))
			}
			if errors.Is(err, envs.ErrConflict) {
				return out, Permanent("PROVISIONING_REJECTED", "the revision's environment key is held by another profile")
			}
			return out, err
		}
		if created || r.EnvironmentID != env.ID {
			if err := c.recordEnv(ctx, r, env.ID); err != nil {
				return out, err
			}
			r.EnvironmentID = env.ID
		}
		switch {
		case env.State == envs.Ready || env.State == envs.Attached || env.State == envs.Idle:
			if !c.d.Admitted(env.ID) {
				return c.pending(ctx, r, "") // a worker reconnecting after a restart
			}
			if env.State != envs.Attached {
				// attached to the agent's session: never reused for another session's dispatch
				// (warm leases), never stopped for idleness or TTL, never destroyed unforced
				if err := c.d.Envs.Attach(ctx, env.ID, c.agentSession(ctx, r.AgentID)); err != nil {
					return out, err
				}
			}
			if r.State == RevPreparing {
				err := c.d.DB.InTx(ctx, func(tx *sql.Tx) error {
					return c.moveRev(ctx, tx, r.ID, RevPreparing, RevReady, "worker admitted on "+env.ID, "pending_reason=''")
				})
				if err != nil && !errors.Is(err, errRaced) {
					return out, err
				}
			}
			out.Ready = true
			return out, nil
		case env.State == envs.Failed:
			if c.isCapacity(env.Error) && !strings.HasPrefix(env.Error, "bootstrap:") {
				if err := c.nextAttempt(ctx, &r, PendingUnschedulable, "provider reported no capacity"); err != nil {
					return out, err
				}
				out.PendingReason = PendingUnschedulable
				return out, nil // the next call leases again
			}
			check, component := "provision", "provider"
			if strings.HasPrefix(env.Error, "bootstrap:") {
				check, component = "bootstrap", "worker"
			}
			c.d.Log.Warn("occ revision startup failed", "revision", r.ID, "env", env.ID, "err", env.Error)
			return c.failRevision(ctx, r, component, check)
		case env.State.Dead() || env.State == envs.Draining || env.State == envs.Destroying:
			// the environment went away under a preparing or ready revision: a new one
			if err := c.nextAttempt(ctx, &r, "", "environment "+env.ID+" "+string(env.State)); err != nil {
				return out, err
			}
			if r, err = c.getRevision(ctx, c.d.DB.R, r.ID); err != nil {
				return out, err
			}
			continue
		case env.State == envs.Bootstrapping: // leased: the no-capacity reason is over
			return c.pending(ctx, r, "")
		default: // requested, provisioning
			return c.pending(ctx, r, r.PendingReason)
		}
	}
	return c.pending(ctx, r, "")
}

func (c *Compute) isCapacity(reason string) bool { return c.capacity.MatchString(reason) }

// pending answers ready:false, keeping reason as the pending reason.
func (c *Compute) pending(ctx context.Context, r revisionRow, reason string) (ComputeReadiness, error) {
	out := ComputeReadiness{NamespaceID: r.NamespaceID, AgentID: r.AgentID, RevisionID: r.ID, PendingReason: reason}
	if r.State == RevReady { // its worker is away: preparing again until it is back
		err := c.d.DB.InTx(ctx, func(tx *sql.Tx) error {
			return c.moveRev(ctx, tx, r.ID, RevReady, RevPreparing, "worker not admitted", "")
		})
		if err != nil && !errors.Is(err, errRaced) {
			return out, err
		}
	}
	return out, nil
}

// recordEnv records env as attempt r.Attempt's environment.
func (c *Compute) recordEnv(ctx context.Context, r revisionRow, envID string) error {
	return c.d.DB.InTx(ctx, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `INSERT INTO occ_revision_environments(revision_id, attempt, environment_id) VALUES(?,?,?)
			ON CONFLICT DO NOTHING`, r.ID, r.Attempt, envID); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, `UPDATE occ_revisions SET environment_id=?, updated_at=? WHERE id=? AND attempt=?`,
			envID, store.FormatTime(c.now()), r.ID, r.Attempt)
		return err
	})
}

// nextAttempt moves the revision on to a new environment (its attempt number grows, so the next
// CreateClass uses a new idempotency key), keeping pendingReason for the answers until then.
func (c *Compute) nextAttempt(ctx context.Context, r *revisionRow, pendingReason, why string) error {
	err := c.d.DB.InTx(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `UPDATE occ_revisions SET attempt=attempt+1, environment_id='', pending_reason=?, updated_at=?
			WHERE id=? AND attempt=?`, pendingReason, store.FormatTime(c.now()), r.ID, r.Attempt)
		if err != nil {
			return err
		}
		if n, _ := res.RowsAffected(); n == 1 && r.State == RevReady {
			return c.moveRev(ctx, tx, r.ID, RevReady, RevPreparing, SafeReason(why), "")
		}
		return nil
	})
	if err == nil {
		r.Attempt++
		r.PendingReason = pendingReason
		if r.State == RevReady {
			r.State = RevPreparing
		}
	}
	return err
}

func (c *Compute) failRevision(ctx context.Context, r revisionRow, component, check string) (ComputeReadiness, error) {
	at := c.now().UTC().Format(time.RFC3339Nano)
	err := c.d.DB.InTx(ctx, func(tx *sql.Tx) error {
		err := c.moveRev(ctx, tx, r.ID, r.State, RevFailed, check+" failed", "failure_code=?, failure_component=?, failure_check=?, failure_at=?",
			CodeUnavailable, component, check, at)
		if err != nil {
			return err
		}
		return store.Audit(ctx, tx, c.now(), "occ.revision.failed", r.EnvironmentID, "revision "+r.ID+" "+check+" failed")
	})
	if err != nil && !errors.Is(err, errRaced) {
		return ComputeReadiness{}, err
	}
	r.FailureCode, r.FailureComponent, r.FailureCheck, r.FailureAt = CodeUnavailable, component, check, at
	return ComputeReadiness{NamespaceID: r.NamespaceID, AgentID: r.AgentID, RevisionID: r.ID, RuntimeFailure: r.failure()}, nil
}

func (r revisionRow) failure() *RuntimeFailure {
	return &RuntimeFailure{Component: r.FailureComponent, Check: r.FailureCheck, CheckedAt: r.FailureAt, Code: r.FailureCode,
		Cause: &FailureCause{Kind: "WRAPPER_ERROR"}}
}

func (c *Compute) activateRevision(ctx context.Context, body json.RawMessage) (any, error) {
	rev, err := decodeRevision(body)
	if err != nil {
		return nil, err
	}
	r, err := c.lookupRevision(ctx, rev)
	if errors.Is(err, store.ErrNotFound) {
		return nil, Permanent("REVISION_NOT_PREPARED", "revision "+rev.ID+" was never prepared")
	} else if err != nil {
		return nil, err
	}
	if r.State != RevReady && r.State != RevPreparing {
		return nil, Permanent("REVISION_NOT_READY", "revision "+rev.ID+" is "+string(r.State))
	}
	readiness, err := c.observe(ctx, r)
	if err != nil {
		return nil, err
	}
	if !readiness.Ready {
		return nil, Retryable("REVISION_NOT_READY", "revision "+rev.ID+" is not ready yet")
	}
	if r, err = c.getRevision(ctx, c.d.DB.R, r.ID); err != nil {
		return nil, err
	}
	// The agent's session moves onto this revision's environment (from a previous revision's,
	// which serves until then); only then is this revision recorded as the one that serves.
	if err := c.route(ctx, r); err != nil {
		return nil, err
	}
	c.keepReserved(ctx, r)
	err = c.d.DB.InTx(ctx, func(tx *sql.Tx) error {
		var active string
		if err := tx.QueryRowContext(ctx, `SELECT active_revision_id FROM occ_agents WHERE id=?`, r.AgentID).Scan(&active); err != nil {
			return err
		}
		if active == r.ID {
			return nil
		}
		if _, err := tx.ExecContext(ctx, `UPDATE occ_agents SET active_revision_id=?, updated_at=? WHERE id=?`,
			r.ID, store.FormatTime(c.now()), r.AgentID); err != nil {
			return err
		}
		return store.Audit(ctx, tx, c.now(), "occ.revision.activate", r.EnvironmentID, "agent "+r.AgentID+" served by revision "+r.ID+" (was "+orNone(active)+")")
	})
	return nil, err
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

// unroute removes rev as its agent's serving revision, if it is.
func (c *Compute) unroute(ctx context.Context, tx *sql.Tx, r revisionRow, why string) error {
	res, err := tx.ExecContext(ctx, `UPDATE occ_agents SET active_revision_id='', updated_at=? WHERE id=? AND active_revision_id=?`,
		store.FormatTime(c.now()), r.AgentID, r.ID)
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n == 1 {
		return store.Audit(ctx, tx, c.now(), "occ.revision.unroute", r.EnvironmentID, "revision "+r.ID+" "+why)
	}
	return nil
}

// preparedRevision reads the revision a request's body names; ok is false when it was never
// prepared.
func (c *Compute) preparedRevision(ctx context.Context, body json.RawMessage) (_ revisionRow, ok bool, _ error) {
	rev, err := decodeRevision(body)
	if err != nil {
		return revisionRow{}, false, err
	}
	r, err := c.lookupRevision(ctx, rev)
	if errors.Is(err, store.ErrNotFound) {
		return r, false, nil
	}
	return r, err == nil, err
}

// settleRevision moves r from its state to to (for reason) with its audit row of kind, in one
// transaction.
func (c *Compute) settleRevision(ctx context.Context, r revisionRow, to RevState, reason, kind string) error {
	return c.d.DB.InTx(ctx, func(tx *sql.Tx) error {
		if err := c.moveRev(ctx, tx, r.ID, r.State, to, reason, ""); err != nil {
			return err
		}
		return store.Audit(ctx, tx, c.now(), kind, r.EnvironmentID, "revision "+r.ID)
	})
}

func (c *Compute) deactivateRevision(ctx context.Context, body json.RawMessage) (any, error) {
	r, ok, err := c.preparedRevision(ctx, body)
	if err != nil || !ok {
		return nil, err // never prepared: nothing serves
	}
	return nil, c.d.DB.InTx(ctx, func(tx *sql.Tx) error { return c.unroute(ctx, tx, r, "deactivated") })
}

func (c *Compute) stopRevision(ctx context.Context, body json.RawMessage) (any, error) {
	r, ok, err := c.preparedRevision(ctx, body)
	if err != nil || !ok || r.State == RevRetired {
		return nil, err // never prepared: nothing runs
	}
	if err := c.d.DB.InTx(ctx, func(tx *sql.Tx) error { return c.unroute(ctx, tx, r, "stopped") }); err != nil {
		return nil, err
	}
	// The agent's session is brought home (its workspace into the anchor) and the worker stops
	// with its environment; the session, its transcript and checkpoints, the workspace anchor
	// and the credential attachments stay on the gateway.
	if err := c.destroyEnvs(ctx, r, false); err != nil {
		return nil, err
	}
	if r.State != RevStopped {
		return nil, c.settleRevision(ctx, r, RevStopped, "stopped", "occ.revision.stop")
	}
	return nil, nil
}

func (c *Compute) retireRevision(ctx context.Context, body json.RawMessage) (any, error) {
	r, ok, err := c.preparedRevision(ctx, body)
	if err != nil || !ok || r.State == RevRetired {
		return nil, err
	}
	if err := c.d.DB.InTx(ctx, func(tx *sql.Tx) error { return c.unroute(ctx, tx, r, "retired") }); err != nil {
		return nil, err
	}
	if err := c.destroyEnvs(ctx, r, true); err != nil {
		return nil, err
	}
	return nil, c.settleRevision(ctx, r, RevRetired, "retired", "occ.revision.retire")
}

// destroyEnvs tears down every environment the revision was given (and nothing else), waiting
// for proof of teardown. With revoke, the environments' worker credentials are revoked first, so
// a worker still holding one is refused from that moment.
func (c *Compute) destroyEnvs(ctx context.Context, r revisionRow, revoke bool) error {
	ids, err := store.Strings(ctx, c.d.DB.R, `SELECT environment_id FROM occ_revision_environments WHERE revision_id=? ORDER BY attempt`, r.ID)
	if err != nil {
		return err
	}
	if revoke && c.d.RevokeCredentialSources != nil {
		if err := c.d.RevokeCredentialSources(ctx, r.NamespaceID, r.ID); err != nil {
			return err
		}
	}
	if revoke && c.d.RevokeWorkerCredentials != nil {
		for _, id := range ids {
			n, err := c.d.RevokeWorkerCredentials(ctx, id)
			if err != nil {
				return err
			}
			if err := c.d.DB.InTx(ctx, func(tx *sql.Tx) error {
				return store.Audit(ctx, tx, c.now(), "occ.revision.revoke", id, fmt.Sprintf("revision %s: %d worker credentials revoked", r.ID, n))
			}); err != nil {
				return err
			}
		}
	}
	// The agent's session leaves first: a pull-back brings the workspace the worker changed
	// back into the gateway's anchor, so releasing the machine loses none of it.
	if err := c.leave(ctx, r, ids); err != nil {
		return err
	}
	dctx, cancel := context.WithTimeout(ctx, c.d.Config.TeardownTimeout.D())
	defer cancel()
	for _, id := range ids {
		e, err := c.d.Envs.Get(ctx, id)
		if errors.Is(err, store.ErrNotFound) || (err == nil && e.State == envs.Destroyed) {
			continue
		}
		if err != nil {
			return err
		}
		if _, err := c.d.Envs.Destroy(dctx, id, true); err != nil {
			if dctx.Err() != nil {
				return Retryable("TEARDOWN_PENDING", "the revision's environment is still being torn down; repeat the call")
			}
			return err
		}
	}
	return nil
}

func (c *Compute) requiresStoppedPredecessors(ctx context.Context, body json.RawMessage) (any, error) {
	rev, err := decodeRevision(body)
	if err != nil {
		return nil, err
	}
	rc, err := parseRevisionConfig("revision.configuration", rev.Configuration)
	if err != nil {
		return nil, err
	}
	return rc.RequiresStoppedPredecessors, nil
}

// RevisionOfEnvironment tells which OCC revision an environment serves (the credential gateway
// binds a revision's attached sources to its environment's model calls through it): any
// environment the revision was given in any attempt, and whether the environment was created for
// an OCC namespace at all (its idempotency key), so that one no live revision owns is refused
// rather than served with the gateway's own credentials.
func (c *Compute) RevisionOfEnvironment(ctx context.Context, envID string) (EnvRevision, error) {
	var out EnvRevision
	var key sql.NullString
	err := c.d.DB.R.QueryRowContext(ctx, `SELECT idempotency_key FROM environments WHERE id=?`, envID).Scan(&key)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return out, err
	}
	out.OCC = ReservedEnvironment(key.String)
	var state, current string
	err = c.d.DB.R.QueryRowContext(ctx, `SELECT r.namespace_id, r.id, r.state, r.environment_id FROM occ_revision_environments e
		JOIN occ_revisions r ON r.id=e.revision_id WHERE e.environment_id=? ORDER BY e.attempt DESC LIMIT 1`, envID).
		Scan(&out.NamespaceID, &out.RevisionID, &state, &current)
	if errors.Is(err, sql.ErrNoRows) {
		return out, nil
	}
	if err != nil {
		return out, err
	}
	out.OCC = true // recorded for a revision: an OCC environment whatever its key
	out.Retired = RevState(state) == RevRetired
	out.Current, out.Ready = current == envID, RevState(state) == RevReady
	return out, nil
}

// agentSession names the session an agent's revisions serve (its id, or the agent's when the
// gateway created none).
func (c *Compute) agentSession(ctx context.Context, agentID string) string {
	var session string
	if err := c.d.DB.R.QueryRowContext(ctx, `SELECT session_id FROM occ_agents WHERE id=?`, agentID).Scan(&session); err != nil || session == "" {
		return "occ agent " + agentID
	}
	return session
}

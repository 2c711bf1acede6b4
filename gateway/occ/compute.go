package occ

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/openclaw/cloudworkers/gateway/envs"
	"github.com/openclaw/cloudworkers/gateway/store"
	"github.com/openclaw/cloudworkers/internal/clock"
	"github.com/openclaw/cloudworkers/providers"
)

// ComputeDeps are the gateway parts the ComputeDriver maps onto.
type ComputeDeps struct {
	DB        *store.DB
	Config    Config
	Profiles  ProfileGetter
	Providers providers.Registry
	Envs      *envs.Manager
	// Admitted reports whether an environment's worker is admitted on the hub.
	Admitted func(envID string) bool
	// RevokeWorkerCredentials revokes every worker credential of an environment (hub).
	RevokeWorkerCredentials func(ctx context.Context, envID string) (int, error)
	// TunnelStatus reports an environment's tunnel state ("connected", …); nil means unknown.
	TunnelStatus func(envID string) string
	// ReadWorkerLog returns at most maxBytes of the end of the worker's log on the box.
	ReadWorkerLog func(ctx context.Context, env envs.Environment, maxBytes int) ([]byte, error)
	// CreateSession creates the gateway session that carries an agent's turns; it returns its id.
	CreateSession func(ctx context.Context, title string) (string, error)
	// HasSources reports whether the credential gateway holds registered sources of a namespace
	// (deleteNamespace refuses a namespace that does); nil means none ever.
	HasSources func(ctx context.Context, namespaceID string) (bool, error)
	// RevokeCredentialSources revokes every credential source attached to a revision (the
	// credential gateway); retireRevision calls it with the worker credentials. Nil: none.
	RevokeCredentialSources func(ctx context.Context, namespaceID, revisionID string) error
	// Router places the agent's session on a revision's environment at activation and brings it
	// home at stop and retirement (placement.Dispatcher); nil: turns are not routed.
	Router SessionRouter
	// ModelKnown reports whether the model catalog serves a model id; nil accepts every model.
	ModelKnown func(model string) bool
	// GatewayCommit is the gateway's git commit (a full lowercase SHA, else reported as null).
	GatewayCommit string
	Log           *slog.Logger
	Clock         clock.Clock
}

// ProfileGetter reads worker profiles (profiles.Store).
type ProfileGetter interface {
	Get(ctx context.Context, id string) (providers.Profile, error)
}

// Compute is the ComputeDriver: namespaces, agents and revisions recorded in SQLite (occ_*
// tables, written only here), each revision an embedded agent runtime on a worker environment.
type Compute struct {
	d        ComputeDeps
	capacity *regexp.Regexp
}

// NewCompute returns the ComputeDriver over deps.
func NewCompute(deps ComputeDeps) (*Compute, error) {
	deps.Config.SetDefaults()
	if deps.Log == nil {
		deps.Log = slog.New(slog.DiscardHandler)
	}
	deps.Clock = clock.Or(deps.Clock)
	re, err := regexp.Compile(deps.Config.CapacityPattern)
	if err != nil {
		return nil, fmt.Errorf("occ.capacityPattern: %w", err)
	}
	return &Compute{d: deps, capacity: re}, nil
}

// Implementation identity of this driver.
const (
	ComputeID             = "openclaw-cloudworkers"
	ComputeImplementation = "openclaw-gateway"
)

// Driver returns the descriptor and methods to register with Server.RegisterCompute.
func (c *Compute) Driver() Driver {
	return Driver{
		Descriptor: Descriptor{ID: ComputeID, Implementation: ComputeImplementation, ActivationOrder: "afterCommit", RuntimeLogging: "platform"},
		Methods: map[string]Method{
			"ensureNamespace":                c.ensureNamespace,
			"deleteNamespace":                c.deleteNamespace,
			"bindAgent":                      c.bindAgent,
			"prepareRevision":                c.prepareRevision,
			"activateRevision":               c.activateRevision,
			"deactivateRevision":             c.deactivateRevision,
			"stopRevision":                   c.stopRevision,
			"retireRevision":                 c.retireRevision,
			"requiresStoppedPredecessors":    c.requiresStoppedPredecessors,
			"preflight":                      c.preflight,
			"validateHarnessAuth":            c.validateHarnessAuth,
			"validateConfiguration":          c.validateConfiguration,
			"getGatewayEndpoint":             c.getGatewayEndpoint,
			"diagnoseAgentDeployment":        c.diagnoseAgentDeployment,
			"describeAgentRuntime":           c.describeAgentRuntime,
			"readAgentRuntimeLogs":           c.readAgentRuntimeLogs,
			"describePrepareRevisionFailure": c.describePrepareRevisionFailure,
			"getRuntimeImages":               c.getRuntimeImages,
		},
	}
}

func (c *Compute) now() time.Time { return c.d.Clock.Now() }

// Namespace is OCC's Namespace.
type Namespace struct {
	ID                string `json:"id"`
	Name              string `json:"name"`
	ExistingNamespace string `json:"existingNamespace,omitempty"`
	Status            string `json:"status,omitempty"`
	CreatedAt         string `json:"createdAt,omitempty"`
}

// Agent is the part of OCC's Agent the driver keeps.
type Agent struct {
	ID                 string `json:"id"`
	NamespaceID        string `json:"namespaceId,omitempty"`
	ServicePrincipalID string `json:"servicePrincipalId,omitempty"`
}

// NamespaceEnsureResult is ensureNamespace's answer.
type NamespaceEnsureResult struct {
	NamespaceID    string `json:"namespaceId"`
	NamespaceReady bool   `json:"namespaceReady"`
	Failure        string `json:"failure,omitempty"`
	Reason         string `json:"reason,omitempty"`
}

// NamespaceDeleteResult is deleteNamespace's answer.
type NamespaceDeleteResult struct {
	NamespaceID      string `json:"namespaceId"`
	NamespaceDeleted bool   `json:"namespaceDeleted"`
	Failure          string `json:"failure,omitempty"`
	Reason           string `json:"reason,omitempty"`
}

// Failure kinds of namespace results.
const (
	FailureRetryable = "retryable"
	FailurePermanent = "permanent"
)

// checkID requires an OCC identifier (letters, digits, . _ : @ -, at most 128).
func checkID(field, v string) error {
	if v == "" {
		return Invalid(field, "is required")
	}
	if !providers.ValidArg(v) { // it reaches lease CLIs inside operation ids
		return Invalid(field, "must be letters, digits, '.', '_', ':', '@' or '-' (at most 128)")
	}
	return nil
}

func (n Namespace) check(field string) error {
	if err := checkID(field+".id", n.ID); err != nil {
		return err
	}
	if !namespaceNameRe.MatchString(n.Name) {
		return Invalid(field+".name", "must be letters, digits, '.', '_' or '-' (at most 128)")
	}
	return nil
}

const reasonMax = 256

// SafeReason keeps a reason within OCC's rules: at most 256 characters of letters, digits,
// spaces and . _ : / @ -. Reasons are composed from fixed text and ids; this is the last guard.
func SafeReason(s string) string {
	var b strings.Builder
	for _, r := range s {
		if b.Len() >= reasonMax {
			break
		}
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', strings.ContainsRune(" ._:/@-", r):
			b.WriteRune(r)
		default:
			b.WriteByte(' ')
		}
	}
	return strings.TrimSpace(b.String())
}

// namespaceRow is a recorded namespace.
type namespaceRow struct {
	ID, Name, ProfileID string
}

func (c *Compute) getNamespace(ctx context.Context, q queryer, id string) (namespaceRow, error) {
	var n namespaceRow
	err := q.QueryRowContext(ctx, `SELECT id, name, profile_id FROM occ_namespaces WHERE id=?`, id).Scan(&n.ID, &n.Name, &n.ProfileID)
	if errors.Is(err, sql.ErrNoRows) {
		return n, store.ErrNotFound
	}
	return n, err
}

type queryer interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

func (c *Compute) ensureNamespace(ctx context.Context, body json.RawMessage) (any, error) {
	var in struct {
		Namespace Namespace `json:"namespace"`
	}
	if err := Bind(body, &in); err != nil {
		return nil, err
	}
	ns := in.Namespace
	if err := ns.check("namespace"); err != nil {
		return nil, err
	}
	res := NamespaceEnsureResult{NamespaceID: ns.ID}
	fail := func(kind, reason string) (any, error) {
		res.Failure, res.Reason = kind, SafeReason(reason)
		return res, nil
	}
	profileID, _ := c.d.Config.profileFor(ns.Name, "")
	existing, err := c.getNamespace(ctx, c.d.DB.R, ns.ID)
	switch {
	case err == nil && existing.Name != ns.Name:
		return fail(FailurePermanent, "namespace id is recorded with another name")
	case err != nil && !errors.Is(err, store.ErrNotFound):
		return nil, err
	}
	prof, err := c.d.Profiles.Get(ctx, profileID)
	if errors.Is(err, store.ErrNotFound) {
		return fail(FailurePermanent, "worker profile "+profileID+" does not exist on the gateway")
	} else if err != nil {
		return nil, err
	}
	prov, err := c.d.Providers.Get(prof.Provider)
	if err != nil {
		return fail(FailurePermanent, "worker profile "+profileID+" names provider "+prof.Provider+" which this gateway lacks")
	}
	if l, ok := prov.(providers.Lister); ok {
		lctx, cancel := context.WithTimeout(ctx, c.d.Config.ProviderCheckTimeout.D())
		_, err := l.List(lctx, prof)
		cancel()
		if err != nil {
			c.d.Log.Warn("occ ensureNamespace: provider check", "namespace", ns.ID, "profile", profileID, "err", err)
			return fail(FailureRetryable, "provider of worker profile "+profileID+" did not answer its list check")
		}
	}
	now := store.FormatTime(c.now())
	err = c.d.DB.InTx(ctx, func(tx *sql.Tx) error {
		r, err := tx.ExecContext(ctx, `INSERT INTO occ_namespaces(id, name, profile_id, created_at, updated_at) VALUES(?,?,?,?,?)
			ON CONFLICT(id) DO UPDATE SET profile_id=excluded.profile_id, updated_at=excluded.updated_at WHERE name=excluded.name`,
			ns.ID, ns.Name, profileID, now, now)
		if err != nil {
			return err
		}
		if n, _ := r.RowsAffected(); n == 0 {
			return errForeign
		}
		return store.Audit(ctx, tx, c.now(), "occ.namespace.ensure", "", "namespace "+ns.ID+" profile "+profileID)
	})
	if errors.Is(err, errForeign) {
		return fail(FailurePermanent, "namespace id is recorded with another name")
	}
	if err != nil {
		return nil, err
	}
	res.NamespaceReady = true
	return res, nil
}

var errForeign = errors.New("recorded for another namespace")

// EnvKeyPrefix is how every environment created for a namespace's revisions starts its
// idempotency key: occ:<namespace id>:.
func EnvKeyPrefix(namespaceID string) string { return "occ:" + namespaceID + ":" }

// ReservedEnvironment reports whether an environment's idempotency key marks it as an OCC
// revision's: it takes only its agent's session (never a warm lease for another).
func ReservedEnvironment(idempotencyKey string) bool {
	return strings.HasPrefix(idempotencyKey, "occ:")
}

// NewAgentWorkspace creates a gateway-owned directory for an agent's workspace under
// <dataDir>/occ/workspaces (mode 0700); its name holds nothing from OCC.
func NewAgentWorkspace(dataDir string) (string, error) {
	root := filepath.Join(dataDir, "occ", "workspaces")
	if err := os.MkdirAll(root, 0o700); err != nil {
		return "", err
	}
	return os.MkdirTemp(root, "agent-")
}

func envKey(namespaceID, revisionID string, attempt int) string {
	return fmt.Sprintf("%s%s:%d", EnvKeyPrefix(namespaceID), revisionID, attempt)
}

func (c *Compute) deleteNamespace(ctx context.Context, body json.RawMessage) (any, error) {
	var in struct {
		Namespace Namespace `json:"namespace"`
	}
	if err := Bind(body, &in); err != nil {
		return nil, err
	}
	if err := checkID("namespace.id", in.Namespace.ID); err != nil {
		return nil, err
	}
	id := in.Namespace.ID
	res := NamespaceDeleteResult{NamespaceID: id}
	ns, err := c.getNamespace(ctx, c.d.DB.R, id)
	if errors.Is(err, store.ErrNotFound) {
		res.NamespaceDeleted = true // absent: nothing of it is left
		return res, nil
	} else if err != nil {
		return nil, err
	}
	if in.Namespace.Name != "" && in.Namespace.Name != ns.Name {
		res.Failure, res.Reason = FailurePermanent, "namespace id is recorded with another name"
		return res, nil
	}
	if c.d.HasSources != nil {
		has, err := c.d.HasSources(ctx, id)
		if err != nil {
			return nil, err
		}
		if has {
			res.Failure, res.Reason = FailureRetryable, "namespace still has registered credential sources"
			return res, nil
		}
	}
	err = c.d.DB.InTx(ctx, func(tx *sql.Tx) error {
		var live int
		if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM occ_revisions WHERE namespace_id=? AND state<>?`, id, string(RevRetired)).Scan(&live); err != nil {
			return err
		}
		if live > 0 {
			return errNotEmpty{fmt.Sprintf("namespace has %d unretired revisions", live)}
		}
		var envCount int
		if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM environments WHERE substr(idempotency_key, 1, ?)=? AND state NOT IN ('destroyed','failed','orphaned')`,
			len(EnvKeyPrefix(id)), EnvKeyPrefix(id)).Scan(&envCount); err != nil {
			return err
		}
		if envCount > 0 {
			return errNotEmpty{fmt.Sprintf("namespace has %d live environments", envCount)}
		}
		for _, q := range []string{
			`DELETE FROM occ_revision_events WHERE revision_id IN (SELECT id FROM occ_revisions WHERE namespace_id=?)`,
			`DELETE FROM occ_revision_environments WHERE revision_id IN (SELECT id FROM occ_revisions WHERE namespace_id=?)`,
			`DELETE FROM occ_revisions WHERE namespace_id=?`,
			`DELETE FROM occ_agents WHERE namespace_id=?`,
			`DELETE FROM occ_namespaces WHERE id=?`,
		} {
			if _, err := tx.ExecContext(ctx, q, id); err != nil {
				return err
			}
		}
		return store.Audit(ctx, tx, c.now(), "occ.namespace.delete", "", "namespace "+id)
	})
	var ne errNotEmpty
	if errors.As(err, &ne) {
		res.Failure, res.Reason = FailureRetryable, SafeReason(ne.reason)
		return res, nil
	}
	if err != nil {
		return nil, err
	}
	res.NamespaceDeleted = true
	return res, nil
}

type errNotEmpty struct{ reason string }

func (e errNotEmpty) Error() string { return e.reason }

func (c *Compute) bindAgent(ctx context.Context, body json.RawMessage) (any, error) {
	var in struct {
		Namespace Namespace `json:"namespace"`
		Agent     Agent     `json:"agent"`
	}
	if err := Bind(body, &in); err != nil {
		return nil, err
	}
	if err := checkID("namespace.id", in.Namespace.ID); err != nil {
		return nil, err
	}
	if err := checkID("agent.id", in.Agent.ID); err != nil {
		return nil, err
	}
	if in.Agent.NamespaceID != "" && in.Agent.NamespaceID != in.Namespace.ID {
		return nil, Invalid("agent.namespaceId", "does not match namespace.id")
	}
	if in.Agent.ServicePrincipalID != "" {
		if err := checkID("agent.servicePrincipalId", in.Agent.ServicePrincipalID); err != nil {
			return nil, err
		}
	}
	if _, err := c.bind(ctx, in.Namespace.ID, in.Agent.ID, in.Agent.ServicePrincipalID); err != nil {
		return nil, err
	}
	return nil, nil
}

// bind records agentID in namespaceID (idempotent) and returns its session id. An agent bound in
// another namespace, or a namespace never ensured, is a permanent failure.
func (c *Compute) bind(ctx context.Context, namespaceID, agentID, principal string) (string, error) {
	if _, err := c.getNamespace(ctx, c.d.DB.R, namespaceID); errors.Is(err, store.ErrNotFound) {
		return "", Permanent(CodeNamespaceNotPrepared, "namespace "+namespaceID+" was never ensured on this gateway")
	} else if err != nil {
		return "", err
	}
	var ns, session string
	err := c.d.DB.R.QueryRowContext(ctx, `SELECT namespace_id, session_id FROM occ_agents WHERE id=?`, agentID).Scan(&ns, &session)
	switch {
	case err == nil && ns != namespaceID:
		return "", Permanent(CodeForeignNamespace, "agent "+agentID+" is bound in another namespace")
	case err == nil && session != "":
		return session, nil
	case err != nil && !errors.Is(err, sql.ErrNoRows):
		return "", err
	}
	if c.d.CreateSession != nil && session == "" {
		if session, err = c.d.CreateSession(ctx, "occ agent "+agentID+" in namespace "+namespaceID); err != nil {
			return "", err
		}
	}
	now := store.FormatTime(c.now())
	err = c.d.DB.InTx(ctx, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO occ_agents(id, namespace_id, service_principal_id, session_id, created_at, updated_at) VALUES(?,?,?,?,?,?)
			ON CONFLICT(id) DO UPDATE SET session_id=CASE WHEN occ_agents.session_id='' THEN excluded.session_id ELSE occ_agents.session_id END,
			service_principal_id=CASE WHEN excluded.service_principal_id<>'' THEN excluded.service_principal_id ELSE occ_agents.service_principal_id END,
			updated_at=excluded.updated_at WHERE occ_agents.namespace_id=excluded.namespace_id`,
			agentID, namespaceID, principal, session, now, now)
		if err != nil {
			return err
		}
		return tx.QueryRowContext(ctx, `SELECT namespace_id, session_id FROM occ_agents WHERE id=?`, agentID).Scan(&ns, &session)
	})
	if err != nil {
		return "", err
	}
	if ns != namespaceID {
		return "", Permanent(CodeForeignNamespace, "agent "+agentID+" is bound in another namespace")
	}
	return session, nil
}

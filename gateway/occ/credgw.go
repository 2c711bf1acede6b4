package occ

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"

	"github.com/openclaw/cloudworkers/gateway/credentials"
	"github.com/openclaw/cloudworkers/gateway/inference"
	"github.com/openclaw/cloudworkers/gateway/store"
	"github.com/openclaw/cloudworkers/internal/clock"
	"github.com/openclaw/cloudworkers/protocol"
	"github.com/openclaw/cloudworkers/providers"
)

// The credential gateway's identity in its descriptor.
const (
	CredentialGatewayID             = "openclaw-credential-gateway"
	CredentialGatewayImplementation = "openclaw-cloudworkers"
)

// The built-in source types, the one secret of every type, and the login mode.
const (
	SourceTypeAnthropic = "anthropic"
	SourceTypeOpenAI    = "openai"
	SecretAPIKey        = "apiKey"
	LoginModeAPIKey     = "api_key"
	RotationNone        = "none"
)

// Source states (CredentialSourceStatus.state).
const (
	SourceReady  = "ready"
	SourceFailed = "failed"
	SourceAbsent = "absent"
)

// Attachment states (attachmentStatus); the table stores only attached or revoked, the rest is
// derived from the source.
const (
	AttachmentReady   = "ready"
	AttachmentFailed  = "failed"
	AttachmentRevoked = "revoked"
	AttachmentAbsent  = "absent"
	// AttachmentPending: attached, and the named sandbox is the revision's environment, but its
	// worker is not admitted yet (the revision is preparing): OCC retries.
	AttachmentPending = "pending"
	// AttachmentWithheld: attached, but the named sandbox is not the revision's current
	// environment, so the credential is withheld from it (its calls are refused).
	AttachmentWithheld = "withheld"

	attachedRow = "attached"
	revokedRow  = "revoked"
)

// Error codes of the credential gateway's permanent failures.
const (
	CodeSourceUnavailable   = "SOURCE_UNAVAILABLE"
	CodeSourceTypeMismatch  = "SOURCE_TYPE_MISMATCH"
	CodeSourceNotBound      = "SOURCE_NOT_BOUND"
	CodeAttachmentRevoked   = "ATTACHMENT_REVOKED"
	CodeNamespaceMismatch   = "NAMESPACE_MISMATCH"
	CodeRotationUnsupported = "ROTATION_UNSUPPORTED"
	// CodeNamespaceNotPrepared and CodeForeignNamespace are the compute side's codes for a
	// namespace never ensured and one recorded under another name.
	CodeNamespaceNotPrepared = "NAMESPACE_NOT_PREPARED"
	CodeForeignNamespace     = "FOREIGN_NAMESPACE"
)

// FieldSpec is one config or secrets field of a source type.
type FieldSpec struct {
	Name        string `json:"name"`
	Required    bool   `json:"required"`
	Description string `json:"description,omitempty"`
}

// HarnessAuth says which model provider a source type authenticates, and how.
type HarnessAuth struct {
	ModelProvider string `json:"modelProvider"`
	LoginMode     string `json:"loginMode"`
}

// CredentialSourceType is one entry of listSourceTypes.
type CredentialSourceType struct {
	Type        string       `json:"type"`
	Config      []FieldSpec  `json:"config"`
	Secrets     []FieldSpec  `json:"secrets"`
	Rotation    string       `json:"rotation"`
	HarnessAuth *HarnessAuth `json:"harnessAuth,omitempty"`
}

// CredentialSourceStatus is the live state of a source.
type CredentialSourceStatus struct {
	State  string `json:"state"`
	Reason string `json:"reason,omitempty"`
}

// Attachment is one {sourceId, ref} of attachForRevision.
type Attachment struct {
	SourceID string `json:"sourceId"`
	Ref      string `json:"ref"`
}

// AttachmentStatus is one {sourceId, state} of attachmentStatus.
type AttachmentStatus struct {
	SourceID string `json:"sourceId"`
	State    string `json:"state"`
}

// SecretStore keeps the sealed values of sources; *credentials.Store is one.
type SecretStore interface {
	Set(ctx context.Context, name, value string) error
	Get(ctx context.Context, name string) (string, error)
	Delete(ctx context.Context, name string) error
}

// ModelCatalog lists the models whose providers the source types authenticate; *inference.Catalog
// is one.
type ModelCatalog interface {
	Models() []inference.Model
}

// EnvironmentRevisions tells the credential gateway which OCC revision an environment serves, so
// that a model call of that environment's worker uses the revision's attached source. The compute
// side answers it.
type EnvironmentRevisions interface {
	RevisionOfEnvironment(ctx context.Context, envID string) (EnvRevision, error)
}

// EnvRevision is what the compute side knows of an environment's OCC revision.
type EnvRevision struct {
	// OCC: the environment was created for a revision of an OCC namespace (its idempotency key
	// says so), whether or not a revision is recorded for it. Its calls never use the gateway's
	// own credentials unless a live revision without attachments (harnessAuth runtime) owns it.
	OCC bool
	// NamespaceID and RevisionID name the recorded revision ("" when none has it).
	NamespaceID, RevisionID string
	// Retired: that revision was retired (its environment's calls are refused).
	Retired bool
	// Current: the environment is the revision's current one; Ready: the revision is ready (its
	// worker was admitted when last observed).
	Current, Ready bool
}

var _ EnvironmentRevisions = (*Compute)(nil)

// CredentialGatewayConfig configures the credential gateway.
type CredentialGatewayConfig struct {
	DB *store.DB
	// Secrets holds the values (the gateway's credentials store).
	Secrets SecretStore
	// Catalog decides the OpenAI-compatible source types and which type a model call needs.
	Catalog ModelCatalog
	// GatewayID scopes the attachment refs to this gateway.
	GatewayID string
	Log       *slog.Logger
	Clock     clock.Clock
}

// CredentialGateway is the CredentialGatewayDriver: source values sealed in the gateway's
// credentials store, one attachment per (revision, source), and CallCredential, which the
// inference proxy asks for the key of each model call (the box never sees it).
type CredentialGateway struct {
	cfg   CredentialGatewayConfig
	types []CredentialSourceType

	mu        sync.RWMutex
	revisions EnvironmentRevisions

	// refusalsAudited keeps the audit of refused calls to one row per (revision, source, reason)
	// and gateway run; the hub's aggregated refusal audit counts every one.
	refusalsAudited sync.Map
}

// NewCredentialGateway builds the credential gateway; its source types come from the catalog.
func NewCredentialGateway(cfg CredentialGatewayConfig) (*CredentialGateway, error) {
	if cfg.DB == nil || cfg.Secrets == nil || cfg.Catalog == nil {
		return nil, errors.New("occ credential gateway: DB, Secrets and Catalog are required")
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	cfg.Clock = clock.Or(cfg.Clock)
	return &CredentialGateway{cfg: cfg, types: sourceTypes(cfg.Catalog.Models())}, nil
}

// SetRevisions tells the credential gateway how to find the revision of an environment (the
// compute side, built after the hub that asks CallCredential). Until it is set, every call uses
// the catalog's own credentials.
func (g *CredentialGateway) SetRevisions(r EnvironmentRevisions) {
	g.mu.Lock()
	g.revisions = r
	g.mu.Unlock()
}

// Driver is the credential gateway side of the HTTP adapter.
func (g *CredentialGateway) Driver() Driver {
	return Driver{
		Descriptor: Descriptor{ID: CredentialGatewayID, Implementation: CredentialGatewayImplementation},
		Methods: map[string]Method{
			"listSourceTypes":   g.listSourceTypes,
			"registerSource":    g.registerSource,
			"updateSource":      g.updateSource,
			"rotateSource":      g.rotateSource,
			"sourceStatus":      g.sourceStatus,
			"removeSource":      g.removeSource,
			"attachForRevision": g.attachForRevision,
			"attachmentStatus":  g.attachmentStatus,
			"withdraw":          g.withdraw,
		},
	}
}

// ---- source types ----------------------------------------------------------------------------

// typeForModel is the source type that authenticates calls to m ("" for a provider that needs
// none, the scripted one).
func typeForModel(m inference.Model) string {
	switch m.API {
	case inference.APIAnthropicMessages:
		return SourceTypeAnthropic
	case inference.APIOpenAIResponses:
		return SourceTypeOpenAI
	case inference.APIOpenAICompletions:
		if m.BaseURL == inference.DefaultOpenAIBaseURL || m.Provider == SourceTypeOpenAI || m.Provider == SourceTypeAnthropic {
			return SourceTypeOpenAI
		}
		return m.Provider
	}
	return ""
}

func apiKeyType(typ, provider, description string) CredentialSourceType {
	return CredentialSourceType{
		Type: typ, Config: []FieldSpec{}, Rotation: RotationNone,
		Secrets:     []FieldSpec{{Name: SecretAPIKey, Required: true, Description: description}},
		HarnessAuth: &HarnessAuth{ModelProvider: provider, LoginMode: LoginModeAPIKey},
	}
}

// sourceTypes is the catalog of listSourceTypes: anthropic and openai always, and one type per
// OpenAI-compatible provider of the model catalog (named after it).
func sourceTypes(models []inference.Model) []CredentialSourceType {
	out := []CredentialSourceType{
		apiKeyType(SourceTypeAnthropic, SourceTypeAnthropic, "Anthropic API key; the gateway sends it on the revision's Anthropic Messages calls"),
		apiKeyType(SourceTypeOpenAI, SourceTypeOpenAI, "OpenAI API key; the gateway sends it on the revision's OpenAI calls"),
	}
	seen := map[string]bool{SourceTypeAnthropic: true, SourceTypeOpenAI: true}
	var compatible []string
	for _, m := range models {
		if t := typeForModel(m); t != "" && !seen[t] {
			seen[t] = true
			compatible = append(compatible, t)
		}
	}
	sort.Strings(compatible)
	for _, p := range compatible {
		out = append(out, apiKeyType(p, p, "API key of the OpenAI-compatible provider "+p+" of the gateway's model catalog"))
	}
	return out
}

func (g *CredentialGateway) sourceType(name string) (CredentialSourceType, bool) {
	for _, t := range g.types {
		if t.Type == name {
			return t, true
		}
	}
	return CredentialSourceType{}, false
}

func (g *CredentialGateway) typeNames() string {
	names := make([]string, len(g.types))
	for i, t := range g.types {
		names[i] = t.Type
	}
	return strings.Join(names, ", ")
}

// ---- request shapes --------------------------------------------------------------------------

type cgSource struct {
	ID          string `json:"id"`
	Type        string `json:"type"`
	NamespaceID string `json:"namespaceId"`
}

type cgSourceInput struct {
	Type    string            `json:"type"`
	Config  map[string]string `json:"config"`
	Secrets map[string]string `json:"secrets"`
}

// credRevision is an AgentRevision with the sources OCC bound to it.
type credRevision struct {
	AgentRevision
	CredentialSources *[]struct {
		SourceID   string `json:"sourceId"`
		SourceType string `json:"sourceType"`
	} `json:"credentialSources"`
}

// sourceRequest is the body of the source methods: {"namespace", "source", "input"?}.
type sourceRequest struct {
	Namespace Namespace      `json:"namespace"`
	Source    cgSource       `json:"source"`
	Input     *cgSourceInput `json:"input"`
}

func decodeSource(body json.RawMessage, withInput bool) (sourceRequest, error) {
	var r sourceRequest
	if err := Bind(body, &r); err != nil {
		return r, err
	}
	if e := checkID("namespace.id", r.Namespace.ID); e != nil {
		return r, e
	}
	if e := checkID("source.id", r.Source.ID); e != nil {
		return r, e
	}
	if r.Source.NamespaceID != "" && r.Source.NamespaceID != r.Namespace.ID {
		return r, Permanent(CodeNamespaceMismatch, "source.namespaceId is not namespace.id")
	}
	if withInput && r.Input == nil {
		return r, Invalid("input", "is required ({type, config, secrets})")
	}
	return r, nil
}

// attachmentRequest is the body of the attachment methods: {"namespace", "revision", "sources",
// "sandbox"?} and, for withdraw, "sourceId" and "recheck"? (a revocation here takes effect at
// once, so there is nothing to recheck).
type attachmentRequest struct {
	Namespace Namespace    `json:"namespace"`
	Revision  credRevision `json:"revision"`
	Sources   []cgSource   `json:"sources"`
	SourceID  string       `json:"sourceId"`
	Sandbox   *sandboxRef  `json:"sandbox"`
}

// sandboxRef is OCC's SandboxResourceRef: here resourceName is the revision's environment id.
type sandboxRef struct {
	NamespaceName string `json:"namespaceName"`
	ResourceName  string `json:"resourceName"`
	AgentID       string `json:"agentId"`
	RevisionID    string `json:"revisionId"`
}

func decodeAttachmentRequest(body json.RawMessage) (attachmentRequest, error) {
	var r attachmentRequest
	if err := Bind(body, &r); err != nil {
		return r, err
	}
	if e := checkID("namespace.id", r.Namespace.ID); e != nil {
		return r, e
	}
	if e := r.Revision.check("revision"); e != nil {
		return r, e
	}
	if r.Revision.NamespaceID != r.Namespace.ID {
		return r, Permanent(CodeNamespaceMismatch, fmt.Sprintf("revision %s does not belong to namespace %s", r.Revision.ID, r.Namespace.ID))
	}
	if r.Sources == nil {
		return r, Invalid("sources", "is required (the revision's bound source records)")
	}
	if sb := r.Sandbox; sb != nil {
		if sb.RevisionID != "" && sb.RevisionID != r.Revision.ID {
			return r, Invalid("sandbox.revisionId", "does not match revision.id")
		}
		if sb.AgentID != "" && sb.AgentID != r.Revision.AgentID {
			return r, Invalid("sandbox.agentId", "does not match revision.agentId")
		}
		if sb.ResourceName != "" && !providers.ValidArg(sb.ResourceName) {
			return r, Invalid("sandbox.resourceName", "must be letters, digits, '.', '_', ':', '@' or '-' (at most 128)")
		}
	}
	seen := map[string]bool{}
	for i, s := range r.Sources {
		f := fmt.Sprintf("sources[%d]", i)
		if e := checkID(f+".id", s.ID); e != nil {
			return r, e
		}
		if seen[s.ID] {
			return r, Invalidf(f+".id", "repeats source %s", s.ID)
		}
		seen[s.ID] = true
		if s.NamespaceID != "" && s.NamespaceID != r.Namespace.ID {
			return r, Permanent(CodeNamespaceMismatch, fmt.Sprintf("%s: source %s does not belong to namespace %s", f, s.ID, r.Namespace.ID))
		}
		if bound := r.Revision.CredentialSources; bound != nil {
			listed := false
			for _, b := range *bound {
				listed = listed || b.SourceID == s.ID
			}
			if !listed {
				return r, Permanent(CodeSourceNotBound, fmt.Sprintf("%s: source %s is not among revision %s's credentialSources", f, s.ID, r.Revision.ID))
			}
		}
	}
	return r, nil
}

// validSecret reports whether v can be sent in a provider's auth header: printable ASCII, no
// spaces (a CR or LF would split the header).
func validSecret(v string) bool {
	for i := 0; i < len(v); i++ {
		if v[i] < 0x21 || v[i] > 0x7e {
			return false
		}
	}
	return true
}

// checkInput checks a source's input against its type, before anything is stored. Messages name
// fields, never values.
func (g *CredentialGateway) checkInput(src cgSource, in cgSourceInput) (CredentialSourceType, *Error) {
	if in.Type == "" {
		return CredentialSourceType{}, Invalid("input.type", "is required")
	}
	t, ok := g.sourceType(in.Type)
	if !ok {
		return t, Invalidf("input.type", "%.64q is not a source type of this gateway (%s)", in.Type, g.typeNames())
	}
	if src.Type != "" && src.Type != in.Type {
		return t, Invalid("source.type", "differs from input.type")
	}
	for k := range in.Config {
		return t, Invalidf("input.config."+truncate(k, 64), "is not a config field of type %s (it has none)", t.Type)
	}
	for k := range in.Secrets {
		if k != SecretAPIKey {
			return t, Invalidf("input.secrets."+truncate(k, 64), "is not a secret of type %s (only %s)", t.Type, SecretAPIKey)
		}
	}
	v, ok := in.Secrets[SecretAPIKey]
	switch {
	case !ok || v == "":
		return t, Invalid("input.secrets."+SecretAPIKey, "is required")
	case len(v) > credentials.MaxValueBytes:
		return t, Invalidf("input.secrets."+SecretAPIKey, "must be at most %d bytes", credentials.MaxValueBytes)
	case !validSecret(v):
		return t, Invalid("input.secrets."+SecretAPIKey, "must be printable ASCII without spaces")
	}
	return t, nil
}

// ---- names -----------------------------------------------------------------------------------

// credentialName is the credentials-store name of a source's value: derived, so a retried
// registration adopts (and a removal deletes) the same stored copy.
func credentialName(namespaceID, sourceID string) string {
	sum := sha256.Sum256([]byte("occ-source\x00" + namespaceID + "\x00" + sourceID))
	return "occ-source-" + hex.EncodeToString(sum[:])[:48]
}

// attachmentRef is the opaque ref of one (revision, source), stable across retries and restarts.
func (g *CredentialGateway) attachmentRef(namespaceID, revisionID, sourceID string) string {
	sum := sha256.Sum256([]byte("occ-attachment\x00" + g.cfg.GatewayID + "\x00" + namespaceID + "\x00" + revisionID + "\x00" + sourceID))
	return "ocref_" + hex.EncodeToString(sum[:])[:32]
}

// ---- sources ---------------------------------------------------------------------------------

type sourceRow struct {
	typ, credential string
}

// source returns the row of a source in namespaceID; ok is false when it is not registered there.
func (g *CredentialGateway) source(ctx context.Context, namespaceID, sourceID string) (sourceRow, bool, error) {
	var r sourceRow
	err := g.cfg.DB.R.QueryRowContext(ctx, `SELECT type, credential_name FROM occ_credential_sources WHERE namespace_id=? AND source_id=?`,
		namespaceID, sourceID).Scan(&r.typ, &r.credential)
	if errors.Is(err, sql.ErrNoRows) {
		return r, false, nil
	}
	if err != nil {
		return r, false, fmt.Errorf("read occ source: %w", err)
	}
	return r, true, nil
}

// ensured refuses a namespace the compute side never ensured (registerSource's precondition is
// a ready namespace), or one recorded under another name.
func (g *CredentialGateway) ensured(ctx context.Context, ns Namespace) error {
	var name string
	err := g.cfg.DB.R.QueryRowContext(ctx, `SELECT name FROM occ_namespaces WHERE id=?`, ns.ID).Scan(&name)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return Permanent(CodeNamespaceNotPrepared, "namespace "+ns.ID+" was never ensured on this gateway (ensureNamespace first)")
	case err != nil:
		return fmt.Errorf("read occ namespace: %w", err)
	case ns.Name != "" && ns.Name != name:
		return Permanent(CodeForeignNamespace, "namespace id "+ns.ID+" is recorded with another name")
	}
	return nil
}

func (g *CredentialGateway) listSourceTypes(context.Context, json.RawMessage) (any, error) {
	return g.types, nil
}

// registerSource stores the value sealed under the source's derived name, then records the
// source. Repeating it adopts the same stored copy.
func (g *CredentialGateway) registerSource(ctx context.Context, body json.RawMessage) (any, error) {
	r, err := decodeSource(body, true)
	if err != nil {
		return nil, err
	}
	if _, e := g.checkInput(r.Source, *r.Input); e != nil {
		return nil, e
	}
	if err := g.ensured(ctx, r.Namespace); err != nil {
		return nil, err
	}
	row, found, err := g.source(ctx, r.Namespace.ID, r.Source.ID)
	if err != nil {
		return nil, err
	}
	if found && row.typ != r.Input.Type {
		return nil, Permanent(CodeSourceTypeMismatch, fmt.Sprintf("source %s is registered with type %s; register a new source for type %s", r.Source.ID, row.typ, truncate(r.Input.Type, 64)))
	}
	if err := g.store(ctx, r, "occ.source.register"); err != nil {
		return nil, err
	}
	return CredentialSourceStatus{State: SourceReady}, nil
}

// store seals the value and upserts the source row with its audit row.
func (g *CredentialGateway) store(ctx context.Context, r sourceRequest, audit string) error {
	name := credentialName(r.Namespace.ID, r.Source.ID)
	if err := g.cfg.Secrets.Set(ctx, name, r.Input.Secrets[SecretAPIKey]); err != nil {
		return fmt.Errorf("store occ source %s: %w", r.Source.ID, err)
	}
	now := store.FormatTime(g.cfg.Clock.Now())
	return g.cfg.DB.InTx(ctx, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `INSERT INTO occ_credential_sources(namespace_id, source_id, type, credential_name, created_at, updated_at)
			VALUES(?,?,?,?,?,?) ON CONFLICT(namespace_id, source_id) DO UPDATE SET updated_at=excluded.updated_at`,
			r.Namespace.ID, r.Source.ID, r.Input.Type, name, now, now); err != nil {
			return fmt.Errorf("record occ source %s: %w", r.Source.ID, err)
		}
		return store.Audit(ctx, tx, g.cfg.Clock.Now(), audit, "", fmt.Sprintf("namespace %s source %s type %s", r.Namespace.ID, r.Source.ID, r.Input.Type))
	})
}

// updateSource replaces the stored value of a registered source (attachments use it at once).
func (g *CredentialGateway) updateSource(ctx context.Context, body json.RawMessage) (any, error) {
	r, err := decodeSource(body, true)
	if err != nil {
		return nil, err
	}
	if _, e := g.checkInput(r.Source, *r.Input); e != nil {
		return nil, e
	}
	row, found, err := g.source(ctx, r.Namespace.ID, r.Source.ID)
	switch {
	case err != nil:
		return nil, err
	case !found:
		return nil, g.notRegistered(r.Namespace.ID, r.Source.ID)
	case row.typ != r.Input.Type:
		return nil, Permanent(CodeSourceTypeMismatch, fmt.Sprintf("source %s has type %s; its type cannot change", r.Source.ID, row.typ))
	}
	if err := g.store(ctx, r, "occ.source.update"); err != nil {
		return nil, err
	}
	return CredentialSourceStatus{State: SourceReady}, nil
}

func (g *CredentialGateway) notRegistered(namespaceID, sourceID string) *Error {
	return Permanent(CodeSourceUnavailable, fmt.Sprintf("source %s is not registered in namespace %s", sourceID, namespaceID))
}

// rotateSource is refused: every type of this gateway declares rotation "none".
func (g *CredentialGateway) rotateSource(ctx context.Context, body json.RawMessage) (any, error) {
	r, row, found, err := g.lookupSource(ctx, body)
	if err != nil {
		return nil, err
	}
	if !found {
		return nil, g.notRegistered(r.Namespace.ID, r.Source.ID)
	}
	return nil, Permanent(CodeRotationUnsupported, fmt.Sprintf("type %s has rotation none: register a new source and redeploy", row.typ))
}

// sourceStatus derives the live state: absent (not registered in this namespace), failed (the
// stored value is gone, or the type is no longer offered) or ready.
func (g *CredentialGateway) sourceStatus(ctx context.Context, body json.RawMessage) (any, error) {
	_, row, found, err := g.lookupSource(ctx, body)
	if err != nil {
		return nil, err
	}
	if !found {
		return CredentialSourceStatus{State: SourceAbsent}, nil
	}
	return g.status(ctx, row)
}

// lookupSource decodes a {"namespace", "source"} body and reads the source's row in that
// namespace (found false when it is not registered there).
func (g *CredentialGateway) lookupSource(ctx context.Context, body json.RawMessage) (sourceRequest, sourceRow, bool, error) {
	r, err := decodeSource(body, false)
	if err != nil {
		return r, sourceRow{}, false, err
	}
	row, found, err := g.source(ctx, r.Namespace.ID, r.Source.ID)
	return r, row, found, err
}

func (g *CredentialGateway) status(ctx context.Context, row sourceRow) (CredentialSourceStatus, error) {
	if _, ok := g.sourceType(row.typ); !ok {
		return CredentialSourceStatus{State: SourceFailed, Reason: "type " + row.typ + " is no longer offered by the gateway's model catalog"}, nil
	}
	if _, err := g.cfg.Secrets.Get(ctx, row.credential); errors.Is(err, credentials.ErrNotFound) {
		return CredentialSourceStatus{State: SourceFailed, Reason: "the stored value is missing: register the source again"}, nil
	} else if err != nil {
		return CredentialSourceStatus{}, fmt.Errorf("read occ source value: %w", err)
	}
	return CredentialSourceStatus{State: SourceReady}, nil
}

// removeSource deletes the stored copy, then the record; a source that is absent counts as
// removed. The value goes first (also when no record exists: an aborted registration may have
// stored it), so no record ever outlives its removal with a usable value.
func (g *CredentialGateway) removeSource(ctx context.Context, body json.RawMessage) (any, error) {
	r, err := decodeSource(body, false)
	if err != nil {
		return nil, err
	}
	if err := g.cfg.Secrets.Delete(ctx, credentialName(r.Namespace.ID, r.Source.ID)); err != nil && !errors.Is(err, credentials.ErrNotFound) {
		return nil, fmt.Errorf("delete occ source value: %w", err)
	}
	return nil, g.cfg.DB.InTx(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `DELETE FROM occ_credential_sources WHERE namespace_id=? AND source_id=?`, r.Namespace.ID, r.Source.ID)
		if err != nil {
			return fmt.Errorf("delete occ source: %w", err)
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return nil
		}
		return store.Audit(ctx, tx, g.cfg.Clock.Now(), "occ.source.remove", "", fmt.Sprintf("namespace %s source %s", r.Namespace.ID, r.Source.ID))
	})
}

// HasSources reports whether namespaceID has registered sources (deleteNamespace refuses then).
func (g *CredentialGateway) HasSources(ctx context.Context, namespaceID string) (bool, error) {
	var n int
	err := g.cfg.DB.R.QueryRowContext(ctx, `SELECT COUNT(*) FROM occ_credential_sources WHERE namespace_id=?`, namespaceID).Scan(&n)
	return n > 0, err
}

// ---- attachments -----------------------------------------------------------------------------

// attachForRevision binds each source to the revision: the inference proxy then sends that
// source's value on the revision's calls to the providers of its type. It refuses, attaching
// nothing, when a source is not registered in the namespace, has lost its value, repeats a type,
// or was withdrawn from this revision.
func (g *CredentialGateway) attachForRevision(ctx context.Context, body json.RawMessage) (any, error) {
	r, err := decodeAttachmentRequest(body)
	if err != nil {
		return nil, err
	}
	byType, typeOf := map[string]string{}, map[string]string{}
	for i, s := range r.Sources {
		f := fmt.Sprintf("sources[%d]", i)
		row, found, err := g.source(ctx, r.Namespace.ID, s.ID)
		switch {
		case err != nil:
			return nil, err
		case !found:
			return nil, Permanent(CodeSourceUnavailable, fmt.Sprintf("%s: source %s is not registered in namespace %s", f, s.ID, r.Namespace.ID))
		case s.Type != "" && s.Type != row.typ:
			return nil, Permanent(CodeSourceTypeMismatch, fmt.Sprintf("%s: source %s is registered with type %s", f, s.ID, row.typ))
		}
		if other, dup := byType[row.typ]; dup {
			return nil, Invalidf(f, "source %s has type %s like source %s: a revision binds at most one source per type", s.ID, row.typ, other)
		}
		byType[row.typ], typeOf[s.ID] = s.ID, row.typ
		st, err := g.status(ctx, row)
		if err != nil {
			return nil, err
		}
		if st.State != SourceReady {
			return nil, Permanent(CodeSourceUnavailable, fmt.Sprintf("%s: source %s is %s: %s", f, s.ID, st.State, st.Reason))
		}
	}
	out := make([]Attachment, len(r.Sources))
	now := store.FormatTime(g.cfg.Clock.Now())
	err = g.cfg.DB.InTx(ctx, func(tx *sql.Tx) error {
		for i, s := range r.Sources {
			ref := g.attachmentRef(r.Namespace.ID, r.Revision.ID, s.ID)
			var state string
			err := tx.QueryRowContext(ctx, `SELECT state FROM occ_credential_attachments WHERE namespace_id=? AND revision_id=? AND source_id=?`,
				r.Namespace.ID, r.Revision.ID, s.ID).Scan(&state)
			switch {
			case err == nil && state == revokedRow:
				return Permanent(CodeAttachmentRevoked, fmt.Sprintf("sources[%d]: source %s was withdrawn from revision %s; deploy a new revision", i, s.ID, r.Revision.ID))
			case errors.Is(err, sql.ErrNoRows):
				if _, err := tx.ExecContext(ctx, `INSERT INTO occ_credential_attachments(namespace_id, revision_id, source_id, source_type, ref, state, created_at)
					VALUES(?,?,?,?,?,?,?)`, r.Namespace.ID, r.Revision.ID, s.ID, typeOf[s.ID], ref, attachedRow, now); err != nil {
					return fmt.Errorf("record occ attachment: %w", err)
				}
				if err := store.Audit(ctx, tx, g.cfg.Clock.Now(), "occ.source.attach", "", fmt.Sprintf("namespace %s revision %s source %s", r.Namespace.ID, r.Revision.ID, s.ID)); err != nil {
					return err
				}
			case err != nil:
				return fmt.Errorf("read occ attachment: %w", err)
			}
			out[i] = Attachment{SourceID: s.ID, Ref: ref}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// attachmentStatus derives each source's attachment state: absent (never attached), revoked
// (withdrawn or retired), failed (the source or its value is gone) or ready.
func (g *CredentialGateway) attachmentStatus(ctx context.Context, body json.RawMessage) (any, error) {
	r, err := decodeAttachmentRequest(body)
	if err != nil {
		return nil, err
	}
	out := make([]AttachmentStatus, len(r.Sources))
	for i, s := range r.Sources {
		out[i] = AttachmentStatus{SourceID: s.ID}
		var state string
		err := g.cfg.DB.R.QueryRowContext(ctx, `SELECT state FROM occ_credential_attachments WHERE namespace_id=? AND revision_id=? AND source_id=?`,
			r.Namespace.ID, r.Revision.ID, s.ID).Scan(&state)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			out[i].State = AttachmentAbsent
			continue
		case err != nil:
			return nil, fmt.Errorf("read occ attachment: %w", err)
		case state == revokedRow:
			out[i].State = AttachmentRevoked
			continue
		}
		row, found, err := g.source(ctx, r.Namespace.ID, s.ID)
		if err != nil {
			return nil, err
		}
		out[i].State = AttachmentFailed
		if found {
			st, err := g.status(ctx, row)
			if err != nil {
				return nil, err
			}
			if st.State == SourceReady {
				out[i].State = AttachmentReady
			}
		}
	}
	if r.Sandbox == nil || r.Sandbox.ResourceName == "" {
		return out, nil
	}
	// With the provisioned sandbox named: a ready attachment applies to it only if it is the
	// revision's current environment, and from its worker's admission on.
	sandboxState, err := g.sandboxState(ctx, r.Revision.ID, r.Sandbox.ResourceName)
	if err != nil {
		return nil, err
	}
	for i := range out {
		if out[i].State == AttachmentReady {
			out[i].State = sandboxState
		}
	}
	return out, nil
}

// sandboxState is what a ready attachment of revID is for the environment envID: ready (its
// current environment, worker admitted), pending (its current environment, still preparing) or
// withheld (not its current environment).
func (g *CredentialGateway) sandboxState(ctx context.Context, revID, envID string) (string, error) {
	g.mu.RLock()
	revs := g.revisions
	g.mu.RUnlock()
	if revs == nil {
		return AttachmentWithheld, nil
	}
	er, err := revs.RevisionOfEnvironment(ctx, envID)
	switch {
	case err != nil:
		return "", err
	case er.RevisionID != revID || er.Retired || !er.Current:
		return AttachmentWithheld, nil
	case !er.Ready:
		return AttachmentPending, nil
	}
	return AttachmentReady, nil
}

// withdraw revokes one source from one revision: its next model call that needs the source is
// refused (and audited). Revoked is terminal for that revision; a source never attached is
// recorded revoked too, so a later attach cannot grant it.
func (g *CredentialGateway) withdraw(ctx context.Context, body json.RawMessage) (any, error) {
	r, err := decodeAttachmentRequest(body)
	if err != nil {
		return nil, err
	}
	if e := checkID("sourceId", r.SourceID); e != nil {
		return nil, e
	}
	typ, listed := "", false
	for _, s := range r.Sources {
		if s.ID == r.SourceID {
			typ, listed = s.Type, true
		}
	}
	if !listed {
		return nil, Invalid("sourceId", "is not one of sources")
	}
	if row, found, err := g.source(ctx, r.Namespace.ID, r.SourceID); err != nil {
		return nil, err
	} else if found {
		typ = row.typ
	}
	now := store.FormatTime(g.cfg.Clock.Now())
	err = g.cfg.DB.InTx(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `INSERT INTO occ_credential_attachments(namespace_id, revision_id, source_id, source_type, ref, state, created_at, revoked_at)
			VALUES(?,?,?,?,?,?,?,?) ON CONFLICT(namespace_id, revision_id, source_id) DO UPDATE SET state=excluded.state, revoked_at=excluded.revoked_at
			WHERE occ_credential_attachments.state <> excluded.state`,
			r.Namespace.ID, r.Revision.ID, r.SourceID, typ, g.attachmentRef(r.Namespace.ID, r.Revision.ID, r.SourceID), revokedRow, now, now)
		if err != nil {
			return fmt.Errorf("revoke occ attachment: %w", err)
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return nil
		}
		return store.Audit(ctx, tx, g.cfg.Clock.Now(), "occ.source.withdraw", "", fmt.Sprintf("namespace %s revision %s source %s", r.Namespace.ID, r.Revision.ID, r.SourceID))
	})
	if err != nil {
		return nil, err
	}
	return map[string]string{"state": AttachmentRevoked}, nil
}

// RevokeRevision revokes every attachment of a revision (retireRevision: its worker loses the
// credentials before it is stopped). Safe to repeat.
func (g *CredentialGateway) RevokeRevision(ctx context.Context, namespaceID, revisionID string) error {
	now := store.FormatTime(g.cfg.Clock.Now())
	return g.cfg.DB.InTx(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `UPDATE occ_credential_attachments SET state=?, revoked_at=? WHERE namespace_id=? AND revision_id=? AND state<>?`,
			revokedRow, now, namespaceID, revisionID, revokedRow)
		if err != nil {
			return fmt.Errorf("revoke occ attachments of %s: %w", revisionID, err)
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return nil
		}
		return store.Audit(ctx, tx, g.cfg.Clock.Now(), "occ.source.revoke", "", fmt.Sprintf("namespace %s revision %s", namespaceID, revisionID))
	})
}

// ---- the inference proxy's side ----------------------------------------------------------------

// CallCredential is the key of a model call of envID's worker (hub.CallCredentials). An
// environment that serves no OCC revision, or a revision with no attachment, uses the catalog's
// credentials (ok false). A revision with attachments uses the attached source of the model's type
// and nothing else: a withdrawn, removed or missing source refuses the call (a *protocol.Error),
// never falling back to the gateway's own key.
func (g *CredentialGateway) CallCredential(ctx context.Context, envID string, m inference.Model) (string, bool, error) {
	g.mu.RLock()
	revs := g.revisions
	g.mu.RUnlock()
	if revs == nil {
		return "", false, nil
	}
	er, err := revs.RevisionOfEnvironment(ctx, envID)
	if err != nil || !er.OCC {
		return "", false, err
	}
	nsID, revID := er.NamespaceID, er.RevisionID
	switch {
	case revID == "":
		// an OCC namespace's environment no recorded revision owns: never the gateway's key
		g.auditRefusal(ctx, envID, "unknown", "unknown", "", "no recorded revision owns the environment")
		return "", false, protocol.Errorf(protocol.CodeCredentialUnavailable, "environment %s belongs to an OCC namespace but to no recorded revision", envID)
	case er.Retired:
		g.auditRefusal(ctx, envID, nsID, revID, "", "the revision was retired")
		return "", false, protocol.Errorf(protocol.CodeCredentialUnavailable, "revision %s was retired", revID)
	}
	typ := typeForModel(m)
	rows, err := g.cfg.DB.R.QueryContext(ctx, `SELECT a.source_id, a.source_type, a.state, COALESCE(s.credential_name, '')
		FROM occ_credential_attachments a LEFT JOIN occ_credential_sources s ON s.namespace_id=a.namespace_id AND s.source_id=a.source_id
		WHERE a.namespace_id=? AND a.revision_id=? ORDER BY a.source_id`, nsID, revID)
	if err != nil {
		return "", false, fmt.Errorf("read occ attachments: %w", err)
	}
	defer rows.Close()
	var attached bool
	var srcID, state, name string
	for rows.Next() {
		var id, t, st, n string
		if err := rows.Scan(&id, &t, &st, &n); err != nil {
			return "", false, err
		}
		attached = true
		if t == typ && typ != "" {
			srcID, state, name = id, st, n
		}
	}
	if err := rows.Err(); err != nil {
		return "", false, err
	}
	if !attached || typ == "" {
		return "", false, nil
	}
	refuse := func(why string) error {
		g.auditRefusal(ctx, envID, nsID, revID, srcID, why)
		return protocol.Errorf(protocol.CodeCredentialUnavailable, "revision %s: %s", revID, why)
	}
	switch {
	case srcID == "":
		return "", false, refuse(fmt.Sprintf("no credential source of type %s is attached for model %s", typ, m.Ref))
	case state == revokedRow:
		return "", false, refuse("credential source " + srcID + " was withdrawn")
	case name == "":
		return "", false, refuse("credential source " + srcID + " was removed")
	}
	key, err := g.cfg.Secrets.Get(ctx, name)
	if errors.Is(err, credentials.ErrNotFound) {
		return "", false, refuse("credential source " + srcID + " has no stored value")
	}
	if err != nil {
		return "", false, fmt.Errorf("read occ source value: %w", err)
	}
	return key, true, nil
}

// auditRefusal writes one audit row per (revision, source, reason) and gateway run.
func (g *CredentialGateway) auditRefusal(ctx context.Context, envID, nsID, revID, srcID, why string) {
	key := nsID + "\x00" + revID + "\x00" + srcID + "\x00" + why
	if _, done := g.refusalsAudited.LoadOrStore(key, true); done {
		return
	}
	detail := fmt.Sprintf("namespace %s revision %s: %s", nsID, revID, why)
	if err := g.cfg.DB.InTx(ctx, func(tx *sql.Tx) error {
		return store.Audit(ctx, tx, g.cfg.Clock.Now(), "occ.source.refused", envID, detail)
	}); err != nil {
		g.refusalsAudited.Delete(key)
		g.cfg.Log.Warn("audit occ credential refusal", "env", envID, "revision", revID, "err", err)
	}
}

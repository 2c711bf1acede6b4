package occ_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openclaw/cloudworkers/gateway/credentials"
	"github.com/openclaw/cloudworkers/gateway/credentials/credentialstest"
	"github.com/openclaw/cloudworkers/gateway/inference"
	"github.com/openclaw/cloudworkers/gateway/inference/builtin"
	"github.com/openclaw/cloudworkers/gateway/inference/inferencetest"
	"github.com/openclaw/cloudworkers/gateway/occ"
	"github.com/openclaw/cloudworkers/gateway/store"
	"github.com/openclaw/cloudworkers/internal/testrig/testenv"
	"github.com/openclaw/cloudworkers/protocol"
)

// envRevisions is the compute side's answer for the tests: environment → (namespace, revision).
type envRevisions struct {
	mu      sync.Mutex
	m       map[string][2]string
	retired map[string]bool // revision ids
	occOnly map[string]bool // environments of an OCC namespace that no revision owns
}

func (e *envRevisions) RevisionOfEnvironment(_ context.Context, envID string) (occ.EnvRevision, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if r, ok := e.m[envID]; ok {
		return occ.EnvRevision{OCC: true, NamespaceID: r[0], RevisionID: r[1], Retired: e.retired[r[1]]}, nil
	}
	return occ.EnvRevision{OCC: e.occOnly[envID]}, nil
}

// cgHarness is a credential gateway on a real database and credentials store, served by the HTTP
// adapter, with a catalog whose anthropic provider is a loopback server speaking the Anthropic wire
// format.
type cgHarness struct {
	t        *testing.T
	dir      string
	db       *store.DB
	creds    *credentials.Store
	catalog  *inference.Catalog
	gw       *occ.CredentialGateway
	revs     *envRevisions
	http     *httptest.Server
	token    string
	log      *testenv.Buffer
	provider *inferencetest.Server
}

func newCG(t *testing.T) *cgHarness {
	t.Helper()
	ctx := testenv.Context(t, 20*time.Second)
	h := &cgHarness{t: t, dir: t.TempDir(), log: &testenv.Buffer{}, revs: &envRevisions{m: map[string][2]string{}, retired: map[string]bool{}, occOnly: map[string]bool{}}}
	h.creds, h.db = credentialstest.Open(t, h.dir)
	var err error
	// the namespaces the tests use, as ensureNamespace records them (a source is registered
	// only in an ensured namespace)
	for _, id := range []string{"ns1", "ns2", "ns-a", "ns-b"} {
		if _, err := h.db.W.Exec(`INSERT INTO occ_namespaces(id, name, profile_id, created_at, updated_at) VALUES(?,?,'local','','')`, id, id); err != nil {
			t.Fatal(err)
		}
	}
	if err := h.creds.Set(ctx, "gateway-anthropic", "sk-the-gateways-own-key"); err != nil {
		t.Fatal(err)
	}
	h.provider = inferencetest.NewServer(t, func(_ int, w http.ResponseWriter, _ *http.Request) { inferencetest.AnthropicText(w, "hello") })
	h.catalog, err = inference.NewCatalog(inference.CatalogConfig{Default: "anthropic/m", Providers: map[string]inference.ProviderConfig{
		"anthropic": {API: inference.APIAnthropicMessages, BaseURL: h.provider.URL, Credential: "gateway-anthropic", Models: []inference.ModelConfig{{ID: "m"}}},
		"ollama":    {API: inference.APIOpenAICompletions, BaseURL: "http://127.0.0.1:9/v1", Models: []inference.ModelConfig{{ID: "q"}}},
		"demo":      {API: inference.APIScripted, Models: []inference.ModelConfig{{ID: "demo"}}},
	}}, h.creds, builtin.Adapters())
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(h.log, &slog.HandlerOptions{Level: slog.LevelDebug}))
	h.gw, err = occ.NewCredentialGateway(occ.CredentialGatewayConfig{DB: h.db, Secrets: h.creds, Catalog: h.catalog, GatewayID: "gw-test", Log: log})
	if err != nil {
		t.Fatal(err)
	}
	h.gw.SetRevisions(h.revs)
	if h.token, err = occ.EnsureToken(h.dir); err != nil {
		t.Fatal(err)
	}
	srv := occ.NewServer(occ.ServerConfig{DataDir: h.dir, Log: log})
	srv.RegisterCredentialGateway(h.gw.Driver())
	h.http = httptest.NewServer(srv)
	t.Cleanup(h.http.Close)
	return h
}

// call posts body to a credential-gateway method and returns the status and the answer.
func (h *cgHarness) call(method string, body any) (int, json.RawMessage) {
	h.t.Helper()
	b, err := json.Marshal(body)
	if err != nil {
		h.t.Fatal(err)
	}
	return h.raw(http.MethodPost, "/occ/v1/credential-gateway/"+method, b)
}

func (h *cgHarness) raw(method, path string, body []byte) (int, json.RawMessage) {
	h.t.Helper()
	ctx := testenv.Context(h.t, 20*time.Second)
	req, err := http.NewRequestWithContext(ctx, method, h.http.URL+path, bytes.NewReader(body))
	if err != nil {
		h.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+h.token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		h.t.Fatal(err)
	}
	return resp.StatusCode, out
}

// ok calls method and requires a 200, decoding the answer into out (when not nil).
func (h *cgHarness) ok(method string, body, out any) {
	h.t.Helper()
	status, b := h.call(method, body)
	if status != http.StatusOK {
		h.t.Fatalf("%s: %d %s", method, status, b)
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			h.t.Fatalf("%s answer %s: %v", method, b, err)
		}
	}
}

type apiError struct {
	Error occ.Error `json:"error"`
}

// fails calls method and requires status, returning the error.
func (h *cgHarness) fails(method string, body any, status int) occ.Error {
	h.t.Helper()
	got, b := h.call(method, body)
	var e apiError
	if got != status || json.Unmarshal(b, &e) != nil || e.Error.Code == "" {
		h.t.Fatalf("%s: %d %s, want %d with an error", method, got, b, status)
	}
	return e.Error
}

func (h *cgHarness) count(query string, args ...any) int {
	h.t.Helper()
	var n int
	if err := h.db.R.QueryRow(query, args...).Scan(&n); err != nil {
		h.t.Fatal(err)
	}
	return n
}

func ns(id string) map[string]any {
	return map[string]any{"id": id, "name": id, "status": "ready", "createdAt": "2026-12-01T00:00:00Z"}
}

func source(id, typ string) map[string]any {
	return map[string]any{"id": id, "type": typ}
}

func input(typ, key string) map[string]any {
	return map[string]any{"type": typ, "config": map[string]string{}, "secrets": map[string]string{"apiKey": key}}
}

func register(nsID, srcID, typ, key string) map[string]any {
	return map[string]any{"namespace": ns(nsID), "source": source(srcID, typ), "input": input(typ, key)}
}

func revisionCtx(nsID, revID string, sources ...map[string]any) map[string]any {
	if sources == nil {
		sources = []map[string]any{}
	}
	return map[string]any{"namespace": ns(nsID), "revision": map[string]any{"id": revID, "namespaceId": nsID, "agentId": "agent-1", "revision": 1},
		"sources": sources}
}

func secret(t *testing.T) string {
	t.Helper()
	b := make([]byte, 12)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return "sk-ant-test-" + hex.EncodeToString(b)
}

func TestCredentialGatewayDescriptorAndSourceTypes(t *testing.T) {
	h := newCG(t)
	status, b := h.raw(http.MethodGet, "/occ/v1/credential-gateway", nil)
	var d occ.Descriptor
	if status != 200 || json.Unmarshal(b, &d) != nil {
		t.Fatalf("descriptor: %d %s", status, b)
	}
	if d.Capability != "credential_gateway" || d.ID == "" || strings.Join(d.Methods, ",") !=
		"attachForRevision,attachmentStatus,listSourceTypes,registerSource,removeSource,rotateSource,sourceStatus,updateSource,withdraw" {
		t.Fatalf("descriptor %+v", d)
	}
	var types []occ.CredentialSourceType
	h.ok("listSourceTypes", map[string]any{}, &types)
	var names []string
	for _, ty := range types {
		names = append(names, ty.Type)
		if len(ty.Secrets) != 1 || ty.Secrets[0].Name != "apiKey" || !ty.Secrets[0].Required || ty.Rotation != "none" ||
			ty.HarnessAuth == nil || ty.HarnessAuth.ModelProvider != ty.Type || ty.HarnessAuth.LoginMode != "api_key" || ty.Config == nil {
			t.Errorf("type %+v", ty)
		}
	}
	// ollama is the catalog's OpenAI-compatible provider; the scripted demo needs no credential
	if strings.Join(names, ",") != "anthropic,openai,ollama" {
		t.Fatalf("source types %v", names)
	}
}

// Every malformed registration is refused naming the field, before anything is stored, and no
// answer or log line carries the value.
func TestRegisterSourceRefusesBadInputBeforeStoring(t *testing.T) {
	h := newCG(t)
	key := secret(t)
	withSecrets := func(s map[string]string) map[string]any {
		b := register("ns1", "src1", "anthropic", key)
		b["input"].(map[string]any)["secrets"] = s
		return b
	}
	for _, tc := range []struct {
		name   string
		body   any
		status int
		field  string
	}{
		{"no namespace", map[string]any{"source": source("src1", "anthropic"), "input": input("anthropic", key)}, 400, "namespace.id"},
		{"bad namespace id", register("../ns", "src1", "anthropic", key), 400, "namespace.id"},
		{"no source id", register("ns1", "", "anthropic", key), 400, "source.id"},
		{"no input", map[string]any{"namespace": ns("ns1"), "source": source("src1", "anthropic")}, 400, "input"},
		{"unknown type", register("ns1", "src1", "gemini", key), 400, "input.type"},
		{"type differs", map[string]any{"namespace": ns("ns1"), "source": source("src1", "openai"), "input": input("anthropic", key)}, 400, "source.type"},
		{"config field", func() any {
			b := register("ns1", "src1", "anthropic", key)
			b["input"].(map[string]any)["config"] = map[string]string{"baseUrl": "http://evil"}
			return b
		}(), 400, "input.config.baseUrl"},
		{"unknown secret", withSecrets(map[string]string{"apiKey": key, "token": key}), 400, "input.secrets.token"},
		{"missing apiKey", withSecrets(map[string]string{}), 400, "input.secrets.apiKey"},
		{"header injection", withSecrets(map[string]string{"apiKey": key + "\r\nX-Evil: 1"}), 400, "input.secrets.apiKey"},
		{"too long", withSecrets(map[string]string{"apiKey": strings.Repeat("k", credentials.MaxValueBytes+1)}), 400, "input.secrets.apiKey"},
		{"secret not a string", func() any {
			b := register("ns1", "src1", "anthropic", key)
			b["input"].(map[string]any)["secrets"] = map[string]any{"apiKey": 42}
			return b
		}(), 400, "input.secrets"},
		{"namespace never ensured", register("ns-never", "src1", "anthropic", key), 409, "ns-never was never ensured"},
		{"namespace under another name", func() any {
			b := register("ns1", "src1", "anthropic", key)
			b["namespace"].(map[string]any)["name"] = "team-other"
			return b
		}(), 409, "recorded with another name"},
		{"foreign namespace in source", map[string]any{"namespace": ns("ns1"),
			"source": map[string]any{"id": "src1", "type": "anthropic", "namespaceId": "ns2"}, "input": input("anthropic", key)}, 409, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := h.fails("registerSource", tc.body, tc.status)
			if e.Retryable || !strings.Contains(e.Message, tc.field) || strings.Contains(e.Message, key) {
				t.Fatalf("error %+v, want one naming %q without the value", e, tc.field)
			}
		})
	}
	names, err := h.creds.List(testenv.Context(t, 10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if n := h.count(`SELECT COUNT(*) FROM occ_credential_sources`); n != 0 || len(names) != 1 {
		t.Fatalf("after refusals: %d sources, credentials %v (want only the gateway's own)", n, names)
	}
	if strings.Contains(h.log.String(), key) {
		t.Fatal("the log carries the value")
	}
}

// A registered value is ready, idempotent per source id, and stored only sealed: it is in neither
// the database file, its WAL, nor the log, and no answer returns it.
func TestRegisterSourceKeepsTheValueSealed(t *testing.T) {
	h := newCG(t)
	key := secret(t)
	for range 2 {
		var st occ.CredentialSourceStatus
		h.ok("registerSource", register("ns1", "src1", "anthropic", key), &st)
		if st.State != "ready" {
			t.Fatalf("registerSource = %+v, want ready", st)
		}
	}
	var st occ.CredentialSourceStatus
	h.ok("sourceStatus", map[string]any{"namespace": ns("ns1"), "source": source("src1", "anthropic")}, &st)
	if st.State != "ready" {
		t.Fatalf("sourceStatus = %+v", st)
	}
	if n := h.count(`SELECT COUNT(*) FROM occ_credential_sources`); n != 1 {
		t.Fatalf("%d source rows after two registrations, want 1", n)
	}
	// registered again with another type: a permanent refusal, the value kept
	e := h.fails("registerSource", register("ns1", "src1", "openai", key), 409)
	if e.Code != occ.CodeSourceTypeMismatch {
		t.Fatalf("re-register with another type: %+v", e)
	}
	// the answers of every method carry no value
	for _, m := range []string{"sourceStatus", "listSourceTypes"} {
		if _, b := h.call(m, map[string]any{"namespace": ns("ns1"), "source": source("src1", "anthropic")}); bytes.Contains(b, []byte(key)) {
			t.Fatalf("%s answer carries the value", m)
		}
	}
	for _, f := range []string{"gateway.db", "gateway.db-wal", "gateway.db-shm"} {
		b, err := os.ReadFile(filepath.Join(h.dir, f))
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Fatal(err)
		}
		if f == "gateway.db-wal" && len(b) == 0 {
			t.Fatal("no WAL to inspect: the test would prove nothing")
		}
		if bytes.Contains(b, []byte(key)) {
			t.Fatalf("%s holds the value in clear", f)
		}
	}
	if strings.Contains(h.log.String(), key) {
		t.Fatal("the log carries the value")
	}
	// while the gateway itself can still read it (sealed, not lost)
	key2, ok, err := h.attachAndAsk(t, "ns1", "rev1", "src1", "env-1", "anthropic/m")
	if err != nil || !ok || key2 != key {
		t.Fatalf("CallCredential = ok %v, err %v; want the registered value", ok, err)
	}
}

// attachAndAsk attaches src to revision revID (on environment envID) and asks for the key of a
// call to model ref.
func (h *cgHarness) attachAndAsk(t *testing.T, nsID, revID, srcID, envID, ref string) (string, bool, error) {
	t.Helper()
	h.ok("attachForRevision", revisionCtx(nsID, revID, source(srcID, "anthropic")), nil)
	h.revs.mu.Lock()
	h.revs.m[envID] = [2]string{nsID, revID}
	h.revs.mu.Unlock()
	m, err := h.catalog.Resolve(ref)
	if err != nil {
		t.Fatal(err)
	}
	return h.gw.CallCredential(testenv.Context(t, 10*time.Second), envID, m)
}

// stream makes a model call of envID through the catalog the way the inference proxy does, with
// the credential the gateway picks; it returns the refusal, if any.
func (h *cgHarness) stream(envID, ref string) error {
	h.t.Helper()
	ctx := testenv.Context(h.t, 20*time.Second)
	m, err := h.catalog.Resolve(ref)
	if err != nil {
		h.t.Fatal(err)
	}
	key, ok, err := h.gw.CallCredential(ctx, envID, m)
	if err != nil {
		return err
	}
	if ok {
		ctx = inference.WithAPIKey(ctx, key)
	}
	cx := protocol.Context{Messages: []protocol.Message{{Role: protocol.RoleUser, Content: []protocol.Content{{Type: protocol.ContentText, Text: "hi"}}}}}
	if _, err := h.catalog.Stream(ctx, ref, cx, inference.Options{}, func(protocol.StreamEvent) error { return nil }); err != nil {
		h.t.Fatal(err)
	}
	return nil
}

func (h *cgHarness) keysSeen() []string {
	var keys []string
	for _, r := range h.provider.Requests() {
		keys = append(keys, r.APIKey())
	}
	return keys
}

// attachForRevision returns exactly one stable ref per source; the revision's model calls then
// carry that source's key (environments of other revisions, or of none, keep the catalog's);
// withdraw refuses the next call, audited, and is terminal for the revision.
func TestAttachBindsTheSourceToTheRevisionsCalls(t *testing.T) {
	h := newCG(t)
	key := secret(t)
	h.ok("registerSource", register("ns1", "src1", "anthropic", key), nil)
	var first, again []occ.Attachment
	h.ok("attachForRevision", revisionCtx("ns1", "rev1", source("src1", "anthropic")), &first)
	h.ok("attachForRevision", revisionCtx("ns1", "rev1", source("src1", "anthropic")), &again)
	if len(first) != 1 || first[0].SourceID != "src1" || first[0].Ref == "" || strings.Contains(first[0].Ref, key) ||
		len(again) != 1 || again[0] != first[0] {
		t.Fatalf("attachments %+v then %+v, want one stable {src1, ref}", first, again)
	}
	var none []occ.Attachment
	h.ok("attachForRevision", revisionCtx("ns1", "rev-no-sources"), &none)
	if none == nil || len(none) != 0 {
		t.Fatalf("attach without sources = %v, want []", none)
	}
	h.revs.m["env-1"] = [2]string{"ns1", "rev1"}
	h.revs.m["env-other"] = [2]string{"ns1", "rev-no-sources"}

	if err := h.stream("env-1", "anthropic/m"); err != nil {
		t.Fatal(err)
	}
	if err := h.stream("env-other", "anthropic/m"); err != nil {
		t.Fatal(err)
	}
	if err := h.stream("env-not-occ", "anthropic/m"); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(h.keysSeen(), ","); got != key+",sk-the-gateways-own-key,sk-the-gateways-own-key" {
		t.Fatalf("keys the provider saw: %s", got)
	}
	// the revision has an attachment, so a provider it has no source for is refused, not served
	// with the gateway's own credential
	var pe *protocol.Error
	if err := h.stream("env-1", "ollama/q"); !errors.As(err, &pe) || pe.Code != protocol.CodeCredentialUnavailable {
		t.Fatalf("ollama call of rev1: %v, want credential-unavailable", err)
	}
	var sts []occ.AttachmentStatus
	h.ok("attachmentStatus", revisionCtx("ns1", "rev1", source("src1", "anthropic"), source("src-never", "openai")), &sts)
	if len(sts) != 2 || sts[0] != (occ.AttachmentStatus{SourceID: "src1", State: "ready"}) || sts[1].State != "absent" {
		t.Fatalf("attachmentStatus %+v", sts)
	}

	withdraw := revisionCtx("ns1", "rev1", source("src1", "anthropic"))
	withdraw["sandbox"] = map[string]any{"namespaceName": "ns1", "resourceName": "rev1", "agentId": "agent-1", "revisionId": "rev1"}
	withdraw["sourceId"] = "src1"
	for range 2 {
		var w map[string]string
		h.ok("withdraw", withdraw, &w)
		if w["state"] != "revoked" {
			t.Fatalf("withdraw = %v", w)
		}
	}
	for range 2 {
		if err := h.stream("env-1", "anthropic/m"); !errors.As(err, &pe) || pe.Code != protocol.CodeCredentialUnavailable || !strings.Contains(pe.Message, "withdrawn") {
			t.Fatalf("call after withdraw: %v, want credential-unavailable (withdrawn)", err)
		}
	}
	if n := len(h.provider.Requests()); n != 3 {
		t.Fatalf("the provider saw %d requests, want still 3", n)
	}
	if n := h.count(`SELECT COUNT(*) FROM audit WHERE kind='occ.source.refused' AND environment_id='env-1' AND detail LIKE '%withdrawn%'`); n != 1 {
		t.Fatalf("%d refusal audit rows for two refused calls, want 1 (the hub counts the rest)", n)
	}
	if n := h.count(`SELECT COUNT(*) FROM audit WHERE kind='occ.source.withdraw'`); n != 1 {
		t.Fatalf("%d withdraw audit rows for a repeated withdraw, want 1", n)
	}
	h.ok("attachmentStatus", revisionCtx("ns1", "rev1", source("src1", "anthropic")), &sts)
	if sts[0].State != "revoked" {
		t.Fatalf("attachmentStatus after withdraw %+v", sts)
	}
	if e := h.fails("attachForRevision", revisionCtx("ns1", "rev1", source("src1", "anthropic")), 409); e.Code != occ.CodeAttachmentRevoked {
		t.Fatalf("attach after withdraw: %+v", e)
	}
	// other revisions keep the source
	h.revs.m["env-2"] = [2]string{"ns1", "rev2"}
	h.ok("attachForRevision", revisionCtx("ns1", "rev2", source("src1", "anthropic")), nil)
	if err := h.stream("env-2", "anthropic/m"); err != nil {
		t.Fatal(err)
	}
	if keys := h.keysSeen(); keys[len(keys)-1] != key {
		t.Fatal("rev2's call did not carry the source's key")
	}
	// retirement revokes every attachment of the revision
	if err := h.gw.RevokeRevision(testenv.Context(t, 10*time.Second), "ns1", "rev2"); err != nil {
		t.Fatal(err)
	}
	if err := h.stream("env-2", "anthropic/m"); !errors.As(err, &pe) || pe.Code != protocol.CodeCredentialUnavailable {
		t.Fatalf("call after RevokeRevision: %v", err)
	}
}

// attachForRevision throws, attaching nothing, for a source that is not registered in the
// revision's namespace (its own or another's: the answer names nothing of the other namespace),
// for a second source of one type, a revision of another namespace and a source the revision
// does not bind.
func TestAttachRefusesUnavailableOrForeignSources(t *testing.T) {
	h := newCG(t)
	h.ok("registerSource", register("ns-a", "src-a", "anthropic", secret(t)), nil)
	h.ok("registerSource", register("ns-b", "src-b1", "anthropic", secret(t)), nil)
	h.ok("registerSource", register("ns-b", "src-b2", "anthropic", secret(t)), nil)
	mismatch := revisionCtx("ns-b", "rev1", source("src-b1", "anthropic"))
	mismatch["revision"].(map[string]any)["namespaceId"] = "ns-a"
	notBound := revisionCtx("ns-b", "rev1", source("src-b1", "anthropic"))
	notBound["revision"].(map[string]any)["credentialSources"] = []map[string]any{{"sourceId": "src-b2", "credentialGatewayId": "x", "sourceType": "anthropic"}}
	for _, tc := range []struct {
		name   string
		body   any
		status int
		code   string
	}{
		{"another namespace's source", revisionCtx("ns-b", "rev1", source("src-a", "anthropic")), 409, occ.CodeSourceUnavailable},
		{"unregistered source", revisionCtx("ns-b", "rev1", source("src-b1", "anthropic"), source("nope", "anthropic")), 409, occ.CodeSourceUnavailable},
		{"two sources of one type", revisionCtx("ns-b", "rev1", source("src-b1", "anthropic"), source("src-b2", "anthropic")), 400, occ.CodeInvalid},
		{"repeated source", revisionCtx("ns-b", "rev1", source("src-b1", "anthropic"), source("src-b1", "anthropic")), 400, occ.CodeInvalid},
		{"type differs from the registration", revisionCtx("ns-b", "rev1", source("src-b1", "openai")), 409, occ.CodeSourceTypeMismatch},
		{"revision of another namespace", mismatch, 409, occ.CodeNamespaceMismatch},
		{"source the revision does not bind", notBound, 409, occ.CodeSourceNotBound},
		{"no sources field", map[string]any{"namespace": ns("ns-b"), "revision": map[string]any{"id": "rev1", "namespaceId": "ns-b"}}, 400, occ.CodeInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := h.fails("attachForRevision", tc.body, tc.status)
			if e.Code != tc.code || e.Retryable || strings.Contains(e.Message, "ns-a") && tc.name == "another namespace's source" {
				t.Fatalf("error %+v, want %s naming nothing of ns-a", e, tc.code)
			}
		})
	}
	if n := h.count(`SELECT COUNT(*) FROM occ_credential_attachments`); n != 0 {
		t.Fatalf("%d attachments after refusals, want none", n)
	}
	// and another namespace's source is absent from this one's point of view
	var st occ.CredentialSourceStatus
	h.ok("sourceStatus", map[string]any{"namespace": ns("ns-b"), "source": source("src-a", "anthropic")}, &st)
	if st.State != "absent" {
		t.Fatalf("ns-a's source seen from ns-b: %+v", st)
	}
}

// updateSource replaces the value the revision's calls carry; rotateSource is refused (rotation
// none); removeSource deletes the stored copy, succeeds again when it is absent, never touches
// another namespace's source, and leaves the attached revision refused rather than served with
// the gateway's own key.
func TestUpdateRotateAndRemoveSource(t *testing.T) {
	h := newCG(t)
	k1, k2 := secret(t), secret(t)
	h.ok("registerSource", register("ns1", "src1", "anthropic", k1), nil)
	h.ok("registerSource", register("ns2", "src1", "anthropic", k1), nil)
	if _, _, err := h.attachAndAsk(t, "ns1", "rev1", "src1", "env-1", "anthropic/m"); err != nil {
		t.Fatal(err)
	}
	var st occ.CredentialSourceStatus
	h.ok("updateSource", register("ns1", "src1", "anthropic", k2), &st)
	if err := h.stream("env-1", "anthropic/m"); err != nil || st.State != "ready" {
		t.Fatalf("after update: %v, %+v", err, st)
	}
	if keys := h.keysSeen(); len(keys) != 1 || keys[0] != k2 {
		t.Fatal("the call after updateSource did not carry the new value")
	}
	if e := h.fails("updateSource", register("ns1", "src-none", "anthropic", k2), 409); e.Code != occ.CodeSourceUnavailable {
		t.Fatalf("update of an unregistered source: %+v", e)
	}
	if e := h.fails("rotateSource", map[string]any{"namespace": ns("ns1"), "source": source("src1", "anthropic")}, 409); e.Code != occ.CodeRotationUnsupported {
		t.Fatalf("rotateSource: %+v", e)
	}

	ctx := map[string]any{"namespace": ns("ns1"), "source": source("src1", "anthropic")}
	for range 2 {
		h.ok("removeSource", ctx, nil)
	}
	h.ok("sourceStatus", ctx, &st)
	if st.State != "absent" {
		t.Fatalf("status after remove %+v", st)
	}
	var pe *protocol.Error
	if err := h.stream("env-1", "anthropic/m"); !errors.As(err, &pe) || pe.Code != protocol.CodeCredentialUnavailable || !strings.Contains(pe.Message, "removed") {
		t.Fatalf("call after remove: %v, want credential-unavailable (removed)", err)
	}
	var sts []occ.AttachmentStatus
	h.ok("attachmentStatus", revisionCtx("ns1", "rev1", source("src1", "anthropic")), &sts)
	if sts[0].State != "failed" {
		t.Fatalf("attachment of a removed source %+v, want failed", sts)
	}
	h.ok("sourceStatus", map[string]any{"namespace": ns("ns2"), "source": source("src1", "anthropic")}, &st)
	if st.State != "ready" {
		t.Fatalf("ns2's source after ns1's removal: %+v", st)
	}
	names, err := h.creds.List(testenv.Context(t, 10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if len(names) != 2 { // the gateway's own and ns2's
		t.Fatalf("credentials after removal %v", names)
	}
	if has, err := h.gw.HasSources(testenv.Context(t, 10*time.Second), "ns1"); err != nil || has {
		t.Fatalf("HasSources(ns1) = %v, %v", has, err)
	}
	// a source whose value an operator deleted reads failed
	for _, n := range names {
		if strings.HasPrefix(n, "occ-source-") {
			if err := h.creds.Delete(testenv.Context(t, 10*time.Second), n); err != nil {
				t.Fatal(err)
			}
		}
	}
	h.ok("sourceStatus", map[string]any{"namespace": ns("ns2"), "source": source("src1", "anthropic")}, &st)
	if st.State != "failed" || st.Reason == "" {
		t.Fatalf("status of a source without its value %+v", st)
	}
}

// A model call from an environment of an OCC namespace that no live revision owns — its revision
// retired, or none recorded for it — is refused credential-unavailable and audited, never served
// with the gateway's own key, also when the revision had no attachment (harnessAuth runtime). A
// live revision without attachments and an environment outside OCC keep the catalog's credential.
// The compute side's real RevisionOfEnvironment answers from the recorded rows.
func TestRetiredOrUnownedOCCEnvironmentNeverFallsBack(t *testing.T) {
	h := newCG(t)
	h.computeRows()
	for _, env := range []string{"env-live", "env-plain"} {
		if err := h.stream(env, "anthropic/m"); err != nil {
			t.Fatalf("call of %s: %v, want the catalog's credential", env, err)
		}
	}
	for env, want := range map[string]string{"env-ret": "revision rev-ret was retired", "env-orphan": "to no recorded revision"} {
		for range 2 {
			var pe *protocol.Error
			if err := h.stream(env, "anthropic/m"); !errors.As(err, &pe) || pe.Code != protocol.CodeCredentialUnavailable || !strings.Contains(pe.Message, want) {
				t.Fatalf("call of %s: %v, want credential-unavailable (%s)", env, err, want)
			}
		}
		if n := h.count(`SELECT COUNT(*) FROM audit WHERE kind='occ.source.refused' AND environment_id=?`, env); n != 1 {
			t.Fatalf("%d refusal audit rows for %s, want 1", n, env)
		}
	}
	if got := strings.Join(h.keysSeen(), ","); got != "sk-the-gateways-own-key,sk-the-gateways-own-key" {
		t.Fatalf("keys the provider saw: %s, want only the two allowed calls", got)
	}
}

// computeRows puts a real compute side behind the credential gateway, with the rows it would
// have written: agent1 in ns1 with revisions rev-live (ready on env-live), rev-prep (preparing on
// env-prep) and rev-ret (retired, was on env-ret); env-orphan is an OCC namespace's environment
// no revision owns and env-plain one outside OCC.
func (h *cgHarness) computeRows() {
	t := h.t
	t.Helper()
	c, err := occ.NewCompute(occ.ComputeDeps{DB: h.db})
	if err != nil {
		t.Fatal(err)
	}
	h.gw.SetRevisions(c)
	now := store.FormatTime(time.Now())
	for _, q := range [][]any{
		{`INSERT INTO occ_agents(id, namespace_id, created_at, updated_at) VALUES('agent-1','ns1',?,?)`, now, now},
		{`INSERT INTO occ_revisions(id, namespace_id, agent_id, profile_id, state, environment_id, created_at, updated_at) VALUES
			('rev-live','ns1','agent-1','local','ready','env-live',?,?), ('rev-prep','ns1','agent-1','local','preparing','env-prep',?,?),
			('rev-ret','ns1','agent-1','local','retired','env-ret',?,?)`, now, now, now, now, now, now},
		{`INSERT INTO occ_revision_environments(revision_id, attempt, environment_id) VALUES('rev-live',1,'env-live'),('rev-prep',1,'env-prep'),('rev-ret',1,'env-ret')`},
	} {
		if _, err := h.db.W.Exec(q[0].(string), q[1:]...); err != nil {
			t.Fatal(err)
		}
	}
	for id, key := range map[string]any{"env-live": "occ:ns1:rev-live:1", "env-prep": "occ:ns1:rev-prep:1", "env-ret": "occ:ns1:rev-ret:1",
		"env-orphan": "occ:ns1:rev-gone:1", "env-plain": nil} {
		if _, err := h.db.W.Exec(`INSERT INTO environments(id, profile_id, provider_id, idempotency_key, operation_id, state, profile_snapshot,
			created_at, updated_at, last_activity_at) VALUES(?,'local','local',?,?,'ready','{}',?,?,?)`, id, key, "op-"+id, now, now, now); err != nil {
			t.Fatal(err)
		}
	}
}

// attachmentStatus with the provisioned sandbox named (its resourceName the environment id):
// ready only for the revision's current environment once its worker is admitted, pending while
// the revision still prepares on it, withheld for any other environment; a sandbox naming
// another revision or agent is refused naming the field.
func TestAttachmentStatusOfTheNamedSandbox(t *testing.T) {
	h := newCG(t)
	h.computeRows()
	h.ok("registerSource", register("ns1", "src1", "anthropic", secret(t)), nil)
	for _, rev := range []string{"rev-live", "rev-prep"} {
		h.ok("attachForRevision", revisionCtx("ns1", rev, source("src1", "anthropic")), nil)
	}
	status := func(rev, env string) string {
		t.Helper()
		body := revisionCtx("ns1", rev, source("src1", "anthropic"))
		body["sandbox"] = map[string]any{"namespaceName": "ns1", "resourceName": env, "agentId": "agent-1", "revisionId": rev}
		var sts []occ.AttachmentStatus
		h.ok("attachmentStatus", body, &sts)
		if len(sts) != 1 || sts[0].SourceID != "src1" {
			t.Fatalf("attachmentStatus = %+v", sts)
		}
		return sts[0].State
	}
	for _, tc := range []struct{ rev, env, want string }{
		{"rev-live", "env-live", "ready"},
		{"rev-prep", "env-prep", "pending"},
		{"rev-live", "env-prep", "withheld"},
		{"rev-live", "env-orphan", "withheld"},
		{"rev-live", "env-plain", "withheld"},
		{"rev-live", "env-never", "withheld"},
	} {
		if got := status(tc.rev, tc.env); got != tc.want {
			t.Errorf("attachmentStatus of %s on sandbox %s = %s, want %s", tc.rev, tc.env, got, tc.want)
		}
	}
	for field, sandbox := range map[string]map[string]any{
		"sandbox.revisionId":   {"resourceName": "env-live", "revisionId": "rev-prep"},
		"sandbox.agentId":      {"resourceName": "env-live", "agentId": "agent-2"},
		"sandbox.resourceName": {"resourceName": "../env"},
	} {
		body := revisionCtx("ns1", "rev-live", source("src1", "anthropic"))
		body["sandbox"] = sandbox
		if e := h.fails("attachmentStatus", body, 400); !strings.Contains(e.Message, field) {
			t.Errorf("sandbox %v: %+v, want a refusal naming %s", sandbox, e, field)
		}
	}
}

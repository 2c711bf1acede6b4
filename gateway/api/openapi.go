package api

import (
	"encoding/json"
	"fmt"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/openclaw/cloudworkers/gateway/agents"
	"github.com/openclaw/cloudworkers/gateway/boxaccess"
	"github.com/openclaw/cloudworkers/gateway/envs"
	"github.com/openclaw/cloudworkers/gateway/inference"
	"github.com/openclaw/cloudworkers/gateway/openclaw"
	"github.com/openclaw/cloudworkers/gateway/paging"
	"github.com/openclaw/cloudworkers/gateway/placement"
	"github.com/openclaw/cloudworkers/gateway/publish"
	"github.com/openclaw/cloudworkers/gateway/sessions"
	"github.com/openclaw/cloudworkers/gateway/spend"
	"github.com/openclaw/cloudworkers/gateway/store"
	"github.com/openclaw/cloudworkers/gateway/turns"
	"github.com/openclaw/cloudworkers/gateway/workspace"
	"github.com/openclaw/cloudworkers/providers"
)

// Operation is one documented route of the gateway's HTTP API. The OpenAPI document served at
// GET /api/v1/openapi.json is built from Operations; the schemas of bodies are generated from the
// Go types the handlers decode and encode. A test walks the gateway's router and fails on a route
// or a parameter missing here.
type Operation struct {
	Method string
	// Path is the route as echo spells it (/api/v1/sessions/:id); path parameters come from it.
	Path    string
	Summary string
	// Query are the query parameters the handler reads.
	Query []Param
	// Body is a value of the request body's type (nil: no body).
	Body any
	// Status is the success status; Response a value of its body's type (nil: no body; Text: a
	// text/plain body).
	Status   int
	Response any
	// WebSocket marks a route that upgrades to a WebSocket of Response messages.
	WebSocket bool
	// Public marks a route served without the bearer token.
	Public bool
	// Paged marks a list route that pages: ?limit and ?cursor in, X-Next-Cursor and Link out
	// (docs/api.md → Paging).
	Paged bool
}

// Param is a query parameter.
type Param struct {
	Name, Type, Description string
}

// Text is the Response of a route that answers text/plain.
type Text string

// cancelResult is the body of POST /sessions/:id/cancel.
type cancelResult struct {
	Canceled bool `json:"canceled"`
}

type statusBody struct {
	Status string `json:"status"`
}

// Operations documents every route of the gateway's API except /mcp (the MCP protocol over
// streamable HTTP, docs/agents.md) and the Control UI's pages and assets. Keep it in route order
// of gateway/api, then the mounted subsystems.
var Operations = []Operation{
	{Method: "GET", Path: "/healthz", Summary: "Liveness: the process serves HTTP.", Status: 200, Response: statusBody{}, Public: true},
	{Method: "GET", Path: "/readyz", Summary: "Readiness: the gateway has started and its database answers (503 not-ready otherwise).", Status: 200, Response: statusBody{}, Public: true},
	{Method: "GET", Path: "/metrics", Summary: "Prometheus metrics (text exposition format); see docs/operations.md.", Status: 200, Response: Text("")},
	{Method: "GET", Path: "/api/v1/openapi.json", Summary: "This document.", Status: 200, Response: map[string]any{}},
	{Method: "GET", Path: "/api/v1/gateway", Summary: "The gateway's id, version and features.", Status: 200, Response: GatewayInfo{}},

	{Method: "GET", Path: "/api/v1/profiles", Summary: "List the worker profiles, by id; pages.", Status: 200, Response: []providers.Profile{}, Paged: true},
	{Method: "POST", Path: "/api/v1/profiles", Summary: "Create a profile (JSON, or one YAML document with Content-Type application/yaml); 409 exists when the id is taken.", Body: providers.Profile{}, Status: 201, Response: providers.Profile{}},
	{Method: "POST", Path: "/api/v1/profiles/apply", Summary: "Create or replace profiles together: all validated before any is written (none with dryRun); each reported created, updated or unchanged.", Body: ApplyProfilesRequest{}, Status: 200, Response: []AppliedProfile{}},
	{Method: "GET", Path: "/api/v1/profiles/:id", Summary: "One profile (as YAML with Accept: application/yaml).", Status: 200, Response: providers.Profile{}},
	{Method: "PUT", Path: "/api/v1/profiles/:id", Summary: "Create or replace a profile (201 when created).", Body: providers.Profile{}, Status: 200, Response: providers.Profile{}},
	{Method: "DELETE", Path: "/api/v1/profiles/:id", Summary: "Delete a profile (409 conflict while an environment uses it).", Status: 204},

	{Method: "GET", Path: "/api/v1/environments", Summary: "List the environments (live ones, or all with ?all=true), newest created first; pages.", Query: []Param{{"all", "boolean", "include destroyed environments"}}, Status: 200, Response: []envs.Environment{}, Paged: true},
	{Method: "POST", Path: "/api/v1/environments", Summary: "Lease an environment of a profile (200 with the existing one for a repeated idempotencyKey).", Body: createEnvRequest{}, Status: 201, Response: envs.Environment{}},
	{Method: "POST", Path: "/api/v1/environments/sweep", Summary: "Find and destroy leases this gateway labelled but no longer knows.", Status: 200, Response: envs.SweepReport{}},
	{Method: "GET", Path: "/api/v1/environments/:id", Summary: "One environment with its running inference totals.", Status: 200, Response: EnvironmentView{}},
	{Method: "GET", Path: "/api/v1/environments/:id/events", Summary: "The environment's state changes and timeline steps, oldest first; pages.", Status: 200, Response: []envs.Event{}, Paged: true},
	{Method: "GET", Path: "/api/v1/environments/:id/timeline", Summary: "The environment's timeline: provisioning attempts, bootstrap and setup steps (name, start, duration, result, output tail), oldest first.", Status: 200, Response: []envs.Step{}},
	{Method: "DELETE", Path: "/api/v1/environments/:id", Summary: "Destroy an environment: 200 with proof of teardown within ?wait, else 202 while the gateway retries.",
		Query: []Param{{"force", "boolean", "destroy even while a session is attached"}, {"wait", "string", "how long to wait for proof of teardown (a Go duration up to 10m)"}}, Status: 202, Response: envs.Environment{}},
	{Method: "GET", Path: "/api/v1/environments/:id/worker", Summary: "The worker side of an environment: admission, tunnel, backpressure, inference totals.", Status: 200, Response: WorkerInfo{}},
	{Method: "GET", Path: "/api/v1/audit", Summary: "The audit rows, newest first; pages.", Query: []Param{{"environmentId", "string", "only the rows of this environment"}}, Status: 200, Response: []store.AuditEntry{}, Paged: true},
	{Method: "POST", Path: "/api/v1/ui/signin-codes", Summary: "Mint a one-time sign-in code of the Control UI (256 bits, stored hashed, valid 2 minutes, used once at /login?code=…); bearer token only, 429 past 32 unused codes.", Status: 201, Response: SignInCode{}},
	{Method: "GET", Path: "/api/v1/ui/sessions", Summary: "The Control UI's browser sessions (live, and ended in the last day), newest first; bearer token only.", Status: 200, Response: []BrowserSession{}},
	{Method: "DELETE", Path: "/api/v1/ui/sessions/:id", Summary: "End a browser session (its cookie gets 401 from then on); bearer token only.", Status: 200, Response: BrowserSession{}},
	{Method: "GET", Path: "/api/v1/openclaw/devices", Summary: "Devices of OpenClaw's own clients that were issued a device token, seen most recently first (at most 1024).", Status: 200, Response: []openclaw.Device{}},
	{Method: "POST", Path: "/api/v1/openclaw/devices/:id/revoke", Summary: "Revoke a device's token and close its connections.", Status: 200, Response: openclaw.Device{}},

	{Method: "POST", Path: "/api/v1/sessions", Summary: "Create a session (with target {kind: profile} it is dispatched at once).", Body: sessions.CreateRequest{}, Status: 201, Response: sessions.Session{}},
	{Method: "GET", Path: "/api/v1/sessions", Summary: "List the sessions that are not archived, newest created first; pages.", Paged: true,
		Query: []Param{{"all", "boolean", "also the archived sessions"}, {"archived", "boolean", "only the archived sessions"}}, Status: 200, Response: []sessions.Session{}},
	{Method: "GET", Path: "/api/v1/sessions/:id", Summary: "One session.", Status: 200, Response: sessions.Session{}},
	{Method: "GET", Path: "/api/v1/sessions/:id/transcript", Summary: "The session's transcript: all of it, or with ?limit the newest entries (before ?before).",
		Query: []Param{{"limit", "integer", "page size, 1 to 10000"}, {"before", "string", "entry id the page ends before (needs limit)"}}, Status: 200, Response: sessions.TranscriptPage{}},
	{Method: "GET", Path: "/api/v1/sessions/:id/stream", Summary: "WebSocket of the session's live events after ?cursor (a gap message first when some are no longer retained).",
		Query: []Param{{"cursor", "integer", "the last cursor seen (0: all retained)"}}, Status: 101, Response: sessions.StreamMessage{}, WebSocket: true},
	{Method: "GET", Path: "/api/v1/events", Summary: "WebSocket of changes to sessions, environments and placements after ?cursor.",
		Query: []Param{{"cursor", "integer", "the last cursor seen (0: all retained)"}}, Status: 101, Response: sessions.ChangeMessage{}, WebSocket: true},

	{Method: "GET", Path: "/api/v1/models", Summary: "The model catalog and its default.", Status: 200, Response: inference.ModelsResponse{}},
	{Method: "POST", Path: "/api/v1/models/probe", Summary: "One minimal real call to a model (the default when the body is empty).", Body: inference.ProbeRequest{}, Status: 200, Response: inference.Probe{}},
	{Method: "GET", Path: "/api/v1/credentials", Summary: "The stored credentials' names (never their values), by name; pages.", Status: 200, Response: []inference.CredentialInfo{}, Paged: true},
	{Method: "PUT", Path: "/api/v1/credentials/:name", Summary: "Store a credential's value (write-only).", Body: inference.CredentialSetRequest{}, Status: 200, Response: inference.CredentialInfo{}},
	{Method: "DELETE", Path: "/api/v1/credentials/:name", Summary: "Delete a credential.", Status: 204},

	{Method: "POST", Path: "/api/v1/sessions/:id/messages", Summary: "Send a message: starts a turn (202), or returns the turn of a repeated idempotencyKey (200).", Body: turns.SendRequest{}, Status: 202, Response: turns.Turn{}},
	{Method: "GET", Path: "/api/v1/sessions/:id/turns", Summary: "The session's turns, oldest first; pages.", Status: 200, Response: []turns.Turn{}, Paged: true},
	{Method: "GET", Path: "/api/v1/turns/:run", Summary: "One turn by its run id.", Status: 200, Response: turns.Turn{}},
	{Method: "POST", Path: "/api/v1/sessions/:id/cancel", Summary: "Cancel the session's running turn.", Status: 200, Response: cancelResult{}},
	{Method: "DELETE", Path: "/api/v1/sessions/:id", Summary: "Remove a session: a running turn is canceled first; its rows, transcript, anchor or managed worktree and refs/openclaw/* refs go (the branch openclaw/<name> stays). 409 while a worker holds it unless ?force says what to do with its work; the environment is released either way.",
		Query: []Param{{"force", "string", "for a session a worker holds: pull-back (bring its work home first) or discard"}}, Status: 200, Response: turns.RemoveReport{}},
	{Method: "POST", Path: "/api/v1/sessions/:id/archive", Summary: "Archive a session: hidden from GET /sessions by default, read-only (messages and dispatch refused), its transcript kept. 409 while a worker holds it or a turn runs.", Body: turns.ArchiveRequest{}, Status: 200, Response: sessions.Session{}},
	{Method: "POST", Path: "/api/v1/sessions/:id/unarchive", Summary: "Unarchive a session.", Body: turns.ArchiveRequest{}, Status: 200, Response: sessions.Session{}},

	{Method: "POST", Path: "/api/v1/sessions/:id/dispatch", Summary: "Move a session to a worker of a profile; the dispatch runs on in the gateway.", Body: placement.DispatchRequest{}, Status: 202, Response: placement.Placement{}},
	{Method: "POST", Path: "/api/v1/sessions/:id/pullback", Summary: "Bring a session home from its worker (the body is optional).", Body: placement.PullBackRequest{}, Status: 202, Response: placement.Placement{}},
	{Method: "POST", Path: "/api/v1/sessions/:id/publish", Summary: "Push the session's branch openclaw/<session> with the gateway's forge credential and open (or reuse) its pull request (the body is optional).", Body: workspace.PublishRequest{}, Status: 200, Response: publish.Result{}},
	{Method: "POST", Path: "/api/v1/sessions/:id/move", Summary: "Move a session whose worker placement failed to the gateway.", Body: placement.MoveRequest{}, Status: 200, Response: placement.Placement{}},
	{Method: "POST", Path: "/api/v1/environments/:id/check-sync", Summary: "Round-trip a small workspace through the environment's box.", Status: 200, Response: SyncCheck{}},
	{Method: "GET", Path: "/api/v1/environments/:id/sync/manifest", Summary: "The tree on the environment's box.",
		Query: []Param{{"dir", "string", "directory on the box (default: the served session's workspace)"}, {"mode", "string", "selection mode: git or plain (default: the session's)"}}, Status: 200, Response: workspace.BoxTree{}},
	{Method: "GET", Path: "/api/v1/placements", Summary: "The placements (the 10000 most recently updated), by session id; pages.", Status: 200, Response: []placement.Placement{}, Paged: true},
	{Method: "GET", Path: "/api/v1/sessions/:id/changes", Summary: "The commits a worker brought back for the session.", Status: 200, Response: workspace.Changes{}},
	{Method: "GET", Path: "/api/v1/sessions/:id/changes/:commit", Summary: "One commit's diff (X-Truncated: true when cut).", Status: 200, Response: Text("")},
	{Method: "GET", Path: "/api/v1/sessions/:id/placement", Summary: "Where the session runs and the steps that brought it there.", Status: 200, Response: PlacementView{}},

	{Method: "GET", Path: "/api/v1/usage", Summary: "The spend ledger grouped (models and machines): by day (the default, in spend.timeZone), session, profile, agent, model or kind.",
		Query:  []Param{{"by", "string", "day, session, profile, agent, model or kind"}, {"since", "string", "a date (2026-12-01), an RFC 3339 time or a duration back (24h, 7d)"}},
		Status: 200, Response: []spend.UsageRow{}},
	{Method: "GET", Path: "/api/v1/budgets", Summary: "Each budget (the config's and those set at run time) with its window, spend, limit and reset.", Status: 200, Response: []spend.Status{}},
	{Method: "PUT", Path: "/api/v1/budgets/:id", Summary: "Set a budget at run time (not one of the config's).", Body: spend.Budget{}, Status: 200, Response: spend.Status{}},
	{Method: "DELETE", Path: "/api/v1/budgets/:id", Summary: "Remove a budget set at run time.", Status: 204},
	{Method: "GET", Path: "/api/v1/sessions/:id/spend", Summary: "What a session and its tree (its spawned descendants) have spent, and its own budget.", Status: 200, Response: spend.SessionSpend{}},
	{Method: "GET", Path: "/api/v1/sessions/:id/children", Summary: "The sessions this session spawned, with their usage and cost.", Status: 200, Response: []agents.Child{}},
	{Method: "POST", Path: "/api/v1/agents/spawn", Summary: "Spawn a session with no parent, forking dir.", Body: agents.OperatorSpawnRequest{}, Status: 200, Response: agents.SpawnResult{}},
	{Method: "GET", Path: "/api/v1/agents/:id", Summary: "A spawned session's status.", Status: 200, Response: agents.SpawnResult{}},
	{Method: "POST", Path: "/api/v1/agents/:id/send", Summary: "Send a spawned session a follow-up message.", Body: agents.OperatorSendRequest{}, Status: 200, Response: agents.SpawnResult{}},
	{Method: "POST", Path: "/api/v1/agents/:id/pullback", Summary: "Bring a spawned session's results back.", Body: agents.OperatorPullbackRequest{}, Status: 200, Response: agents.SpawnResult{}},

	{Method: "GET", Path: "/api/v1/environments/:id/exec", Summary: "WebSocket running one command or shell on the environment's box through the gateway's pinned SSH trust " +
		"(audited, output bounded per frame and rate, closed when the environment is destroyed). The client's first text message is a Start " +
		"({command, tty, term, rows, cols}); binary messages are data whose first byte is the stream (0 stdin from the client, 1 stdout and 2 stderr " +
		"from the gateway); text messages are controls (resize, eof, signal from the client; the gateway's last message is exit {code, signal, error}).",
		Status: 101, Response: boxaccess.Control{}, WebSocket: true},
	{Method: "GET", Path: "/api/v1/environments/:id/logs", Summary: "The end of the worker's log on the environment's box (text/plain, at most boxAccess.logTailBytes); with follow, what is appended until the client leaves or the environment ends.",
		Query: []Param{{"tail", "integer", "how many of the last lines (0 to 10000, default 200)"}, {"follow", "boolean", "stream what the worker appends"}}, Status: 200, Response: Text("")},
	{Method: "POST", Path: "/api/v1/environments/:id/extend", Summary: "Renew the environment's lease for ttl from now through the provider's renew (409 when it has none; 502 when it refuses); the ttl deadline and lease expiry are updated.",
		Body: boxaccess.ExtendRequest{}, Status: 200, Response: envs.Environment{}},
}

// OpenAPIPath is the echo path of an OpenAPI path template (/sessions/{id} → /sessions/:id) and
// back: the document spells path parameters {name}.
func OpenAPIPath(echoPath string) string {
	parts := strings.Split(echoPath, "/")
	for i, p := range parts {
		if strings.HasPrefix(p, ":") {
			parts[i] = "{" + p[1:] + "}"
		}
	}
	return strings.Join(parts, "/")
}

var (
	openAPIOnce sync.Once
	openAPIDoc  []byte
)

// OpenAPI returns the OpenAPI 3.1 document of Operations.
func OpenAPI() []byte {
	openAPIOnce.Do(func() {
		b, err := json.MarshalIndent(buildOpenAPI(Operations), "", "  ")
		if err != nil {
			panic(err) // the document is built from static types
		}
		openAPIDoc = b
	})
	return openAPIDoc
}

func (s *Server) openAPI(c echo.Context) error {
	return c.Blob(http.StatusOK, "application/json", OpenAPI())
}

func buildOpenAPI(ops []Operation) map[string]any {
	sg := &schemaGen{defs: map[string]any{}}
	paths := map[string]map[string]any{}
	for _, op := range ops {
		p := OpenAPIPath(op.Path)
		if paths[p] == nil {
			paths[p] = map[string]any{}
		}
		var params []any
		for _, seg := range strings.Split(op.Path, "/") {
			if name, ok := strings.CutPrefix(seg, ":"); ok {
				params = append(params, map[string]any{"name": name, "in": "path", "required": true, "schema": map[string]any{"type": "string"}})
			}
		}
		for _, q := range op.Query {
			params = append(params, map[string]any{"name": q.Name, "in": "query", "description": q.Description, "schema": map[string]any{"type": q.Type}})
		}
		if op.Paged {
			params = append(params,
				map[string]any{"name": "limit", "in": "query", "description": fmt.Sprintf("page size, 1 to %d (default %d)", paging.MaxLimit, paging.DefaultLimit),
					"schema": map[string]any{"type": "integer", "minimum": 1, "maximum": paging.MaxLimit}},
				map[string]any{"name": "cursor", "in": "query", "description": "the X-Next-Cursor of the previous page (opaque); none: the first page",
					"schema": map[string]any{"type": "string"}})
		}
		o := map[string]any{"summary": op.Summary, "operationId": operationID(op)}
		if len(params) > 0 {
			o["parameters"] = params
		}
		if op.Body != nil {
			o["requestBody"] = map[string]any{"required": true, "content": map[string]any{
				"application/json": map[string]any{"schema": sg.schema(reflect.TypeOf(op.Body))}}}
		}
		resp := map[string]any{"description": http.StatusText(op.Status)}
		switch r := op.Response.(type) {
		case nil:
		case Text:
			resp["content"] = map[string]any{"text/plain": map[string]any{"schema": map[string]any{"type": "string"}}}
		default:
			resp["content"] = map[string]any{"application/json": map[string]any{"schema": sg.schema(reflect.TypeOf(r))}}
		}
		if op.WebSocket {
			resp["description"] = "Switching Protocols: a WebSocket whose text messages are JSON of this schema"
		}
		if op.Paged {
			resp["headers"] = map[string]any{
				paging.HeaderNext: map[string]any{"description": "the cursor of the next page; absent on the last page", "schema": map[string]any{"type": "string"}},
				paging.HeaderLink: map[string]any{"description": `<…?cursor=…>; rel="next": the next page's URL; absent on the last page`, "schema": map[string]any{"type": "string"}},
			}
		}
		o["responses"] = map[string]any{strconv.Itoa(op.Status): resp, "default": map[string]any{
			"description": "An error", "content": map[string]any{"application/json": map[string]any{"schema": map[string]any{"$ref": "#/components/schemas/ErrorBody"}}}}}
		if op.Public {
			o["security"] = []any{}
		}
		paths[p][strings.ToLower(op.Method)] = o
	}
	sg.defs["ErrorBody"] = map[string]any{"type": "object", "required": []string{"error"}, "properties": map[string]any{
		"error": map[string]any{"type": "object", "required": []string{"code", "message"}, "properties": map[string]any{
			"code": map[string]any{"type": "string"}, "message": map[string]any{"type": "string"},
			"field": map[string]any{"type": "string", "description": "the request field that was wrong (code invalid-field)"}}}}}
	return map[string]any{
		"openapi": "3.1.0",
		"info": map[string]any{"title": "OpenClaw gateway API", "version": "v1",
			"description": "The gateway's HTTP API (docs/api.md). Every route needs the bearer token of <data-dir>/gateway.token unless it says otherwise."},
		"paths":      paths,
		"security":   []any{map[string]any{"bearer": []string{}}},
		"components": map[string]any{"schemas": sg.defs, "securitySchemes": map[string]any{"bearer": map[string]any{"type": "http", "scheme": "bearer"}}},
	}
}

func operationID(op Operation) string {
	var b strings.Builder
	b.WriteString(strings.ToLower(op.Method))
	for _, seg := range strings.Split(op.Path, "/") {
		if seg == "" || seg == "api" || seg == "v1" {
			continue
		}
		seg = strings.TrimPrefix(seg, ":")
		for _, w := range strings.FieldsFunc(seg, func(r rune) bool { return r == '-' || r == '.' || r == '_' }) {
			b.WriteString(strings.ToUpper(w[:1]) + w[1:])
		}
	}
	return b.String()
}

// schemaGen writes JSON Schemas (OpenAPI 3.1 is JSON Schema 2020-12) of Go types as encoding/json
// sees them; named structs become components.
type schemaGen struct {
	defs map[string]any
}

var (
	timeType      = reflect.TypeFor[time.Time]()
	durationType  = reflect.TypeFor[providers.Duration]()
	rawType       = reflect.TypeFor[json.RawMessage]()
	marshalerType = reflect.TypeFor[json.Marshaler]()
)

func (g *schemaGen) schema(t reflect.Type) map[string]any {
	switch t {
	case timeType:
		return map[string]any{"type": "string", "format": "date-time"}
	case durationType:
		return map[string]any{"type": "string", "description": "a Go duration (90s, 1h30m)"}
	case rawType:
		return map[string]any{}
	}
	if t.Kind() != reflect.Pointer && t.Kind() != reflect.Interface && t.Implements(marshalerType) && t.Kind() != reflect.Struct {
		return map[string]any{}
	}
	switch t.Kind() {
	case reflect.Pointer:
		return g.schema(t.Elem())
	case reflect.Bool:
		return map[string]any{"type": "boolean"}
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		if t == reflect.TypeFor[time.Duration]() {
			return map[string]any{"type": "integer", "description": "nanoseconds"}
		}
		return map[string]any{"type": "integer"}
	case reflect.Float32, reflect.Float64:
		return map[string]any{"type": "number"}
	case reflect.String:
		return map[string]any{"type": "string"}
	case reflect.Slice, reflect.Array:
		if t.Elem().Kind() == reflect.Uint8 {
			return map[string]any{"type": "string", "contentEncoding": "base64"}
		}
		return map[string]any{"type": "array", "items": g.schema(t.Elem())}
	case reflect.Map:
		return map[string]any{"type": "object", "additionalProperties": g.schema(t.Elem())}
	case reflect.Struct:
		if t.Implements(marshalerType) {
			return map[string]any{}
		}
		if t.Name() == "" {
			return g.object(t)
		}
		name := strings.ReplaceAll(t.String(), ".", "_")
		if _, ok := g.defs[name]; !ok {
			g.defs[name] = map[string]any{} // a placeholder against recursion
			g.defs[name] = g.object(t)
		}
		return map[string]any{"$ref": "#/components/schemas/" + name}
	}
	return map[string]any{}
}

// object is the schema of a struct's fields, embedded structs flattened as encoding/json does.
// Fields are not marked required: the same types are request and response bodies.
func (g *schemaGen) object(t reflect.Type) map[string]any {
	props := map[string]any{}
	var walk func(t reflect.Type)
	walk = func(t reflect.Type) {
		for i := range t.NumField() {
			f := t.Field(i)
			tag := f.Tag.Get("json")
			if tag == "-" {
				continue
			}
			name, _, _ := strings.Cut(tag, ",")
			ft := f.Type
			if f.Anonymous && name == "" {
				if ft.Kind() == reflect.Pointer {
					ft = ft.Elem()
				}
				if ft.Kind() == reflect.Struct {
					walk(ft)
					continue
				}
			}
			if !f.IsExported() {
				continue
			}
			if name == "" {
				name = f.Name
			}
			props[name] = g.schema(ft)
		}
	}
	walk(t)
	return map[string]any{"type": "object", "properties": props}
}

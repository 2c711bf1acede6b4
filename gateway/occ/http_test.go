package occ

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

type answer struct {
	status int
	body   map[string]any
	raw    string
}

func do(t *testing.T, url, tok, method, path, body string) answer {
	t.Helper()
	req, err := http.NewRequest(method, url+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	a := answer{status: resp.StatusCode, raw: string(b)}
	_ = json.Unmarshal(b, &a.body)
	return a
}

func errCode(a answer) string {
	e, _ := a.body["error"].(map[string]any)
	c, _ := e["code"].(string)
	return c
}

func TestServerShape(t *testing.T) {
	dir := t.TempDir()
	tok, err := EnsureToken(dir)
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(filepath.Join(dir, TokenFile)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("occ.token mode = %v, %v; want 0600", fi.Mode(), err)
	}
	if again, _ := EnsureToken(dir); again != tok {
		t.Fatal("EnsureToken generated a second token on the second start")
	}
	var got json.RawMessage
	s := NewServer(ServerConfig{DataDir: dir, MaxBody: 256})
	s.RegisterCompute(Driver{Descriptor: Descriptor{ID: "openclaw-gateway", Implementation: "openclaw-cloudworkers", ActivationOrder: "afterCommit", RuntimeLogging: "platform"},
		Methods: map[string]Method{
			"stopRevision": func(ctx context.Context, body json.RawMessage) (any, error) { got = body; return nil, nil },
			"ensureNamespace": func(ctx context.Context, body json.RawMessage) (any, error) {
				return nil, Permanent("PROVISIONING_REJECTED", "namespace is not mapped")
			},
			"preflight": func(ctx context.Context, body json.RawMessage) (any, error) {
				return nil, errors.New("provider said: secret-key-123 leaked")
			},
			"prepareRevision": func(ctx context.Context, body json.RawMessage) (any, error) {
				var in struct {
					Revision struct {
						ID string `json:"id"`
					} `json:"revision"`
				}
				if err := Bind(body, &in); err != nil {
					return nil, err
				}
				return map[string]any{"ready": false}, nil
			},
		}})
	hs := httptest.NewServer(s)
	defer hs.Close()

	cases := []struct {
		name, tok, method, path, body string
		status                        int
		code                          string
	}{
		{"no token", "", "GET", "/occ/v1/compute", "", 401, CodeUnauthorized},
		{"operator-like wrong token", strings.Repeat("a", 64), "GET", "/occ/v1/compute", "", 401, CodeUnauthorized},
		{"unknown method", tok, "POST", "/occ/v1/compute/launchMissiles", "{}", 404, CodeUnknownMethod},
		{"unknown side", tok, "POST", "/occ/v1/sandbox/x", "{}", 404, CodeUnknownMethod},
		{"GET a method", tok, "GET", "/occ/v1/compute/stopRevision", "", 404, CodeUnknownMethod},
		{"array body", tok, "POST", "/occ/v1/compute/stopRevision", "[1]", 400, CodeInvalid},
		{"null body", tok, "POST", "/occ/v1/compute/stopRevision", "null", 400, CodeInvalid},
		{"two objects", tok, "POST", "/occ/v1/compute/stopRevision", "{}{}", 400, CodeInvalid},
		{"empty body", tok, "POST", "/occ/v1/compute/stopRevision", "", 400, CodeInvalid},
		{"too large", tok, "POST", "/occ/v1/compute/stopRevision", `{"x":"` + strings.Repeat("y", 300) + `"}`, 413, CodeBodyTooLarge},
		{"wrong field type", tok, "POST", "/occ/v1/compute/prepareRevision", `{"revision":{"id":5}}`, 400, CodeInvalid},
		{"permanent", tok, "POST", "/occ/v1/compute/ensureNamespace", `{}`, 409, "PROVISIONING_REJECTED"},
		{"raw error", tok, "POST", "/occ/v1/compute/preflight", `{}`, 503, CodeDependencyUnavailable},
		{"unregistered side", tok, "GET", "/occ/v1/credential-gateway", "", 501, CodeNotImplemented},
		{"unregistered side method", tok, "POST", "/occ/v1/credential-gateway/registerSource", "{}", 501, CodeNotImplemented},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a := do(t, hs.URL, c.tok, c.method, c.path, c.body)
			if a.status != c.status || errCode(a) != c.code {
				t.Fatalf("%s %s = %d %s; want %d %s", c.method, c.path, a.status, a.raw, c.status, c.code)
			}
			e := a.body["error"].(map[string]any)
			if _, ok := e["retryable"].(bool); !ok {
				t.Fatalf("error envelope without a boolean retryable: %s", a.raw)
			}
			if strings.Contains(a.raw, "secret-key-123") {
				t.Fatalf("a raw error reached OCC: %s", a.raw)
			}
		})
	}
	if a := do(t, hs.URL, tok, "POST", "/occ/v1/compute/prepareRevision", `{"revision":{"id":5}}`); !strings.Contains(a.raw, "revision.id") {
		t.Fatalf("the 400 does not name the field: %s", a.raw)
	}
	if a := do(t, hs.URL, tok, "POST", "/occ/v1/compute/preflight", `{}`); a.body["error"].(map[string]any)["retryable"] != true {
		t.Fatalf("a dependency failure is not retryable: %s", a.raw)
	}

	a := do(t, hs.URL, tok, "GET", "/occ/v1/compute", "")
	if a.status != 200 || a.body["capability"] != "compute" || a.body["id"] != "openclaw-gateway" || a.body["activationOrder"] != "afterCommit" {
		t.Fatalf("descriptor = %d %s", a.status, a.raw)
	}
	if ms, _ := json.Marshal(a.body["methods"]); string(ms) != `["ensureNamespace","preflight","prepareRevision","stopRevision"]` {
		t.Fatalf("descriptor methods = %s", ms)
	}
	a = do(t, hs.URL, tok, "POST", "/occ/v1/compute/stopRevision", `{"revision":{"id":"r1"}}`)
	if a.status != 200 || strings.TrimSpace(a.raw) != "{}" || string(got) != `{"revision":{"id":"r1"}}` {
		t.Fatalf("void method = %d %q (method got %s); want 200 {}", a.status, a.raw, got)
	}

	// Rotation: the old token is refused at once by the running server, the new one accepted.
	newTok, err := RotateToken(dir)
	if err != nil || newTok == tok {
		t.Fatalf("RotateToken = %q, %v", newTok, err)
	}
	if a := do(t, hs.URL, tok, "GET", "/occ/v1/compute", ""); a.status != 401 {
		t.Fatalf("old token after rotation: %d; want 401", a.status)
	}
	if a := do(t, hs.URL, newTok, "GET", "/occ/v1/compute", ""); a.status != 200 {
		t.Fatalf("new token after rotation: %d %s", a.status, a.raw)
	}
	// A missing token file refuses everything (never an empty token).
	os.Remove(filepath.Join(dir, TokenFile))
	if a := do(t, hs.URL, "", "GET", "/occ/v1/compute", ""); a.status != 401 {
		t.Fatalf("no token file, no token: %d; want 401", a.status)
	}
}

func TestConfigValidate(t *testing.T) {
	cases := []struct {
		name  string
		cfg   Config
		field string
	}{
		{"default ok", Config{}, ""},
		{"listed ok", Config{Namespaces: map[string]NamespaceConfig{"team-a": {Profile: "local", AllowedProfiles: []string{"netns"}}}}, ""},
		{"bad default", Config{DefaultProfile: "Local!"}, "occ.defaultProfile"},
		{"missing profile", Config{Namespaces: map[string]NamespaceConfig{"team-a": {}}}, "occ.namespaces.team-a.profile"},
		{"bad allowed", Config{Namespaces: map[string]NamespaceConfig{"team-a": {Profile: "local", AllowedProfiles: []string{"ok", "a b"}}}}, "occ.namespaces.team-a.allowedProfiles[1]"},
		{"repeated allowed", Config{Namespaces: map[string]NamespaceConfig{"team-a": {Profile: "local", AllowedProfiles: []string{"x", "x"}}}}, "occ.namespaces.team-a.allowedProfiles[1]"},
		{"bad name", Config{Namespaces: map[string]NamespaceConfig{"a/b": {Profile: "local"}}}, "occ.namespaces.a/b"},
		{"huge body", Config{MaxRequestBytes: 1 << 40}, "occ.maxRequestBytes"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := c.cfg.Validate()
			if c.field == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.HasPrefix(err.Error(), c.field+":") {
				t.Fatalf("Validate = %v; want an error naming %s", err, c.field)
			}
		})
	}
}

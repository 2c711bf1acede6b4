package inference_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/openclaw/cloudworkers/gateway/inference"
	"github.com/openclaw/cloudworkers/gateway/inference/builtin"
	"github.com/openclaw/cloudworkers/gateway/inference/inferencetest"
	"github.com/openclaw/cloudworkers/protocol"
	"github.com/openclaw/cloudworkers/providers"
)

const exampleYAML = `
models:
  default: anthropic/claude-sonnet-4-5
  providers:
    anthropic: {api: anthropic-messages, baseUrl: https://api.anthropic.com, credential: anthropic, models: [{id: claude-sonnet-4-5, contextWindow: 200000, maxTokens: 8192, cost: {input: 3, output: 15, cacheRead: 0.3, cacheWrite: 3.75}}]}
    ollama: {api: openai-completions, baseUrl: "http://127.0.0.1:11434/v1", models: [{id: qwen3}]}
    demo: {api: scripted, script: ./demo-script.json, models: [{id: demo}]}
`

func parse(t *testing.T, s string) inference.CatalogConfig {
	t.Helper()
	var cfg struct {
		Models inference.CatalogConfig `yaml:"models"`
	}
	dec := yaml.NewDecoder(strings.NewReader(s))
	dec.KnownFields(true)
	if err := dec.Decode(&cfg); err != nil {
		t.Fatal(err)
	}
	return cfg.Models
}

type fakeCreds map[string]string

func (f fakeCreds) Get(_ context.Context, name string) (string, error) {
	v, ok := f[name]
	if !ok {
		return "", errors.New("credential not set")
	}
	return v, nil
}

func TestCatalogFromYAML(t *testing.T) {
	cfg := parse(t, exampleYAML)
	cfg.ResolvePaths("/etc/openclaw")
	cat, err := inference.NewCatalog(cfg, fakeCreds{}, builtin.Adapters())
	if err != nil {
		t.Fatal(err)
	}
	if cat.Default() != "anthropic/claude-sonnet-4-5" {
		t.Errorf("default %q", cat.Default())
	}
	m, err := cat.Resolve("anthropic/claude-sonnet-4-5")
	if err != nil {
		t.Fatal(err)
	}
	if m.API != inference.APIAnthropicMessages || m.BaseURL != "https://api.anthropic.com" || m.Credential != "anthropic" ||
		m.Cost.CacheWrite != 3.75 || m.MaxTokens != 8192 || !m.Default || m.MaxRetries != inference.DefaultMaxRetries {
		t.Errorf("model: %+v", m)
	}
	if d, _ := cat.Resolve("demo/demo"); d.Script != "/etc/openclaw/demo-script.json" {
		t.Errorf("script path %q", d.Script)
	}
	var refs []string
	for _, m := range cat.Models() {
		refs = append(refs, m.Ref)
	}
	if strings.Join(refs, ",") != "anthropic/claude-sonnet-4-5,demo/demo,ollama/qwen3" {
		t.Errorf("models %v", refs)
	}
	for _, ref := range []string{"anthropic/claude-opus-4", "openai/gpt-5", "claude-sonnet-4-5", "", "anthropic/"} {
		if _, err := cat.Resolve(ref); !errors.Is(err, inference.ErrModelNotApproved) {
			t.Errorf("Resolve(%q) = %v", ref, err)
		}
	}
}

func TestCatalogValidate(t *testing.T) {
	for _, tc := range []struct{ name, yaml, field string }{
		{"unknown api", `{providers: {x: {api: gemini, baseUrl: "https://x", models: [{id: m}]}}}`, "models.providers.x.api"},
		{"bad base url", `{providers: {x: {api: openai-completions, baseUrl: "ftp://x", models: [{id: m}]}}}`, "models.providers.x.baseUrl"},
		{"url with user", `{providers: {x: {api: openai-completions, baseUrl: "https://u:p@x", models: [{id: m}]}}}`, "models.providers.x.baseUrl"},
		{"auth header", `{providers: {x: {api: openai-completions, headers: {Authorization: "Bearer k"}, models: [{id: m}]}}}`, "models.providers.x.headers.Authorization"},
		{"no models", `{providers: {x: {api: anthropic-messages}}}`, "models.providers.x.models"},
		{"duplicate model", `{providers: {x: {api: anthropic-messages, models: [{id: m}, {id: m}]}}}`, "models.providers.x.models[1].id"},
		{"negative cost", `{providers: {x: {api: anthropic-messages, models: [{id: m, cost: {input: -1}}]}}}`, "models.providers.x.models[0].cost"},
		{"bad credential name", `{providers: {x: {api: anthropic-messages, credential: "a b", models: [{id: m}]}}}`, "models.providers.x.credential"},
		{"scripted with url", `{providers: {x: {api: scripted, baseUrl: "https://x", models: [{id: m}]}}}`, "models.providers.x"},
		{"default not in catalog", `{default: x/other, providers: {x: {api: scripted, models: [{id: m}]}}}`, "models.default"},
		{"bad provider name", `{providers: {"X/Y": {api: scripted, models: [{id: m}]}}}`, "models.providers.X/Y"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var cfg inference.CatalogConfig
			if err := yaml.Unmarshal([]byte(tc.yaml), &cfg); err != nil {
				t.Fatal(err)
			}
			_, err := inference.NewCatalog(cfg, fakeCreds{}, builtin.Adapters())
			var fe *providers.FieldError
			if !errors.As(err, &fe) || fe.Field != tc.field {
				t.Fatalf("err = %v, want a field error on %s", err, tc.field)
			}
		})
	}
}

func TestCatalogNeedsAnAdapterPerAPI(t *testing.T) {
	cfg := parse(t, `{models: {providers: {x: {api: openai-responses, models: [{id: m}]}}}}`)
	if _, err := inference.NewCatalog(cfg, fakeCreds{}, builtin.Adapters()); err != nil {
		t.Fatalf("openai-responses with the built-in adapters: %v", err)
	}
	adapters := builtin.Adapters()
	delete(adapters, inference.APIOpenAIResponses)
	_, err := inference.NewCatalog(cfg, fakeCreds{}, adapters)
	var fe *providers.FieldError
	if !errors.As(err, &fe) || fe.Field != "models.providers.x.api" {
		t.Fatalf("err = %v, want a field error on models.providers.x.api", err)
	}
}

func TestDefaultCatalogStreamsDemoScript(t *testing.T) {
	ctx := inferencetest.Context(t)
	cat, err := inference.NewCatalog(inference.CatalogConfig{}, nil, builtin.Adapters())
	if err != nil {
		t.Fatal(err)
	}
	if cat.Default() != "demo/demo" {
		t.Fatalf("default %q", cat.Default())
	}
	rec := &inferencetest.Recorder{}
	cx := protocol.Context{Messages: []protocol.Message{{Role: protocol.RoleUser, Content: []protocol.Content{{Type: protocol.ContentText, Text: "hi"}}}}}
	msg, err := cat.Stream(ctx, cat.Default(), cx, inference.Options{}, rec.Emit)
	if err != nil {
		t.Fatal(err)
	}
	if msg.StopReason != protocol.StopToolUse || msg.Provider != "demo" || msg.API != "scripted" || msg.Usage == nil {
		t.Fatalf("message: %+v", msg)
	}
	if _, err := cat.Stream(ctx, "demo/other", cx, inference.Options{}, rec.Emit); !errors.Is(err, inference.ErrModelNotApproved) {
		t.Fatalf("unapproved model: %v", err)
	}
}

func TestStreamResolvesCredential(t *testing.T) {
	ctx := inferencetest.Context(t)
	cfg := parse(t, exampleYAML)
	cat, err := inference.NewCatalog(cfg, fakeCreds{}, builtin.Adapters())
	if err != nil {
		t.Fatal(err)
	}
	rec := &inferencetest.Recorder{}
	_, err = cat.Stream(ctx, "anthropic/claude-sonnet-4-5", protocol.Context{}, inference.Options{}, rec.Emit)
	if err == nil || !strings.Contains(err.Error(), "credential not set") || len(rec.Events) != 0 {
		t.Fatalf("missing credential: %v, %d events", err, len(rec.Events))
	}
}

func TestSanitize(t *testing.T) {
	got := inference.Sanitize("bad key sk-123\n\x00 and again sk-123 "+strings.Repeat("x", 2000), "sk-123")
	if strings.Contains(got, "sk-123") || strings.ContainsAny(got, "\n\x00") || len(got) > 520 {
		t.Errorf("Sanitize = %q", got)
	}
}

// WithAPIKey replaces the provider's credential for one call: the provider sees that key, and a
// provider whose catalog credential is not even set is callable with it.
func TestStreamWithAPIKeyOverridesTheCatalogCredential(t *testing.T) {
	ctx := inferencetest.Context(t)
	srv := inferencetest.NewServer(t, func(_ int, w http.ResponseWriter, _ *http.Request) { inferencetest.AnthropicText(w, "hello") })
	cat, err := inference.NewCatalog(inference.CatalogConfig{Providers: map[string]inference.ProviderConfig{
		"anthropic": {API: inference.APIAnthropicMessages, BaseURL: srv.URL, Credential: "gateway-key", Models: []inference.ModelConfig{{ID: "m"}}},
	}}, fakeCreds{"gateway-key": "sk-gateway"}, builtin.Adapters())
	if err != nil {
		t.Fatal(err)
	}
	cx := protocol.Context{Messages: []protocol.Message{{Role: protocol.RoleUser, Content: []protocol.Content{{Type: protocol.ContentText, Text: "hi"}}}}}
	rec := &inferencetest.Recorder{}
	if _, err := cat.Stream(inference.WithAPIKey(ctx, "sk-bound"), "anthropic/m", cx, inference.Options{}, rec.Emit); err != nil {
		t.Fatal(err)
	}
	if _, err := cat.Stream(ctx, "anthropic/m", cx, inference.Options{}, rec.Emit); err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, r := range srv.Requests() {
		keys = append(keys, r.APIKey())
	}
	if strings.Join(keys, ",") != "sk-bound,sk-gateway" {
		t.Fatalf("keys the provider saw: %q, want the bound key, then the catalog's", keys)
	}
}

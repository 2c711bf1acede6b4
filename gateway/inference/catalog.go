package inference

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"github.com/openclaw/cloudworkers/gateway/credentials"
	"github.com/openclaw/cloudworkers/protocol"
	"github.com/openclaw/cloudworkers/providers"
)

// API is the wire protocol of a provider.
type API string

// API kinds. An OpenAI-compatible server (Ollama, vLLM, llama.cpp) is APIOpenAICompletions with its baseUrl.
const (
	APIAnthropicMessages API = "anthropic-messages"
	APIOpenAICompletions API = "openai-completions"
	APIOpenAIResponses   API = "openai-responses"
	APIScripted          API = "scripted"
)

// Valid reports whether a is a known API kind.
func (a API) Valid() bool {
	switch a {
	case APIAnthropicMessages, APIOpenAICompletions, APIOpenAIResponses, APIScripted:
		return true
	}
	return false
}

// Default base URLs of the hosted APIs.
const (
	DefaultAnthropicBaseURL = "https://api.anthropic.com"
	DefaultOpenAIBaseURL    = "https://api.openai.com/v1"
)

// DefaultMaxRetries is how often the SDKs retry a refused request (429, 5xx, connection error) before
// the stream starts. A stream that has started is never retried.
const DefaultMaxRetries = 1

// ErrModelNotApproved is returned for a model reference that is not in the catalog.
var ErrModelNotApproved = errors.New("model-not-approved")

// Cost is a model's price in USD per million tokens.
type Cost struct {
	Input      float64 `yaml:"input" json:"input"`
	Output     float64 `yaml:"output" json:"output"`
	CacheRead  float64 `yaml:"cacheRead" json:"cacheRead"`
	CacheWrite float64 `yaml:"cacheWrite" json:"cacheWrite"`
}

// ModelConfig is one model of a provider.
type ModelConfig struct {
	ID            string `yaml:"id" json:"id"`
	Name          string `yaml:"name" json:"name,omitempty"`
	ContextWindow int    `yaml:"contextWindow" json:"contextWindow,omitempty"`
	MaxTokens     int    `yaml:"maxTokens" json:"maxTokens,omitempty"`
	Cost          Cost   `yaml:"cost" json:"cost"`
}

// ProviderConfig is one provider of the catalog.
type ProviderConfig struct {
	API     API    `yaml:"api" json:"api"`
	BaseURL string `yaml:"baseUrl" json:"baseUrl,omitempty"`
	// Credential names a credential set with `openclaw credential set`; empty for servers without auth.
	Credential string `yaml:"credential" json:"credential,omitempty"`
	// Headers are extra request headers. Authentication headers are refused: use Credential.
	Headers map[string]string `yaml:"headers" json:"headers,omitempty"`
	// Script is the JSON script of a scripted provider; empty means the built-in demo script.
	Script string `yaml:"script" json:"script,omitempty"`
	// MaxRetries overrides DefaultMaxRetries.
	MaxRetries *int          `yaml:"maxRetries" json:"maxRetries,omitempty"`
	Models     []ModelConfig `yaml:"models" json:"models"`
}

// CatalogConfig is the `models:` section of the gateway config.
type CatalogConfig struct {
	// Default is the model ref used when a session names none.
	Default   string                    `yaml:"default" json:"default"`
	Providers map[string]ProviderConfig `yaml:"providers" json:"providers"`
}

// DemoProvider is the provider of the built-in catalog.
const DemoProvider = "demo"

// DefaultCatalogConfig is the catalog used when none is configured: the scripted demo model.
func DefaultCatalogConfig() CatalogConfig {
	return CatalogConfig{
		Default: DemoProvider + "/demo",
		Providers: map[string]ProviderConfig{
			DemoProvider: {API: APIScripted, Models: []ModelConfig{{ID: "demo", Name: "Scripted demo model", ContextWindow: 200000, MaxTokens: 8192}}},
		},
	}
}

// IsZero reports whether nothing is configured.
func (c CatalogConfig) IsZero() bool { return c.Default == "" && len(c.Providers) == 0 }

// SetDefaults fills base URLs, retries and a default model (the first model of the first provider).
func (c *CatalogConfig) SetDefaults() {
	if c.IsZero() {
		*c = DefaultCatalogConfig()
	}
	for name, p := range c.Providers {
		if p.BaseURL == "" {
			switch p.API {
			case APIAnthropicMessages:
				p.BaseURL = DefaultAnthropicBaseURL
			case APIOpenAICompletions, APIOpenAIResponses:
				p.BaseURL = DefaultOpenAIBaseURL
			}
		}
		if p.MaxRetries == nil {
			n := DefaultMaxRetries
			p.MaxRetries = &n
		}
		for i := range p.Models {
			if p.Models[i].Name == "" {
				p.Models[i].Name = p.Models[i].ID
			}
		}
		c.Providers[name] = p
	}
	if c.Default == "" {
		for _, name := range slices.Sorted(maps.Keys(c.Providers)) {
			if ms := c.Providers[name].Models; len(ms) > 0 {
				c.Default = name + "/" + ms[0].ID
				break
			}
		}
	}
}

// ResolvePaths makes relative script paths relative to dir (the directory of the config file).
func (c *CatalogConfig) ResolvePaths(dir string) {
	for name, p := range c.Providers {
		if p.Script != "" && !filepath.IsAbs(p.Script) {
			p.Script = filepath.Join(dir, p.Script)
			c.Providers[name] = p
		}
	}
}

var providerNamePattern = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)

// authHeaders may not be configured as plain headers: secrets belong in the credentials store.
var authHeaders = []string{"authorization", "proxy-authorization", "x-api-key", "api-key", "cookie"}

// Validate names the first bad field (as a *providers.FieldError with a models.… path).
func (c *CatalogConfig) Validate() error {
	if len(c.Providers) == 0 {
		return providers.Fieldf("models.providers", "at least one provider is required")
	}
	for _, name := range slices.Sorted(maps.Keys(c.Providers)) {
		p := c.Providers[name]
		f := "models.providers." + name
		if !providerNamePattern.MatchString(name) {
			return providers.Fieldf(f, "provider name must be lowercase letters, digits, '.', '_' or '-'")
		}
		if !p.API.Valid() {
			return providers.Fieldf(f+".api", "must be anthropic-messages, openai-completions, openai-responses or scripted, got %q", p.API)
		}
		if p.API == APIScripted {
			if p.BaseURL != "" || p.Credential != "" || len(p.Headers) > 0 {
				return providers.Fieldf(f, "a scripted provider has no baseUrl, credential or headers")
			}
		} else {
			if p.Script != "" {
				return providers.Fieldf(f+".script", "only a scripted provider has a script")
			}
			u, err := url.Parse(p.BaseURL)
			if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil {
				return providers.Fieldf(f+".baseUrl", "must be an http(s) URL without credentials, got %q", p.BaseURL)
			}
		}
		if p.Credential != "" && !credentials.ValidName(p.Credential) {
			return providers.Fieldf(f+".credential", "%q is not a valid credential name", p.Credential)
		}
		for h := range p.Headers {
			if h == "" || strings.ContainsAny(h, " :\r\n") || strings.ContainsAny(p.Headers[h], "\r\n") {
				return providers.Fieldf(f+".headers."+h, "is not a valid header")
			}
			if slices.Contains(authHeaders, strings.ToLower(h)) {
				return providers.Fieldf(f+".headers."+h, "authentication headers are not configured here: set a credential and name it in credential")
			}
		}
		if p.MaxRetries != nil && (*p.MaxRetries < 0 || *p.MaxRetries > 10) {
			return providers.Fieldf(f+".maxRetries", "must be between 0 and 10")
		}
		if len(p.Models) == 0 {
			return providers.Fieldf(f+".models", "at least one model is required")
		}
		seen := map[string]bool{}
		for i, m := range p.Models {
			mf := fmt.Sprintf("%s.models[%d]", f, i)
			switch {
			case m.ID == "" || strings.ContainsAny(m.ID, " \t\r\n"):
				return providers.Fieldf(mf+".id", "must be non-empty without whitespace, got %q", m.ID)
			case seen[m.ID]:
				return providers.Fieldf(mf+".id", "duplicate model %q", m.ID)
			case m.ContextWindow < 0:
				return providers.Fieldf(mf+".contextWindow", "must not be negative")
			case m.MaxTokens < 0:
				return providers.Fieldf(mf+".maxTokens", "must not be negative")
			case m.Cost.Input < 0 || m.Cost.Output < 0 || m.Cost.CacheRead < 0 || m.Cost.CacheWrite < 0:
				return providers.Fieldf(mf+".cost", "prices must not be negative")
			}
			seen[m.ID] = true
		}
	}
	if c.Default != "" {
		prov, id, ok := strings.Cut(c.Default, "/")
		p, found := c.Providers[prov]
		if !ok || !found || !slices.ContainsFunc(p.Models, func(m ModelConfig) bool { return m.ID == id }) {
			return providers.Fieldf("models.default", "%q is not a model of the catalog (provider/model)", c.Default)
		}
	}
	return nil
}

// Model is a resolved catalog model: everything an adapter needs except the credential value.
type Model struct {
	// Ref is "provider/model".
	Ref           string `json:"ref"`
	Provider      string `json:"provider"`
	ID            string `json:"id"`
	Name          string `json:"name"`
	API           API    `json:"api"`
	BaseURL       string `json:"baseUrl,omitempty"`
	Credential    string `json:"credential,omitempty"` // a name, never the value
	ContextWindow int    `json:"contextWindow,omitempty"`
	MaxTokens     int    `json:"maxTokens,omitempty"`
	Cost          Cost   `json:"cost"`
	Default       bool   `json:"default,omitempty"`
	// Headers are sent with each request; not listed by the API.
	Headers    map[string]string `json:"-"`
	Script     string            `json:"-"`
	MaxRetries int               `json:"-"`
}

// CredentialSource resolves a credential name to its value; *credentials.Store is one.
type CredentialSource interface {
	Get(ctx context.Context, name string) (string, error)
}

// Adapters maps an API kind to its adapter. It is filled explicitly in cmd/ (see package builtin).
type Adapters map[API]Adapter

// Catalog is the validated, read-only set of approved models.
type Catalog struct {
	models   map[string]Model
	order    []string
	def      string
	creds    CredentialSource
	adapters Adapters
	metrics  *metrics
	meter    Meter
}

// Meter admits every model call against the spend budgets and records what it cost
// (gateway/spend). Both placements' calls pass through Catalog.Stream, so no call escapes it.
type Meter interface {
	// ReserveCall admits a call of the session that may cost up to worstUSD, or refuses it.
	ReserveCall(ctx context.Context, session string, worstUSD float64) (Settler, error)
}

// Settler records a metered call's usage.
type Settler interface {
	Settle(ctx context.Context, model string, u protocol.Usage)
}

// SetMeter sets the catalog's meter (before any call).
func (c *Catalog) SetMeter(m Meter) { c.meter = m }

// WorstCost is what a call can cost at most: its request's input (estimated at 4 bytes a token)
// at the dearer of the input and cache-write prices, plus its output limit at the output price.
func WorstCost(m Model, cx protocol.Context, opts Options) float64 {
	size := len(cx.SystemPrompt)
	for _, msg := range cx.Messages {
		for _, c := range msg.Content {
			size += len(c.Text) + len(c.Thinking) + len(c.Arguments) + len(c.Data)
		}
	}
	for _, t := range cx.Tools {
		size += len(t.Name) + len(t.Description) + len(t.Parameters)
	}
	out := opts.MaxTokens
	if out <= 0 {
		out = m.MaxTokens
	}
	if out <= 0 {
		out = 4096
	}
	in := float64(size/4 + 1)
	return (in*max(m.Cost.Input, m.Cost.CacheWrite) + float64(out)*m.Cost.Output) / 1e6
}

// NewCatalog validates cfg (after SetDefaults; an empty cfg is the built-in demo catalog) and checks
// that every provider's API has an adapter.
func NewCatalog(cfg CatalogConfig, creds CredentialSource, adapters Adapters) (*Catalog, error) {
	cfg = cfg.clone()
	cfg.SetDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	c := &Catalog{models: map[string]Model{}, def: cfg.Default, creds: creds, adapters: adapters}
	for _, name := range slices.Sorted(maps.Keys(cfg.Providers)) {
		p := cfg.Providers[name]
		if adapters[p.API] == nil {
			return nil, providers.Fieldf("models.providers."+name+".api", "no adapter for %s in this build", p.API)
		}
		for _, m := range p.Models {
			ref := name + "/" + m.ID
			c.models[ref] = Model{
				Ref: ref, Provider: name, ID: m.ID, Name: m.Name, API: p.API, BaseURL: strings.TrimRight(p.BaseURL, "/"),
				Credential: p.Credential, ContextWindow: m.ContextWindow, MaxTokens: m.MaxTokens, Cost: m.Cost,
				Default: ref == cfg.Default, Headers: p.Headers, Script: p.Script, MaxRetries: *p.MaxRetries,
			}
			c.order = append(c.order, ref)
		}
	}
	c.metrics = newMetrics(c.order)
	return c, nil
}

func (c CatalogConfig) clone() CatalogConfig {
	out := CatalogConfig{Default: c.Default, Providers: make(map[string]ProviderConfig, len(c.Providers))}
	for k, p := range c.Providers {
		p.Models = slices.Clone(p.Models)
		if p.Headers != nil {
			h := make(map[string]string, len(p.Headers))
			for hk, hv := range p.Headers {
				h[http.CanonicalHeaderKey(hk)] = hv
			}
			p.Headers = h
		}
		out.Providers[k] = p
	}
	return out
}

// Default is the default model ref.
func (c *Catalog) Default() string { return c.def }

// Models lists the catalog, sorted by ref.
func (c *Catalog) Models() []Model {
	out := make([]Model, 0, len(c.order))
	for _, ref := range c.order {
		out = append(out, c.models[ref])
	}
	return out
}

// Resolve returns the model of a "provider/model" ref, or an error wrapping ErrModelNotApproved.
func (c *Catalog) Resolve(ref string) (Model, error) {
	m, ok := c.models[ref]
	if !ok {
		return Model{}, fmt.Errorf("%w: %q is not in the gateway's model catalog", ErrModelNotApproved, truncate(ref, 200))
	}
	return m, nil
}

type apiKeyKey struct{}

// WithAPIKey returns a context under which Stream sends key as the provider credential instead of
// the one the catalog names for the model's provider (an OCC credential source bound to the
// revision an environment serves). The value stays in memory; it is never logged.
func WithAPIKey(ctx context.Context, key string) context.Context {
	return context.WithValue(ctx, apiKeyKey{}, key)
}

// Stream makes one model call: it resolves ref and the provider's credential (or the one of
// WithAPIKey) and streams through the adapter of the model's API. See Adapter for the contract; a
// resolution failure before the call returns an error without emitting anything.
func (c *Catalog) Stream(ctx context.Context, ref string, cx protocol.Context, opts Options, emit Emit) (protocol.Message, error) {
	m, err := c.Resolve(ref)
	if err != nil {
		return protocol.Message{}, err
	}
	call := Call{Model: m, Context: cx, Options: opts}
	if key, ok := ctx.Value(apiKeyKey{}).(string); ok {
		call.APIKey = key
	} else if m.Credential != "" {
		if c.creds == nil {
			return protocol.Message{}, fmt.Errorf("model %s: credential %q: no credential store", ref, m.Credential)
		}
		if call.APIKey, err = c.creds.Get(ctx, m.Credential); err != nil {
			return protocol.Message{}, fmt.Errorf("model %s: %w", ref, err)
		}
	}
	var settle Settler
	worst := WorstCost(m, cx, opts)
	if c.meter != nil {
		if settle, err = c.meter.ReserveCall(ctx, opts.Session, worst); err != nil {
			return protocol.Message{}, fmt.Errorf("model %s: %w", ref, err)
		}
	}
	streamed := false // a delta reached the caller: the provider has been asked, and bills
	var emitErr error
	msg, err := c.adapters[m.API].Stream(ctx, call, func(ev protocol.StreamEvent) error {
		streamed = true
		if emit == nil {
			return nil
		}
		if e := emit(ev); e != nil {
			emitErr = e
			return e
		}
		return nil
	})
	c.metrics.observe(ref, msg, err)
	if settle != nil {
		var u protocol.Usage
		if msg.Usage != nil {
			u = *msg.Usage
		}
		if err != nil && streamed && (emitErr != nil || ctx.Err() != nil) && u.Cost.Total < worst {
			// the caller stopped the call (a worker withholding credit or going away): the
			// provider billed what it produced, which the partial usage does not say
			u.Cost.Total = worst
		}
		settle.Settle(ctx, ref, u) // a call that failed before any usage costs nothing
	}
	return msg, err
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

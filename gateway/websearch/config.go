package websearch

import (
	"net/url"
	"strings"

	"github.com/openclaw/cloudworkers/gateway/credentials"
	"github.com/openclaw/cloudworkers/providers"
)

// ProviderBrave is the Brave Search API, the only provider so far.
const ProviderBrave = "brave"

// DefaultBraveBaseURL is the Brave Search API's endpoint.
const DefaultBraveBaseURL = "https://api.search.brave.com"

// Result bounds.
const (
	// DefaultMaxResults is the number of results a search returns when the model asks for none.
	DefaultMaxResults = 5
	// MaxResultsLimit is the most results one search may return (the Brave API's own limit).
	MaxResultsLimit = 20
)

// Config is the `webSearch:` section of the gateway config. An empty Config disables the tool.
type Config struct {
	// Provider is the search API; only "brave".
	Provider string `yaml:"provider" json:"provider"`
	// BaseURL overrides the provider's endpoint (DefaultBraveBaseURL).
	BaseURL string `yaml:"baseUrl" json:"baseUrl,omitempty"`
	// Credential names the API key set with `openclaw credential set`.
	Credential string `yaml:"credential" json:"credential"`
	// MaxResults is the default and the upper bound of results per search (1..MaxResultsLimit).
	MaxResults int `yaml:"maxResults" json:"maxResults,omitempty"`
}

// IsZero reports whether nothing is configured (web search is off).
func (c Config) IsZero() bool { return c == Config{} }

// SetDefaults fills the base URL and the result bound.
func (c *Config) SetDefaults() {
	if c.IsZero() {
		return
	}
	if c.BaseURL == "" && c.Provider == ProviderBrave {
		c.BaseURL = DefaultBraveBaseURL
	}
	c.BaseURL = strings.TrimRight(c.BaseURL, "/")
	if c.MaxResults == 0 {
		c.MaxResults = DefaultMaxResults
	}
}

// Validate names the first bad field (as a *providers.FieldError with a webSearch.… path). Call it
// after SetDefaults.
func (c Config) Validate() error {
	if c.Provider != ProviderBrave {
		return providers.Fieldf("webSearch.provider", "must be %s, got %q", ProviderBrave, c.Provider)
	}
	u, err := url.Parse(c.BaseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil || u.RawQuery != "" {
		return providers.Fieldf("webSearch.baseUrl", "must be an http(s) URL without credentials or query, got %q", c.BaseURL)
	}
	if c.Credential == "" {
		return providers.Fieldf("webSearch.credential", "is required: name a credential set with `openclaw credential set`")
	}
	if !credentials.ValidName(c.Credential) {
		return providers.Fieldf("webSearch.credential", "%q is not a valid credential name", c.Credential)
	}
	if c.MaxResults < 1 || c.MaxResults > MaxResultsLimit {
		return providers.Fieldf("webSearch.maxResults", "must be between 1 and %d, got %d", MaxResultsLimit, c.MaxResults)
	}
	return nil
}

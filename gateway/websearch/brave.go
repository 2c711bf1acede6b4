package websearch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"html"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/openclaw/cloudworkers/internal/untrusted"
)

// CredentialSource resolves a credential name to its value; *credentials.Store is one.
type CredentialSource interface {
	Get(ctx context.Context, name string) (string, error)
}

// Hit is one search result.
type Hit struct {
	Title   string `json:"title"`
	URL     string `json:"url"`
	Snippet string `json:"snippet"`
}

// Searcher runs one web search for at most count results.
type Searcher interface {
	Search(ctx context.Context, query string, count int) ([]Hit, error)
}

// Errors of a search, matched with errors.Is on an *APIError.
var (
	// ErrUnauthorized means the search API refused the credential (HTTP 401 or 403).
	ErrUnauthorized = errors.New("the search API refused the credential")
	// ErrRateLimited means the search API asked to slow down (HTTP 429).
	ErrRateLimited = errors.New("rate limited by the search API")
)

// APIError is a search refused by the API. Its message is bounded and credential-free.
type APIError struct {
	Status int
	// RetryAfter is the API's hint for a rate-limited search (0 when it gave none).
	RetryAfter time.Duration
	// Message is the API's own description, sanitized.
	Message string
}

func (e *APIError) Error() string {
	var b strings.Builder
	if err := e.Unwrap(); err != nil {
		b.WriteString(err.Error())
		b.WriteString(" ")
	}
	fmt.Fprintf(&b, "(HTTP %d", e.Status)
	if e.Message != "" {
		b.WriteString(": " + e.Message)
	}
	b.WriteString(")")
	if e.RetryAfter > 0 {
		fmt.Fprintf(&b, "; retry in %s", e.RetryAfter.Round(time.Second))
	}
	return b.String()
}

// Unwrap returns ErrUnauthorized or ErrRateLimited when the status says so.
func (e *APIError) Unwrap() error {
	switch e.Status {
	case http.StatusUnauthorized, http.StatusForbidden:
		return ErrUnauthorized
	case http.StatusTooManyRequests:
		return ErrRateLimited
	}
	return nil
}

// Brave searches through the Brave Search API (GET {baseUrl}/res/v1/web/search).
type Brave struct {
	baseURL    string
	credential string
	creds      CredentialSource
	// HTTPClient is the client used for requests; nil means http.DefaultClient (tests set theirs).
	HTTPClient *http.Client
}

var _ Searcher = (*Brave)(nil)

// NewBrave returns a Brave client for cfg (after SetDefaults and Validate); the key is looked up
// in creds under cfg.Credential at each search, so a rotated credential takes effect at once.
func NewBrave(cfg Config, creds CredentialSource) *Brave {
	return &Brave{baseURL: strings.TrimRight(cfg.BaseURL, "/"), credential: cfg.Credential, creds: creds}
}

// maxResponseBytes bounds the body read from the API.
const maxResponseBytes = 4 << 20

// searchTimeout bounds one search, on top of the caller's ctx.
const searchTimeout = 30 * time.Second

// braveResponse is the part of the API's answer that is used.
type braveResponse struct {
	Web struct {
		Results []struct {
			Title       string `json:"title"`
			URL         string `json:"url"`
			Description string `json:"description"`
		} `json:"results"`
	} `json:"web"`
}

// braveError is the API's error body: {"type":"ErrorResponse","error":{"status","code","detail"}}.
type braveError struct {
	Error struct {
		Code   string `json:"code"`
		Detail string `json:"detail"`
	} `json:"error"`
	Message string `json:"message"`
}

// Search implements Searcher. Errors never contain the key.
func (b *Brave) Search(ctx context.Context, query string, count int) ([]Hit, error) {
	if b.creds == nil {
		return nil, fmt.Errorf("credential %q: no credential store", b.credential)
	}
	key, err := b.creds.Get(ctx, b.credential)
	if err != nil {
		return nil, err
	}
	count = min(max(count, 1), MaxResultsLimit)
	ctx, cancel := context.WithTimeout(ctx, searchTimeout)
	defer cancel()
	q := url.Values{"q": {query}, "count": {strconv.Itoa(count)}, "text_decorations": {"false"}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, b.baseURL+"/res/v1/web/search?"+q.Encode(), nil)
	if err != nil {
		return nil, fmt.Errorf("search request: %w", err)
	}
	req.Header.Set("Accept", "application/json")
	req.Header.Set("X-Subscription-Token", key)
	hc := b.HTTPClient
	if hc == nil {
		hc = http.DefaultClient
	}
	resp, err := hc.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("search request: %w", ctx.Err())
		}
		return nil, errors.New(sanitize("search request: "+transportError(err), key))
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxResponseBytes))
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("read search response: %w", ctx.Err())
		}
		return nil, errors.New(sanitize("read search response: "+err.Error(), key))
	}
	if resp.StatusCode != http.StatusOK {
		return nil, apiError(resp, body, key)
	}
	var br braveResponse
	if err := json.Unmarshal(body, &br); err != nil {
		return nil, errors.New(sanitize("decode search response: "+err.Error(), key))
	}
	hits := make([]Hit, 0, min(count, len(br.Web.Results)))
	for _, r := range br.Web.Results {
		if len(hits) == count {
			break
		}
		hits = append(hits, Hit{
			Title:   untrusted.Cut(plain(r.Title), maxTitle),
			URL:     untrusted.Cut(strings.TrimSpace(r.URL), maxURL),
			Snippet: untrusted.Cut(plain(r.Description), maxSnippet),
		})
	}
	return hits, nil
}

// transportError describes a failed request without the request URL (which *url.Error repeats).
func transportError(err error) string {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err.Error()
	}
	return err.Error()
}

func apiError(resp *http.Response, body []byte, key string) *APIError {
	e := &APIError{Status: resp.StatusCode}
	var be braveError
	if json.Unmarshal(body, &be) == nil {
		e.Message = be.Error.Detail
		if e.Message == "" {
			e.Message = be.Message
		}
		if be.Error.Code != "" && e.Message != "" {
			e.Message = be.Error.Code + ": " + e.Message
		}
	}
	if e.Message == "" {
		e.Message = http.StatusText(resp.StatusCode)
	}
	e.Message = sanitize(e.Message, key)
	if resp.StatusCode == http.StatusTooManyRequests {
		e.RetryAfter = retryAfter(resp.Header)
	}
	return e
}

// retryAfter reads Retry-After, else the first (per-second or shortest) window of Brave's
// X-RateLimit-Reset ("1, 1419704").
func retryAfter(h http.Header) time.Duration {
	if s, err := strconv.ParseFloat(strings.TrimSpace(h.Get("Retry-After")), 64); err == nil && s >= 0 {
		return time.Duration(s * float64(time.Second))
	}
	if t, err := http.ParseTime(h.Get("Retry-After")); err == nil {
		return max(0, time.Until(t))
	}
	first, _, _ := strings.Cut(h.Get("X-RateLimit-Reset"), ",")
	if s, err := strconv.ParseFloat(strings.TrimSpace(first), 64); err == nil && s >= 0 {
		return time.Duration(s * float64(time.Second))
	}
	return 0
}

// Bounds of one hit's fields and of an error message, in bytes.
const (
	maxTitle   = 200
	maxURL     = 500
	maxSnippet = 400
	maxMessage = 300
)

var tags = regexp.MustCompile(`<[^>]*>`)

// plain turns the API's HTML fragments into one line of text.
func plain(s string) string {
	s = html.UnescapeString(tags.ReplaceAllString(s, ""))
	return strings.Join(strings.Fields(s), " ")
}

// sanitize removes the key and control characters and bounds s.
func sanitize(s, key string) string { return untrusted.RedactedLine(s, key, maxMessage) }

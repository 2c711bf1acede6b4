package websearch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/openclaw/cloudworkers/protocol"
	"github.com/openclaw/cloudworkers/worker/tools"
)

// ToolName is the upstream name of the tool.
const ToolName = "web_search"

// maxQuery bounds the query, in bytes (the Brave API takes at most 400 characters).
const maxQuery = 400

// Tool is the web_search tool: {query, count?} → a numbered list of title, URL and snippet.
type Tool struct {
	search     Searcher
	maxResults int
}

var _ tools.Tool = (*Tool)(nil)

// New returns the web_search tool of cfg, searching with the provider it names. cfg gets its
// defaults and is validated (the error is a *providers.FieldError).
func New(cfg Config, creds CredentialSource) (*Tool, error) {
	cfg.SetDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return NewTool(NewBrave(cfg, creds), cfg.MaxResults), nil
}

// NewTool returns the web_search tool over any Searcher; maxResults (1..MaxResultsLimit, else
// DefaultMaxResults) is the default and the bound of count.
func NewTool(s Searcher, maxResults int) *Tool {
	if maxResults < 1 || maxResults > MaxResultsLimit {
		maxResults = DefaultMaxResults
	}
	return &Tool{search: s, maxResults: maxResults}
}

// Name implements tools.Tool.
func (t *Tool) Name() string { return ToolName }

// Schema implements tools.Tool.
func (t *Tool) Schema() protocol.Tool {
	params := fmt.Sprintf(`{"type":"object","properties":{`+
		`"query":{"type":"string","description":"What to search for."},`+
		`"count":{"type":"integer","minimum":1,"maximum":%d,"description":"Number of results (default %d, at most %d)."}},`+
		`"required":["query"]}`, t.maxResults, t.maxResults, t.maxResults)
	return protocol.Tool{
		Name:        ToolName,
		Description: "Search the web. Returns the title, URL and a snippet of each of the top results.",
		Parameters:  json.RawMessage(params),
	}
}

type args struct {
	Query string          `json:"query"`
	Count json.RawMessage `json:"count"`
}

// count reads an optional integer that models sometimes send as a string.
func (a args) count(def int) (int, error) {
	s := strings.Trim(strings.TrimSpace(string(a.Count)), `"`)
	if s == "" || s == "null" {
		return def, nil
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || f != float64(int64(f)) {
		return 0, fmt.Errorf("count: expected an integer, got %s", a.Count)
	}
	return int(f), nil
}

// Details is the structured result, for UIs and logs.
type Details struct {
	Query   string `json:"query"`
	Count   int    `json:"count"`
	Results []Hit  `json:"results"`
}

// Run implements tools.Tool. A refused search (bad credential, rate limit, API error) is an error
// result the model can read; only a cancelled ctx is returned as an error.
func (t *Tool) Run(ctx context.Context, raw json.RawMessage) (tools.Result, error) {
	var a args
	if len(strings.TrimSpace(string(raw))) > 0 && string(raw) != "null" {
		if err := json.Unmarshal(raw, &a); err != nil {
			return errorResult("invalid arguments for tool web_search: %v", err), nil
		}
	}
	query := strings.Join(strings.Fields(a.Query), " ")
	if query == "" {
		return errorResult("invalid arguments for tool web_search: query is required"), nil
	}
	if len(query) > maxQuery {
		return errorResult("invalid arguments for tool web_search: query is %d bytes, at most %d", len(query), maxQuery), nil
	}
	count, err := a.count(t.maxResults)
	if err != nil {
		return errorResult("invalid arguments for tool web_search: %v", err), nil
	}
	count = min(max(count, 1), t.maxResults)

	hits, err := t.search.Search(ctx, query, count)
	if err != nil {
		if ctx.Err() != nil {
			return tools.Result{}, ctx.Err()
		}
		var ae *APIError
		switch {
		case errors.Is(err, ErrUnauthorized):
			return errorResult("web_search: %v; the gateway operator must check the search credential", err), nil
		case errors.Is(err, ErrRateLimited):
			return errorResult("web_search: %v", err), nil
		case errors.As(err, &ae):
			return errorResult("web_search: the search API failed: %v", err), nil
		}
		return errorResult("web_search: %v", err), nil
	}
	if len(hits) > count {
		hits = hits[:count]
	}
	res := tools.Result{Content: []protocol.Content{{Type: protocol.ContentText, Text: format(query, hits)}}}
	if d, err := json.Marshal(Details{Query: query, Count: len(hits), Results: hits}); err == nil {
		res.Details = d
	}
	return res, nil
}

// format renders hits as a numbered list; each field is already bounded.
func format(query string, hits []Hit) string {
	if len(hits) == 0 {
		return fmt.Sprintf("No results for %q.", query)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "Results for %q:\n", query)
	for i, h := range hits {
		fmt.Fprintf(&b, "\n%d. %s\n   %s\n", i+1, h.Title, h.URL)
		if h.Snippet != "" {
			fmt.Fprintf(&b, "   %s\n", h.Snippet)
		}
	}
	return b.String()
}

func errorResult(format string, a ...any) tools.Result {
	return tools.Result{IsError: true, Content: []protocol.Content{{Type: protocol.ContentText, Text: fmt.Sprintf(format, a...)}}}
}

package websearch_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openclaw/cloudworkers/gateway/websearch"
	"github.com/openclaw/cloudworkers/internal/testrig/testenv"
	"github.com/openclaw/cloudworkers/providers"
	"github.com/openclaw/cloudworkers/worker/tools"
)

const secret = "BSA-test-SECRET-0123456789"

type fakeCreds map[string]string

func (f fakeCreds) Get(_ context.Context, name string) (string, error) {
	v, ok := f[name]
	if !ok {
		return "", fmt.Errorf("credential not found: %q (set it with `openclaw credential set %s`)", name, name)
	}
	return v, nil
}

// server is a loopback Brave API that records the requests it sees.
type server struct {
	*httptest.Server
	mu   sync.Mutex
	reqs []*http.Request
}

func newServer(t *testing.T, h http.HandlerFunc) *server {
	t.Helper()
	s := &server{}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		s.reqs = append(s.reqs, r.Clone(context.Background()))
		s.mu.Unlock()
		h(w, r)
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *server) requests() []*http.Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*http.Request(nil), s.reqs...)
}

func newTool(t *testing.T, baseURL string, maxResults int) *websearch.Tool {
	t.Helper()
	tool, err := websearch.New(websearch.Config{Provider: "brave", BaseURL: baseURL + "/", Credential: "brave", MaxResults: maxResults},
		fakeCreds{"brave": secret})
	if err != nil {
		t.Fatal(err)
	}
	return tool
}

// results answers with n web results, the first with HTML decorations and entities.
func results(n int) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		type res struct {
			Title       string `json:"title"`
			URL         string `json:"url"`
			Description string `json:"description"`
		}
		var rs []res
		for i := range n {
			rs = append(rs, res{Title: fmt.Sprintf("Result %d", i+1), URL: fmt.Sprintf("https://example.com/%d", i+1),
				Description: fmt.Sprintf("Snippet %d", i+1)})
		}
		if n > 0 {
			rs[0].Title = "Go <strong>1.26</strong> &amp; friends"
			rs[0].Description = "The <strong>Go</strong>\nprogramming language " + strings.Repeat("long ", 200)
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"type": "search", "query": map[string]any{"original": r.URL.Query().Get("q")},
			"web": map[string]any{"type": "search", "results": rs}})
	}
}

func run(t *testing.T, tool *websearch.Tool, args string) tools.Result {
	t.Helper()
	res, err := tool.Run(testenv.Context(t, 10*time.Second), json.RawMessage(args))
	if err != nil {
		t.Fatalf("Run(%s): %v", args, err)
	}
	return res
}

func TestSearchMapsResults(t *testing.T) {
	srv := newServer(t, results(3))
	tool := newTool(t, srv.URL, 5)
	res := run(t, tool, `{"query":"  golang   release  "}`)
	if res.IsError {
		t.Fatalf("error result: %s", res.Text())
	}
	text := res.Text()
	for _, want := range []string{`Results for "golang release":`, "1. Go 1.26 & friends\n   https://example.com/1\n   The Go programming language long",
		"2. Result 2\n   https://example.com/2\n   Snippet 2", "3. Result 3"} {
		if !strings.Contains(text, want) {
			t.Errorf("result lacks %q:\n%s", want, text)
		}
	}
	if strings.Contains(text, "<strong>") || strings.Count(text, "long ") > 100 {
		t.Errorf("snippet not cleaned or not bounded:\n%s", text)
	}
	var d websearch.Details
	if err := json.Unmarshal(res.Details, &d); err != nil || d.Count != 3 || d.Query != "golang release" || d.Results[1].URL != "https://example.com/2" {
		t.Errorf("details %s (%v)", res.Details, err)
	}
	reqs := srv.requests()
	if len(reqs) != 1 {
		t.Fatalf("%d requests", len(reqs))
	}
	r := reqs[0]
	if r.Method != http.MethodGet || r.URL.Path != "/res/v1/web/search" || r.URL.Query().Get("q") != "golang release" || r.URL.Query().Get("count") != "5" {
		t.Errorf("request %s %s", r.Method, r.URL)
	}
	if r.Header.Get("X-Subscription-Token") != secret || strings.Contains(r.URL.String(), secret) {
		t.Errorf("key not sent in the header only: %s %v", r.URL, r.Header)
	}
	if strings.Contains(text, secret) || strings.Contains(string(res.Details), secret) {
		t.Error("the result contains the key")
	}
}

func TestSearchCountIsBounded(t *testing.T) {
	for _, tc := range []struct {
		name      string
		args      string
		sent      string // count in the request
		results   int    // results the API returns
		wantItems int
	}{
		{"default is maxResults", `{"query":"q"}`, "3", 3, 3},
		{"above maxResults is capped", `{"query":"q","count":50}`, "3", 3, 3},
		{"count as a string", `{"query":"q","count":"2"}`, "2", 2, 2},
		{"zero asks for one", `{"query":"q","count":0}`, "1", 1, 1},
		{"an API returning more is cut", `{"query":"q","count":2}`, "2", 10, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := newServer(t, results(tc.results))
			res := run(t, newTool(t, srv.URL, 3), tc.args)
			if res.IsError {
				t.Fatalf("error result: %s", res.Text())
			}
			if got := srv.requests()[0].URL.Query().Get("count"); got != tc.sent {
				t.Errorf("count sent %s, want %s", got, tc.sent)
			}
			var d websearch.Details
			if err := json.Unmarshal(res.Details, &d); err != nil || len(d.Results) != tc.wantItems {
				t.Errorf("got %d results, want %d", len(d.Results), tc.wantItems)
			}
			if n := strings.Count(res.Text(), "https://example.com/"); n != tc.wantItems {
				t.Errorf("text lists %d results, want %d", n, tc.wantItems)
			}
		})
	}
}

func TestSearchErrorsAreReadableResults(t *testing.T) {
	for _, tc := range []struct {
		name    string
		handler http.HandlerFunc
		want    []string
	}{
		{
			name: "401 echoing the key",
			handler: func(w http.ResponseWriter, _ *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusUnauthorized)
				_, _ = w.Write([]byte(`{"type":"ErrorResponse","error":{"id":"x","status":401,"code":"SUBSCRIPTION_TOKEN_INVALID","detail":"The provided subscription token ` + secret + ` is invalid."}}`))
			},
			want: []string{"refused the credential", "HTTP 401", "SUBSCRIPTION_TOKEN_INVALID", "[redacted]", "operator"},
		},
		{
			name: "429 with Brave's reset header",
			handler: func(w http.ResponseWriter, _ *http.Request) {
				w.Header().Set("X-RateLimit-Reset", "2, 1419704")
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusTooManyRequests)
				_, _ = w.Write([]byte(`{"type":"ErrorResponse","error":{"status":429,"code":"RATE_LIMITED","detail":"Request rate limit exceeded for plan."}}`))
			},
			want: []string{"rate limited", "HTTP 429", "Request rate limit exceeded", "retry in 2s"},
		},
		{
			name: "500 without a JSON body",
			handler: func(w http.ResponseWriter, _ *http.Request) {
				http.Error(w, "oops", http.StatusInternalServerError)
			},
			want: []string{"search API failed", "HTTP 500", "Internal Server Error"},
		},
		{
			name: "broken JSON",
			handler: func(w http.ResponseWriter, _ *http.Request) {
				_, _ = w.Write([]byte(`{"web":`))
			},
			want: []string{"web_search: decode search response"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := newServer(t, tc.handler)
			res := run(t, newTool(t, srv.URL, 5), `{"query":"q"}`)
			if !res.IsError {
				t.Fatalf("not an error result: %s", res.Text())
			}
			for _, w := range tc.want {
				if !strings.Contains(res.Text(), w) {
					t.Errorf("result %q lacks %q", res.Text(), w)
				}
			}
			if strings.Contains(res.Text(), secret) {
				t.Errorf("result contains the key: %s", res.Text())
			}
		})
	}
}

func TestBraveErrorsWrapSentinels(t *testing.T) {
	ctx := testenv.Context(t, 10*time.Second)
	srv := newServer(t, func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Retry-After", "3")
		w.WriteHeader(http.StatusTooManyRequests)
	})
	b := websearch.NewBrave(websearch.Config{BaseURL: srv.URL, Credential: "brave"}, fakeCreds{"brave": secret})
	_, err := b.Search(ctx, "q", 3)
	var ae *websearch.APIError
	if !errors.Is(err, websearch.ErrRateLimited) || !errors.As(err, &ae) || ae.RetryAfter != 3*time.Second {
		t.Fatalf("err = %#v", err)
	}
}

func TestSearchWithoutCredentialOrServer(t *testing.T) {
	ctx := testenv.Context(t, 10*time.Second)
	srv := newServer(t, results(1))
	tool, err := websearch.New(websearch.Config{Provider: "brave", BaseURL: srv.URL, Credential: "missing"}, fakeCreds{})
	if err != nil {
		t.Fatal(err)
	}
	res, err := tool.Run(ctx, json.RawMessage(`{"query":"q"}`))
	if err != nil || !res.IsError || !strings.Contains(res.Text(), `credential not found: "missing"`) {
		t.Fatalf("missing credential: %v %q", err, res.Text())
	}
	if len(srv.requests()) != 0 {
		t.Error("a search without a credential reached the API")
	}

	// A closed server: the error names neither the key nor the URL's query.
	closed := httptest.NewServer(http.NotFoundHandler())
	closed.Close()
	res = run(t, newTool(t, closed.URL, 5), `{"query":"private words"}`)
	if !res.IsError || !strings.Contains(res.Text(), "search request:") || strings.Contains(res.Text(), "private") || strings.Contains(res.Text(), secret) {
		t.Fatalf("unreachable API: %q", res.Text())
	}
}

func TestInvalidArguments(t *testing.T) {
	srv := newServer(t, results(1))
	tool := newTool(t, srv.URL, 5)
	for _, args := range []string{`{}`, `{"query":"   "}`, `{"query":3}`, `{"query":"q","count":1.5}`, `{"query":"` + strings.Repeat("x", 401) + `"}`, `null`} {
		res := run(t, tool, args)
		if !res.IsError || !strings.Contains(res.Text(), "invalid arguments for tool web_search") {
			t.Errorf("%s: %q", args, res.Text())
		}
	}
	if len(srv.requests()) != 0 {
		t.Error("invalid arguments reached the API")
	}
}

func TestRunCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(testenv.Context(t, 10*time.Second))
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		cancel()
		<-r.Context().Done()
	})
	_, err := newTool(t, srv.URL, 5).Run(ctx, json.RawMessage(`{"query":"q"}`))
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
}

func TestSchema(t *testing.T) {
	tool := websearch.NewTool(nil, 7)
	s := tool.Schema()
	var p struct {
		Properties map[string]struct {
			Type    string `json:"type"`
			Maximum int    `json:"maximum"`
		} `json:"properties"`
		Required []string `json:"required"`
	}
	if err := json.Unmarshal(s.Parameters, &p); err != nil {
		t.Fatal(err)
	}
	if tool.Name() != "web_search" || s.Name != "web_search" || p.Properties["query"].Type != "string" ||
		p.Properties["count"].Maximum != 7 || len(p.Required) != 1 || p.Required[0] != "query" {
		t.Errorf("schema %s %s", s.Name, s.Parameters)
	}
}

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name  string
		cfg   websearch.Config
		field string
	}{
		{"ok with defaults", websearch.Config{Provider: "brave", Credential: "brave"}, ""},
		{"unknown provider", websearch.Config{Provider: "google", Credential: "g"}, "webSearch.provider"},
		{"bad base url", websearch.Config{Provider: "brave", BaseURL: "ftp://x", Credential: "brave"}, "webSearch.baseUrl"},
		{"base url with user", websearch.Config{Provider: "brave", BaseURL: "https://u:p@x", Credential: "brave"}, "webSearch.baseUrl"},
		{"no credential", websearch.Config{Provider: "brave"}, "webSearch.credential"},
		{"bad credential name", websearch.Config{Provider: "brave", Credential: "a b"}, "webSearch.credential"},
		{"too many results", websearch.Config{Provider: "brave", Credential: "brave", MaxResults: 21}, "webSearch.maxResults"},
		{"negative results", websearch.Config{Provider: "brave", Credential: "brave", MaxResults: -1}, "webSearch.maxResults"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg
			cfg.SetDefaults()
			err := cfg.Validate()
			if tc.field == "" {
				if err != nil || cfg.BaseURL != websearch.DefaultBraveBaseURL || cfg.MaxResults != websearch.DefaultMaxResults {
					t.Fatalf("err %v, cfg %+v", err, cfg)
				}
				return
			}
			var fe *providers.FieldError
			if !errors.As(err, &fe) || fe.Field != tc.field {
				t.Fatalf("err = %v, want a field error on %s", err, tc.field)
			}
		})
	}
	if !(websearch.Config{}).IsZero() {
		t.Error("the empty config is not zero")
	}
}

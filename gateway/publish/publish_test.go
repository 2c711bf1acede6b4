package publish

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-github/v89/github"

	"github.com/openclaw/cloudworkers/internal/gitforge"
	"github.com/openclaw/cloudworkers/internal/testrig/testenv"
	"github.com/openclaw/cloudworkers/providers"
)

// TestMain: the test binary is also the credential helper git runs (as the openclaw binary is
// in the gateway).
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "git-credential" {
		if err := RunHelper(os.Args[2:], os.Stdin, os.Stdout, os.Getenv(HelperEnv)); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

const token = "ghs_publishTestToken0123456789abcdefABCD"

type memCreds map[string]string

func (m memCreds) Get(_ context.Context, name string) (string, error) {
	v, ok := m[name]
	if !ok {
		return "", fmt.Errorf("credential %q not set", name)
	}
	return v, nil
}

// forge is a real smart-HTTP git server (internal/gitforge: `git http-backend` behind
// net/http/cgi) with basic authentication (x-access-token:<token>) on loopback, holding org/repo.git.
type forge struct {
	*gitforge.Forge
	url, bare string
}

func newForge(t *testing.T) *forge {
	t.Helper()
	testenv.RequireCommands(t, "git")
	g, err := gitforge.Start(t.TempDir(), "x-access-token", token)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Close() })
	f := &forge{Forge: g}
	if f.bare, f.url, err = g.Init(context.Background(), "org/repo.git"); err != nil {
		t.Fatal(err)
	}
	return f
}

func (f *forge) refs(t *testing.T) string {
	t.Helper()
	return testenv.Git(t, f.bare, "for-each-ref", "--format=%(refname) %(objectname)")
}

// userRepo is a checkout whose origin is the forge, with main pushed and a session branch
// openclaw/s1 one commit ahead.
func userRepo(t *testing.T, f *forge) string {
	// main reaches the forge with the test's own credentials, not the publisher's
	return checkout(t, f.url, "-c", "credential.helper=", "-c", "credential.helper=!f() { echo username=x-access-token; echo password="+token+"; }; f", "push", "-q", "origin", "main")
}

// checkout is a checkout whose origin is remote, main put there by git with pushMain, and a
// session branch openclaw/s1 one commit ahead.
func checkout(t *testing.T, remote string, pushMain ...string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "user")
	testenv.InitRepo(t, dir, "initial", map[string]string{"README.md": "hello\n"})
	testenv.Git(t, dir, "remote", "add", "origin", remote)
	testenv.Git(t, dir, pushMain...)
	testenv.Git(t, dir, "switch", "-q", "-c", "openclaw/s1")
	if err := os.WriteFile(filepath.Join(dir, "work.txt"), []byte("the worker's\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	testenv.Git(t, dir, "add", "work.txt")
	testenv.Git(t, dir, "commit", "-qm", "worker: work")
	testenv.Git(t, dir, "switch", "-q", "main")
	return dir
}

func publisher(t *testing.T, creds memCreds, client *http.Client) *Publisher {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	p, err := New(Config{Credentials: creds, Helper: []string{exe, "git-credential"}, HTTPClient: client})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

var gitCred = GitCredential{Kind: KindHTTPS, Token: token}.Encode()

// TestPushAllowlistAndToken: against a real smart-HTTP server, a push naming refs/heads/main (or
// a force push, or one with no credential) is refused before git runs — no request reaches the
// server and no ref changes there; the session branch's push lands with the gateway's token
// (the server saw it), and a wrong token changes nothing either.
func TestPushAllowlistAndToken(t *testing.T) {
	ctx := testenv.Context(t, 60*time.Second)
	f := newForge(t)
	dir := userRepo(t, f)
	gitDir := filepath.Join(dir, ".git")
	before, authedBefore, refusedBefore := f.refs(t), f.Authed.Load(), f.Refused.Load()
	p := publisher(t, memCreds{"forge": gitCred}, nil)
	policy := providers.PublishPolicy{Credential: "forge"}

	for name, req := range map[string]Request{
		"main":          {GitDir: gitDir, Source: "refs/heads/openclaw/s1", Dest: "refs/heads/main", Policy: policy},
		"force":         {GitDir: gitDir, Source: "refs/heads/openclaw/s1", Force: true, Policy: policy},
		"no credential": {GitDir: gitDir, Source: "refs/heads/openclaw/s1"},
		"bad remote":    {GitDir: gitDir, Source: "refs/heads/openclaw/s1", Remote: "--upload-pack=x", Policy: policy},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := p.Publish(ctx, req)
			var re *RefusedError
			if !errors.As(err, &re) {
				t.Fatalf("publish: %v, want a refusal", err)
			}
			if f.Authed.Load() != authedBefore || f.Refused.Load() != refusedBefore {
				t.Fatalf("a refused publish reached the server (%d authenticated, %d refused requests)", f.Authed.Load()-authedBefore, f.Refused.Load()-refusedBefore)
			}
			if got := f.refs(t); got != before {
				t.Fatalf("server refs changed:\n%s\nwant\n%s", got, before)
			}
		})
	}
	if !strings.Contains(fmt.Sprint(func() error {
		_, err := p.Publish(ctx, Request{GitDir: gitDir, Source: "refs/heads/openclaw/s1", Dest: "refs/heads/main", Policy: policy})
		return err
	}()), "publish.pushRefAllowlist") {
		t.Fatal("the refusal does not name publish.pushRefAllowlist")
	}

	// a wrong token: git fails, nothing changes, the token is in no error
	bad := publisher(t, memCreds{"forge": GitCredential{Kind: KindHTTPS, Token: "ghs_wrong"}.Encode()}, nil)
	if _, err := bad.Publish(ctx, Request{GitDir: gitDir, Source: "refs/heads/openclaw/s1", Policy: policy}); err == nil || strings.Contains(err.Error(), "ghs_wrong") {
		t.Fatalf("publish with a wrong token: %v", err)
	}
	if got := f.refs(t); got != before {
		t.Fatalf("server refs changed by a refused token:\n%s", got)
	}

	res, err := p.Publish(ctx, Request{GitDir: gitDir, Source: "refs/heads/openclaw/s1", Policy: policy})
	if err != nil {
		t.Fatal(err)
	}
	want := testenv.Git(t, dir, "rev-parse", "openclaw/s1")
	if res.Status != "new" || res.Commit != want || res.Ref != "refs/heads/openclaw/s1" || res.RemoteURL != f.url {
		t.Fatalf("result %+v, want a new ref at %s", res, want)
	}
	if got := testenv.Git(t, f.bare, "rev-parse", "refs/heads/openclaw/s1"); got != want {
		t.Fatalf("server has openclaw/s1 at %s, want %s", got, want)
	}
	if f.Authed.Load() == authedBefore {
		t.Fatal("the push reached the server without the gateway's token")
	}
	if got := testenv.Git(t, f.bare, "rev-parse", "refs/heads/main"); !strings.Contains(before, "refs/heads/main "+got) {
		t.Fatal("main moved on the server")
	}
	if again, err := p.Publish(ctx, Request{GitDir: gitDir, Source: "refs/heads/openclaw/s1", Policy: policy}); err != nil || again.Status != "up to date" {
		t.Fatalf("second publish: %+v %v", again, err)
	}
	// the user's own configuration never received the token
	if cfg, _ := os.ReadFile(filepath.Join(gitDir, "config")); strings.Contains(string(cfg), token) {
		t.Fatal("the token was written into the repository's configuration")
	}
}

// TestHelperAnswersItsHostOnly: the helper gives the token for the pushed-to host only.
func TestHelperAnswersItsHostOnly(t *testing.T) {
	env, _ := json.Marshal(helperInput{Protocol: "https", Host: "forge.example:443", Username: "x-access-token", Token: token})
	var out strings.Builder
	if err := RunHelper([]string{"get"}, strings.NewReader("protocol=https\nhost=evil.example\n\n"), &out, string(env)); err != nil || out.Len() != 0 {
		t.Fatalf("helper for another host: %q %v", out.String(), err)
	}
	if err := RunHelper([]string{"get"}, strings.NewReader("protocol=https\nhost=forge.example:443\n\n"), &out, string(env)); err != nil || !strings.Contains(out.String(), "password="+token) {
		t.Fatalf("helper for its host: %q %v", out.String(), err)
	}
}

// githubAPI implements the GitHub REST routes a publish uses, from GitHub's documented shapes
// (GET /repos/{owner}/{repo}, GET and POST /repos/{owner}/{repo}/pulls), encoding and decoding
// them with go-github's own types.
type githubAPI struct {
	mu      sync.Mutex
	pulls   []*github.PullRequest
	created int
	auth    []string
}

func (g *githubAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.auth = append(g.auth, r.Header.Get("Authorization"))
	w.Header().Set("Content-Type", "application/json")
	switch {
	case r.Method == "GET" && r.URL.Path == "/api/v3/repos/org/repo":
		_ = json.NewEncoder(w).Encode(&github.Repository{Name: github.Ptr("repo"), DefaultBranch: github.Ptr("main")})
	case r.Method == "GET" && r.URL.Path == "/api/v3/repos/org/repo/pulls":
		out := []*github.PullRequest{}
		for _, pr := range g.pulls {
			if r.URL.Query().Get("head") == "org:"+pr.GetHead().GetRef() && pr.GetState() == r.URL.Query().Get("state") {
				out = append(out, pr)
			}
		}
		_ = json.NewEncoder(w).Encode(out)
	case r.Method == "POST" && r.URL.Path == "/api/v3/repos/org/repo/pulls":
		var in github.NewPullRequest
		if err := json.NewDecoder(r.Body).Decode(&in); err != nil || in.GetTitle() == "" || in.GetHead() == "" || in.GetBase() == "" {
			w.WriteHeader(http.StatusUnprocessableEntity)
			_ = json.NewEncoder(w).Encode(&github.ErrorResponse{Message: "Validation Failed"})
			return
		}
		g.created++
		n := len(g.pulls) + 1
		pr := &github.PullRequest{Number: github.Ptr(n), State: github.Ptr("open"), Title: in.Title, Body: in.Body,
			HTMLURL: github.Ptr(fmt.Sprintf("https://forge.example/org/repo/pull/%d", n)),
			Head:    &github.PullRequestBranch{Ref: in.Head}, Base: &github.PullRequestBranch{Ref: in.Base}}
		g.pulls = append(g.pulls, pr)
		w.WriteHeader(http.StatusCreated)
		_ = json.NewEncoder(w).Encode(pr)
	default:
		w.WriteHeader(http.StatusNotFound)
		_ = json.NewEncoder(w).Encode(&github.ErrorResponse{Message: "Not Found"})
	}
}

// TestPullRequestIdempotent: --pr opens one pull request against the repository's default
// branch with the session's title and body, through the configured API base URL and the
// gateway's token; publishing again reuses it.
func TestPullRequestIdempotent(t *testing.T) {
	ctx := testenv.Context(t, 60*time.Second)
	f := newForge(t)
	dir := userRepo(t, f)
	api := &githubAPI{}
	srv := httptest.NewServer(api)
	t.Cleanup(srv.Close)
	p := publisher(t, memCreds{"forge": gitCred}, srv.Client())
	req := Request{GitDir: filepath.Join(dir, ".git"), Source: "refs/heads/openclaw/s1", PR: true, Title: "Do the work", Body: "Task: do the work",
		Policy: providers.PublishPolicy{Credential: "forge", GitHubAPIURL: srv.URL + "/api/v3/"}}
	first, err := p.Publish(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if first.PullRequest == nil || !first.PullRequest.Created || first.PullRequest.Number != 1 || first.PullRequest.URL != "https://forge.example/org/repo/pull/1" {
		t.Fatalf("first publish: %+v", first.PullRequest)
	}
	pr := api.pulls[0]
	if pr.GetTitle() != "Do the work" || pr.GetBody() != "Task: do the work" || pr.GetHead().GetRef() != "openclaw/s1" || pr.GetBase().GetRef() != "main" {
		t.Fatalf("pull request opened as %+v", pr)
	}
	second, err := p.Publish(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if second.PullRequest == nil || second.PullRequest.Created || second.PullRequest.Number != 1 || api.created != 1 {
		t.Fatalf("second publish: %+v, %d created", second.PullRequest, api.created)
	}
	for _, a := range api.auth {
		if a != "Bearer "+token {
			t.Fatalf("API request with Authorization %q, want the gateway's token", a)
		}
	}
}

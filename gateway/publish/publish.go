// Package publish pushes a session's managed branch to its workspace's forge, and opens its pull
// request, with a forge credential only the gateway holds, given to git for one command through
// a credential helper that is the openclaw binary itself.
package publish

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"strings"
	"time"

	"github.com/google/go-github/v89/github"
	"golang.org/x/crypto/ssh/knownhosts"

	"github.com/openclaw/cloudworkers/internal/untrusted"
	"github.com/openclaw/cloudworkers/providers"
	"github.com/openclaw/cloudworkers/sync/gitexec"
)

// KindHTTPS is a forge credential for HTTPS: a username (x-access-token for a GitHub token)
// and a token, sent by git as basic authentication.
const KindHTTPS = "git-https"

// HelperEnv carries the credential to the helper git runs (and nowhere else: it is set on the
// one git command that pushes).
const HelperEnv = "OPENCLAW_GIT_CREDENTIAL"

// GitCredential is a gateway-held forge credential, stored JSON-encoded as a credential value.
type GitCredential struct {
	Kind     string `json:"kind"`
	Username string `json:"username,omitempty"`
	Token    string `json:"token,omitempty"`
	// PrivateKey (KindSSH) is the unencrypted private key, PEM or OpenSSH format.
	PrivateKey string `json:"privateKey,omitempty"`
	// KnownHost (KindSSH) pins the forge's host key: a known_hosts line or "TYPE BASE64";
	// HostKeyFingerprint pins it by its SHA256 fingerprint instead.
	KnownHost          string `json:"knownHost,omitempty"`
	HostKeyFingerprint string `json:"hostKeyFingerprint,omitempty"`
}

// ParseGitCredential reads a stored credential value; a value that is not a git credential is
// refused with what it lacks (never with the value).
func ParseGitCredential(v string) (GitCredential, error) {
	var c GitCredential
	if err := json.Unmarshal([]byte(v), &c); err != nil || c.Kind == "" {
		return GitCredential{}, errors.New("is not a git credential (set one with `openclaw credential set NAME --git-token` or `--git-ssh-key`)")
	}
	if c.Kind == KindSSH {
		if err := c.checkSSH(); err != nil {
			return GitCredential{}, err
		}
		if c.Username == "" {
			c.Username = "git"
		}
		return c, nil
	}
	if c.Kind != KindHTTPS {
		return GitCredential{}, fmt.Errorf("has kind %q; publishing supports %q and %q", c.Kind, KindHTTPS, KindSSH)
	}
	if c.Token == "" {
		return c, errors.New("has no token")
	}
	if c.Username == "" {
		c.Username = "x-access-token"
	}
	return c, nil
}

// Encode is the credential as stored.
func (c GitCredential) Encode() string {
	b, _ := json.Marshal(c)
	return string(b)
}

// SecretValues adds, for the secret scan, the token of each git credential among values (a
// stored value is the JSON of it; the token alone is what a worker could write).
func SecretValues(values map[string]string) {
	for name, v := range values {
		if c, err := ParseGitCredential(v); err == nil && c.Token != "" {
			values["@"+name+".token"] = c.Token
		} else if err == nil && c.PrivateKey != "" {
			values["@"+name+".key"] = strings.TrimSpace(c.PrivateKey)
		}
	}
}

// Credentials gives a stored credential's value.
type Credentials interface {
	Get(ctx context.Context, name string) (string, error)
}

// Config configures a Publisher.
type Config struct {
	Credentials Credentials
	// Helper is the argv of the credential helper (default: this executable, "git-credential").
	Helper []string
	// HTTPClient makes the forge API calls (default: a client with a 30 s timeout).
	HTTPClient *http.Client
	// TempDir holds an SSH push's key and known_hosts file for that one command (default
	// os.TempDir()).
	TempDir string
	Log     *slog.Logger
}

// Publisher pushes branches and opens pull requests.
type Publisher struct {
	cfg Config
}

// New returns a Publisher.
func New(cfg Config) (*Publisher, error) {
	if cfg.Credentials == nil {
		return nil, errors.New("publish: credentials are required")
	}
	if len(cfg.Helper) == 0 {
		exe, err := os.Executable()
		if err != nil {
			return nil, fmt.Errorf("publish: the credential helper: %w", err)
		}
		cfg.Helper = []string{exe, "git-credential"}
	}
	if cfg.HTTPClient == nil {
		cfg.HTTPClient = &http.Client{Timeout: 30 * time.Second}
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	return &Publisher{cfg: cfg}, nil
}

// Request is one publish.
type Request struct {
	// GitDir is the repository's common git directory (the user's; the managed worktree's
	// branch lives there).
	GitDir string
	// Source is the local branch ref to push (refs/heads/openclaw/<session>).
	Source string
	// Remote names the workspace's configured remote (default origin); its URL is read from the
	// repository's configuration, never from a worker.
	Remote string
	// Dest is the destination ref (default Source).
	Dest   string
	Force  bool
	Policy providers.PublishPolicy
	// PR opens (or finds) the pull request of Dest's branch, with Title and Body.
	PR          bool
	Title, Body string
}

// Result is what a publish did.
type Result struct {
	RemoteURL string `json:"remoteUrl"`
	Ref       string `json:"ref"`
	Commit    string `json:"commit"`
	// Status is git's: "new", "updated", "forced" or "up to date".
	Status      string       `json:"status"`
	PullRequest *PullRequest `json:"pullRequest,omitempty"`
}

// PullRequest is the forge's pull request of a published branch.
type PullRequest struct {
	Number  int    `json:"number"`
	URL     string `json:"url"`
	Created bool   `json:"created"` // false: an open one for the branch was reused
}

// RefusedError refuses a publish before git runs: no ref changed anywhere.
type RefusedError struct {
	Field, Reason string
}

func (e *RefusedError) Error() string { return "publish refused: " + e.Reason + "; no ref was pushed" }

var remoteRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$`)

// check refuses what the policy does not allow, before anything is sent.
func check(req *Request) error {
	if req.Remote == "" {
		req.Remote = "origin"
	}
	if req.Dest == "" {
		req.Dest = req.Source
	}
	if !remoteRE.MatchString(req.Remote) {
		return &RefusedError{"remote", fmt.Sprintf("remote %q is not a remote name", req.Remote)}
	}
	if !strings.HasPrefix(req.Dest, "refs/") || strings.ContainsAny(req.Dest, "*:") {
		return &RefusedError{"to", fmt.Sprintf("destination %q must be a full ref name (refs/heads/…)", req.Dest)}
	}
	allowed := false
	for _, pat := range req.Policy.Allowlist() {
		allowed = allowed || providers.RefMatch(pat, req.Dest)
	}
	if !allowed {
		return &RefusedError{"to", fmt.Sprintf("destination %s is outside the profile's publish.pushRefAllowlist (%s)", req.Dest, strings.Join(req.Policy.Allowlist(), ", "))}
	}
	if req.Force {
		ok := false
		for _, pat := range req.Policy.ForcePushAllowlist {
			ok = ok || providers.RefMatch(pat, req.Dest)
		}
		if !ok {
			return &RefusedError{"force", fmt.Sprintf("a force push to %s is not allowed by the profile's publish.forcePushAllowlist", req.Dest)}
		}
	}
	if req.Policy.Credential == "" {
		return &RefusedError{"credential", "the profile names no publish.credential (a git credential the gateway holds)"}
	}
	return nil
}

// Publish checks every destination ref against the policy, reads the remote's URL from the
// repository's configuration, pushes Source to it (atomically, hooks off, no credential helper
// but the gateway's, which answers for that URL's host only), then opens or finds the pull
// request when asked.
func (p *Publisher) Publish(ctx context.Context, req Request) (_ Result, err error) {
	if err := check(&req); err != nil {
		return Result{}, err
	}
	gitArgs := func(extra ...string) []string {
		return append([]string{"--git-dir=" + req.GitDir, "-c", "core.hooksPath=/dev/null"}, extra...)
	}
	env := []string{"GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null"}
	raw, err := gitexec.RunEnv(ctx, "", env, nil, gitArgs("config", "--get", "remote."+req.Remote+".url")...)
	if err != nil {
		return Result{}, &RefusedError{"remote", fmt.Sprintf("the workspace has no remote %q", req.Remote)}
	}
	remote := strings.TrimSpace(string(raw))
	sshR, isSSH := parseSSHRemote(remote)
	u, err := url.Parse(remote)
	if !isSSH && (err != nil || u.Host == "" || u.User != nil || (u.Scheme != "https" && !(u.Scheme == "http" && loopback(u.Hostname())))) {
		return Result{}, &RefusedError{"remote", fmt.Sprintf("remote %s has URL %q: publishing needs an https URL without credentials in it (http only to loopback) or an ssh one", req.Remote, redact(remote))}
	}
	stored, err := p.cfg.Credentials.Get(ctx, req.Policy.Credential)
	if err != nil {
		return Result{}, fmt.Errorf("publish credential %s: %w", req.Policy.Credential, err)
	}
	cred, err := ParseGitCredential(stored)
	if err != nil {
		return Result{}, &RefusedError{"credential", fmt.Sprintf("credential %s %v", req.Policy.Credential, err)}
	}
	switch {
	case isSSH && cred.Kind != KindSSH:
		return Result{}, &RefusedError{"credential", fmt.Sprintf("remote %s is an ssh URL but credential %s is an HTTPS token (set an SSH key with `openclaw credential set %s --git-ssh-key`)", req.Remote, req.Policy.Credential, req.Policy.Credential)}
	case !isSSH && cred.Kind != KindHTTPS:
		return Result{}, &RefusedError{"credential", fmt.Sprintf("remote %s is an %s URL but credential %s is an SSH key", req.Remote, u.Scheme, req.Policy.Credential)}
	case isSSH && req.PR:
		return Result{}, &RefusedError{"pr", fmt.Sprintf("--pr needs the forge's API, which an SSH key does not open: credential %s is an SSH key (publish without --pr, or use an HTTPS token)", req.Policy.Credential)}
	}
	commit, err := gitexec.Line(ctx, "", gitArgs("rev-parse", "--verify", req.Source+"^{commit}")...)
	if err != nil {
		return Result{}, fmt.Errorf("publish %s: %w", req.Source, err)
	}
	spec := req.Source + ":" + req.Dest
	if req.Force {
		spec = "+" + spec
	}
	var transport []string
	if isSSH {
		// the key and the pin exist for this one command, 0600 in a private directory
		s, serr := prepareSSH(ctx, p.cfg.TempDir, cred, sshR)
		if serr != nil {
			return Result{}, fmt.Errorf("push %s to %s: %w", req.Dest, remote, serr)
		}
		defer os.RemoveAll(s.dir)
		transport = []string{"-c", "protocol.allow=never", "-c", "protocol.ssh.allow=always", "-c", "core.sshCommand="}
		env = append(env, "GIT_SSH_COMMAND="+s.command(sshR, cred.Username), "GIT_SSH_VARIANT=ssh", "GIT_SSH=",
			"SSH_AUTH_SOCK=", "SSH_ASKPASS=", "SSH_ASKPASS_REQUIRE=never", "DISPLAY=")
		defer func() {
			var ge *gitexec.Error
			if err != nil && errors.As(err, &ge) && hostKeyRefused(ge.Stderr) {
				err = fmt.Errorf("push %s to %s: %w", req.Dest, remote, &HostKeyError{Host: knownhosts.Normalize(sshR.addr()), Fingerprint: s.fingerprint})
			}
		}()
	} else {
		helper, _ := json.Marshal(helperInput{Protocol: u.Scheme, Host: u.Host, Username: cred.Username, Token: cred.Token})
		quoted := make([]string, len(p.cfg.Helper))
		for i, a := range p.cfg.Helper {
			quoted[i] = untrusted.Quote(a)
		}
		transport = []string{"-c", "protocol.allow=never", "-c", "protocol.https.allow=always"}
		if u.Scheme == "http" {
			transport = append(transport, "-c", "protocol.http.allow=always")
		}
		transport = append(transport, "-c", "credential.helper=", "-c", "credential.helper=!"+strings.Join(quoted, " "),
			"-c", "credential.useHttpPath=false", "-c", "http.followRedirects=false")
		env = append(env, HelperEnv+"="+string(helper))
	}
	args := gitArgs(append(transport, "push", "--porcelain", "--atomic", "--no-verify", remote, spec)...)
	out, perr := gitexec.RunEnv(ctx, "", env, nil, args...)
	status := pushStatus(string(out), req.Dest)
	if perr != nil {
		return Result{}, fmt.Errorf("push %s to %s: %w", req.Dest, redact(remote), scrub(perr, cred.Token))
	}
	res := Result{RemoteURL: remote, Ref: req.Dest, Commit: commit, Status: status}
	p.cfg.Log.Info("published", "ref", req.Dest, "remote", redact(remote), "commit", commit, "status", status)
	if req.PR {
		pr, err := p.pullRequest(ctx, u, cred, req)
		if err != nil {
			return res, err
		}
		res.PullRequest = pr
	}
	return res, nil
}

// helperInput is what the helper answers with, for one host.
type helperInput struct {
	Protocol, Host, Username, Token string
}

// pushStatus reads `git push --porcelain`'s flag for ref.
func pushStatus(out, ref string) string {
	for _, line := range strings.Split(out, "\n") {
		f := strings.Split(line, "\t")
		if len(f) >= 3 && strings.HasSuffix(f[1], ":"+ref) {
			switch f[0] {
			case "*":
				return "new"
			case " ":
				return "updated"
			case "+":
				return "forced"
			case "=":
				return "up to date"
			case "!":
				return "rejected"
			}
		}
	}
	return ""
}

func loopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// redact drops the user information of a URL.
func redact(s string) string {
	if u, err := url.Parse(s); err == nil && u.User != nil {
		u.User = nil
		return u.String()
	}
	return s
}

// scrub makes sure the token is in no error (git never prints it; this is the belt).
func scrub(err error, token string) error {
	if token == "" || !strings.Contains(err.Error(), token) {
		return err
	}
	return errors.New(strings.ReplaceAll(err.Error(), token, "[redacted]"))
}

// RunHelper is the credential helper: git runs `<helper> get|store|erase` with the request on
// stdin; for get, it answers with the username and token of HelperEnv when the protocol and
// host are the ones the gateway pushes to, and with nothing otherwise (so that a rewritten URL
// never receives the token).
func RunHelper(args []string, stdin io.Reader, stdout io.Writer, env string) error {
	if len(args) != 1 || args[0] != "get" {
		return nil // store, erase: nothing is kept
	}
	var want helperInput
	if err := json.Unmarshal([]byte(env), &want); err != nil || want.Token == "" {
		return errors.New("git-credential: no credential for this command")
	}
	got := map[string]string{}
	sc := bufio.NewScanner(io.LimitReader(stdin, 64<<10))
	for sc.Scan() {
		if sc.Text() == "" {
			break
		}
		if k, v, ok := strings.Cut(sc.Text(), "="); ok {
			got[k] = v
		}
	}
	if got["protocol"] != want.Protocol || got["host"] != want.Host {
		return nil
	}
	_, err := fmt.Fprintf(stdout, "username=%s\npassword=%s\n\n", want.Username, want.Token)
	return err
}

var githubPathRE = regexp.MustCompile(`^/([A-Za-z0-9_.-]+)/([A-Za-z0-9_.-]+?)(?:\.git)?/?$`)

// pullRequest finds the open pull request of the published branch, or opens one.
func (p *Publisher) pullRequest(ctx context.Context, remote *url.URL, cred GitCredential, req Request) (*PullRequest, error) {
	m := githubPathRE.FindStringSubmatch(remote.Path)
	if m == nil {
		return nil, fmt.Errorf("pull request: remote %s is not a GitHub repository URL (https://HOST/OWNER/REPO)", redact(remote.String()))
	}
	owner, repo := m[1], m[2]
	base := req.Policy.GitHubAPIURL
	if base == "" {
		base = "https://api.github.com/"
	}
	if !strings.HasSuffix(base, "/") {
		base += "/"
	}
	gh, err := github.NewClient(github.WithHTTPClient(p.cfg.HTTPClient), github.WithAuthToken(cred.Token), github.WithURLs(&base, &base))
	if err != nil {
		return nil, fmt.Errorf("pull request: %w", err)
	}
	branch, ok := strings.CutPrefix(req.Dest, "refs/heads/")
	if !ok {
		return nil, fmt.Errorf("pull request: %s is not a branch", req.Dest)
	}
	open, _, err := gh.PullRequests.List(ctx, owner, repo, &github.PullRequestListOptions{State: "open", Head: owner + ":" + branch})
	if err != nil {
		return nil, fmt.Errorf("pull request: list %s/%s: %w", owner, repo, scrub(err, cred.Token))
	}
	for _, pr := range open {
		if pr.GetHead().GetRef() == branch {
			return &PullRequest{Number: pr.GetNumber(), URL: pr.GetHTMLURL()}, nil
		}
	}
	target := req.Policy.BaseBranch
	if target == "" {
		r, _, err := gh.Repositories.Get(ctx, owner, repo)
		if err != nil {
			return nil, fmt.Errorf("pull request: repository %s/%s: %w", owner, repo, scrub(err, cred.Token))
		}
		target = r.GetDefaultBranch()
	}
	title := req.Title
	if title == "" {
		title = branch
	}
	pr, _, err := gh.PullRequests.Create(ctx, owner, repo, &github.NewPullRequest{Title: &title, Head: &branch, Base: &target, Body: &req.Body})
	if err != nil {
		return nil, fmt.Errorf("pull request: open %s → %s in %s/%s: %w", branch, target, owner, repo, scrub(err, cred.Token))
	}
	return &PullRequest{Number: pr.GetNumber(), URL: pr.GetHTMLURL(), Created: true}, nil
}

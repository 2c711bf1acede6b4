// Package gitforge is a real smart-HTTP git server on loopback, for tests and the demo: `git
// http-backend` behind net/http/cgi, with HTTP basic authentication of one username and token.
package gitforge

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/cgi"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"
)

// Forge serves the bare repositories under Root at URL (http://127.0.0.1:PORT).
type Forge struct {
	URL, Root string
	// Authed counts the requests that passed authentication, Refused those that did not.
	Authed, Refused atomic.Int64

	srv *http.Server
}

// Start serves a new forge (stop it with Close) whose repositories live under root and accept
// pushes from user with token.
func Start(root, user, token string) (*Forge, error) {
	if user == "" || token == "" {
		return nil, errors.New("gitforge: a username and a token are required")
	}
	execPath, err := exec.Command("git", "--exec-path").Output()
	if err != nil {
		return nil, fmt.Errorf("gitforge: git --exec-path: %w", err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	f := &Forge{URL: "http://" + l.Addr().String(), Root: root}
	backend := &cgi.Handler{Path: filepath.Join(strings.TrimSpace(string(execPath)), "git-http-backend"),
		Env: []string{"GIT_PROJECT_ROOT=" + root, "GIT_HTTP_EXPORT_ALL=1", "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null"}}
	f.srv = &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if u, p, ok := r.BasicAuth(); !ok || u != user || p != token {
			f.Refused.Add(1)
			w.Header().Set("WWW-Authenticate", `Basic realm="gitforge"`)
			http.Error(w, "authentication required", http.StatusUnauthorized)
			return
		}
		f.Authed.Add(1)
		r.Header.Set("REMOTE_USER", user)
		backend.ServeHTTP(w, r)
	})}
	go func() { _ = f.srv.Serve(l) }()
	return f, nil
}

// Close stops the server.
func (f *Forge) Close() error { return f.srv.Close() }

// Init creates the bare repository name (such as "org/repo.git") that accepts pushes, and
// returns its directory and its URL.
func (f *Forge) Init(ctx context.Context, name string) (dir, url string, err error) {
	dir = filepath.Join(f.Root, filepath.FromSlash(name))
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return "", "", err
	}
	for _, args := range [][]string{{"init", "-q", "--bare", "--initial-branch=main", dir}, {"-C", dir, "config", "http.receivepack", "true"}} {
		if _, err := Git(ctx, args...); err != nil {
			return "", "", err
		}
	}
	return dir, f.URL + "/" + name, nil
}

// Refs lists a bare repository's refs, "REF OID" a line.
func Refs(ctx context.Context, dir string) (string, error) {
	return Git(ctx, "-C", dir, "for-each-ref", "--format=%(refname) %(objectname)")
}

// Git runs git with no system or user configuration and returns its trimmed output.
func Git(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "git", args...)
	cmd.Env = append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null", "GIT_TERMINAL_PROMPT=0", "LC_ALL=C")
	out, err := cmd.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("git %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return strings.TrimSpace(string(out)), nil
}

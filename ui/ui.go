// Package ui serves the Control UI: server-rendered pages and their embedded assets, signed in by a
// one-time code for a browser session cookie, talking to the gateway only through /api/v1 and its
// WebSocket streams.
package ui

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"mime"
	"net/http"
	"path"
	"strings"
)

//go:embed templates/*.html static/*
var embedded embed.FS

// Config configures the UI handler.
type Config struct {
	// Sessions signs browsers in and out; the UI holds no secret and writes no row.
	Sessions Sessions
	Log      *slog.Logger
}

// Sessions is the gateway's side of signing a browser in: one-time sign-in codes exchanged for
// browser sessions kept by the gateway.
type Sessions interface {
	// SignIn uses a one-time sign-in code up and sets the session cookie on w; a code that is
	// unknown, used or expired is an error saying so.
	SignIn(w http.ResponseWriter, r *http.Request, code string) error
	// SignedIn reports whether r carries the cookie of a live browser session.
	SignedIn(r *http.Request) bool
	// SignOut ends r's browser session, if any, and clears its cookie on w.
	SignOut(w http.ResponseWriter, r *http.Request)
	// SameOrigin reports whether r's Origin names this gateway, scheme included.
	SameOrigin(r *http.Request) bool
}

// Handler serves the Control UI.
type Handler struct {
	cfg    Config
	mux    *http.ServeMux
	pages  *template.Template
	assets map[string]asset // hashed name → content
	names  map[string]string
}

type asset struct {
	body  []byte
	ctype string
}

// Pages the UI serves, each a template named after it.
var pageRoutes = map[string]string{
	"/{$}":                            "sessions",
	"/new":                            "new",
	"/sessions/{id}":                  "chat",
	"/environments":                   "environments",
	"/environments/{id}":              "environment",
	"/profiles":                       "profiles",
	"/usage":                          "usage",
	"/sessions/{id}/commits/{commit}": "diff",
}

// New builds the handler from the embedded assets.
func New(cfg Config) (*Handler, error) {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Sessions == nil {
		return nil, fmt.Errorf("ui: no Sessions to sign browsers in")
	}
	h := &Handler{cfg: cfg, mux: http.NewServeMux(), assets: map[string]asset{}, names: map[string]string{}}
	static, err := fs.Sub(embedded, "static")
	if err != nil {
		return nil, err
	}
	err = fs.WalkDir(static, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(static, p)
		if err != nil {
			return err
		}
		sum := sha256.Sum256(b)
		ext := path.Ext(p)
		hashed := strings.TrimSuffix(p, ext) + "." + hex.EncodeToString(sum[:6]) + ext
		h.assets[hashed] = asset{body: b, ctype: mime.TypeByExtension(ext)}
		h.names[p] = "/assets/" + hashed
		return nil
	})
	if err != nil {
		return nil, err
	}
	tmpl, err := fs.Sub(embedded, "templates")
	if err != nil {
		return nil, err
	}
	h.pages, err = template.New("").Funcs(template.FuncMap{"asset": h.asset}).ParseFS(tmpl, "*.html")
	if err != nil {
		return nil, err
	}
	h.mux.HandleFunc("GET /assets/{name}", h.serveAsset)
	h.mux.HandleFunc("GET /login", h.login)
	h.mux.HandleFunc("POST /login", h.login)
	h.mux.HandleFunc("POST /logout", h.logout)
	for route, page := range pageRoutes {
		h.mux.HandleFunc("GET "+route, h.page(page))
	}
	h.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		h.render(w, http.StatusNotFound, "notfound", pageData{Page: "notfound", Title: "Not found"})
	})
	return h, nil
}

// asset returns the hashed URL of a static file.
func (h *Handler) asset(name string) (string, error) {
	u, ok := h.names[name]
	if !ok {
		return "", fmt.Errorf("no asset %q", name)
	}
	return u, nil
}

// AssetNames lists the hashed asset URLs (for tests).
func (h *Handler) AssetNames() map[string]string { return h.names }

func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	hdr := w.Header()
	hdr.Set("X-Content-Type-Options", "nosniff")
	// same-origin, not no-referrer: with no-referrer a browser sends "Origin: null" on a form
	// POST, and the Origin check (CSRF) would refuse the gateway's own sign-in and sign-out.
	hdr.Set("Referrer-Policy", "same-origin")
	hdr.Set("X-Frame-Options", "DENY")
	hdr.Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; form-action 'self'; base-uri 'none'")
	h.mux.ServeHTTP(w, r)
}

func (h *Handler) serveAsset(w http.ResponseWriter, r *http.Request) {
	a, ok := h.assets[r.PathValue("name")]
	if !ok {
		http.NotFound(w, r)
		return
	}
	w.Header().Set("Content-Type", a.ctype)
	w.Header().Set("Cache-Control", "public, max-age=31536000, immutable")
	_, _ = w.Write(a.body)
}

type pageData struct {
	Page   string
	Title  string
	ID     string
	Commit string
	Error  string
}

func (h *Handler) render(w http.ResponseWriter, status int, name string, d pageData) {
	var buf bytes.Buffer
	if err := h.pages.ExecuteTemplate(&buf, name+".html", d); err != nil {
		h.cfg.Log.Error("ui template", "page", name, "err", err)
		http.Error(w, "template error", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

var titles = map[string]string{
	"sessions": "Sessions", "new": "New session", "chat": "Session", "environments": "Environments",
	"environment": "Environment", "profiles": "Profiles", "diff": "Commit", "usage": "Usage",
}

func (h *Handler) page(name string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !h.cfg.Sessions.SignedIn(r) {
			http.Redirect(w, r, "/login", http.StatusSeeOther)
			return
		}
		h.render(w, http.StatusOK, name, pageData{Page: name, Title: titles[name], ID: r.PathValue("id"), Commit: r.PathValue("commit")})
	}
}

// TokenRefused is what /login answers to the old link form /login?token=…: the operator token
// is never taken in a URL (browser history, the browser's command line).
const TokenRefused = "Sign-in links with the operator token are no longer accepted. Run `openclaw ui` on the gateway's machine: it prints a one-time sign-in link (valid 2 minutes)."

// login exchanges a one-time sign-in code (?code= from the link `openclaw ui` prints, or the
// form's field) for a browser session and redirects to / so the code leaves the address bar;
// without a code it shows the form. A ?token= link is refused, saying how to sign in.
func (h *Handler) login(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	if q.Has("token") {
		h.render(w, http.StatusBadRequest, "login", pageData{Page: "login", Title: "Sign in", Error: TokenRefused})
		return
	}
	code := q.Get("code")
	if r.Method == http.MethodPost {
		if !h.cfg.Sessions.SameOrigin(r) {
			h.render(w, http.StatusForbidden, "login", pageData{Page: "login", Title: "Sign in", Error: "This form must be sent from the gateway's own sign-in page."})
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, 4096)
		if err := r.ParseForm(); err != nil {
			h.render(w, http.StatusBadRequest, "login", pageData{Page: "login", Title: "Sign in", Error: "The form could not be read."})
			return
		}
		code = r.PostForm.Get("code")
	} else if code == "" {
		h.render(w, http.StatusOK, "login", pageData{Page: "login", Title: "Sign in"})
		return
	}
	if err := h.cfg.Sessions.SignIn(w, r, code); err != nil {
		h.render(w, http.StatusUnauthorized, "login", pageData{Page: "login", Title: "Sign in",
			Error: "That sign-in code does not sign in (" + err.Error() + ")."})
		return
	}
	http.Redirect(w, r, localNext(q.Get("next")), http.StatusSeeOther)
}

// localNext is where a sign-in continues: next when it is a path of this gateway ("/openclaw/",
// the OpenClaw Control UI), "/" otherwise (never another host).
func localNext(next string) string {
	if next == "" || !strings.HasPrefix(next, "/") || strings.HasPrefix(next, "//") || strings.ContainsAny(next, "\\\r\n") || len(next) > 256 {
		return "/"
	}
	return next
}

// logout ends the browser session and clears its cookie.
func (h *Handler) logout(w http.ResponseWriter, r *http.Request) {
	if !h.cfg.Sessions.SameOrigin(r) {
		http.Error(w, "sign-out must come from the gateway's own pages", http.StatusForbidden)
		return
	}
	h.cfg.Sessions.SignOut(w, r)
	http.Redirect(w, r, "/login", http.StatusSeeOther)
}

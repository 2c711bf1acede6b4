// Package ui serves the Control UI: server-rendered pages and their embedded assets, signed in by a
// session cookie, talking to the gateway only through /api/v1 and its WebSocket streams.
package ui

import (
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
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

	"github.com/openclaw/cloudworkers/gateway/api"
)

//go:embed templates/*.html static/*
var embedded embed.FS

// Config configures the UI handler.
type Config struct {
	// Token is the gateway's operator token: /login exchanges it for the session cookie.
	Token string
	Log   *slog.Logger
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
	"/sessions/{id}/commits/{commit}": "diff",
}

// New builds the handler from the embedded assets.
func New(cfg Config) (*Handler, error) {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
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
	"environment": "Environment", "profiles": "Profiles", "diff": "Commit",
}

func (h *Handler) page(name string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !api.ValidSession(r, h.cfg.Token) {
			http.Redirect(w, r, "/login", http.StatusSeeOther)
			return
		}
		h.render(w, http.StatusOK, name, pageData{Page: name, Title: titles[name], ID: r.PathValue("id"), Commit: r.PathValue("commit")})
	}
}

// login exchanges the operator token (?token= or the form's field) for the session cookie and
// redirects to / so the token leaves the address bar; without a token it shows the form.
func (h *Handler) login(w http.ResponseWriter, r *http.Request) {
	token := r.URL.Query().Get("token")
	if r.Method == http.MethodPost {
		if !api.SameOrigin(r) {
			h.render(w, http.StatusForbidden, "login", pageData{Page: "login", Title: "Sign in", Error: "This form must be sent from the gateway's own sign-in page."})
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, 4096)
		if err := r.ParseForm(); err != nil {
			h.render(w, http.StatusBadRequest, "login", pageData{Page: "login", Title: "Sign in", Error: "The form could not be read."})
			return
		}
		token = r.PostForm.Get("token")
	} else if token == "" {
		h.render(w, http.StatusOK, "login", pageData{Page: "login", Title: "Sign in"})
		return
	}
	token = strings.TrimSpace(token)
	if h.cfg.Token == "" || subtle.ConstantTimeCompare([]byte(token), []byte(h.cfg.Token)) != 1 {
		h.cfg.Log.Warn("authentication failed", "reason", "wrong token at the sign-in page", "method", r.Method, "path", r.URL.Path, "remote", r.RemoteAddr)
		h.render(w, http.StatusUnauthorized, "login", pageData{Page: "login", Title: "Sign in",
			Error: "That token is not this gateway's token (see <data-dir>/gateway.token, or run `openclaw ui`)."})
		return
	}
	http.SetCookie(w, &http.Cookie{Name: api.SessionCookie, Value: api.SessionValue(h.cfg.Token), Path: "/",
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil})
	http.Redirect(w, r, "/", http.StatusSeeOther)
}

// logout clears the session cookie.
func (h *Handler) logout(w http.ResponseWriter, r *http.Request) {
	if !api.SameOrigin(r) {
		http.Error(w, "sign-out must come from the gateway's own pages", http.StatusForbidden)
		return
	}
	http.SetCookie(w, &http.Cookie{Name: api.SessionCookie, Value: "", Path: "/", MaxAge: -1,
		HttpOnly: true, SameSite: http.SameSiteStrictMode})
	http.Redirect(w, r, "/login", http.StatusSeeOther)
}

package openclaw

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"html"
	"io/fs"
	"mime"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strings"
	"time"
)

// ControlUIConfig serves OpenClaw's own Control UI from an installed openclaw package.
type ControlUIConfig struct {
	// Root is the installed package (the directory holding dist/control-ui).
	Root string
	// BasePath is where it is served, e.g. "/openclaw" (our own UI keeps "/").
	BasePath string
	// SignedIn reports whether a request carries a signed-in browser session of this gateway.
	SignedIn func(r *http.Request) bool
	// LoginURL is where a browser that is not signed in is sent (with ?next=).
	LoginURL string
	Version  string
}

// ControlUI is the handler of OpenClaw's Control UI under a base path.
type ControlUI struct {
	cfg   ControlUIConfig
	files fs.FS
	index []byte
	csp   string
}

var basePathRE = regexp.MustCompile(`^/[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*$`)

// NewControlUI checks the package's Control UI and prepares its index page (asset paths under the
// base path, the base-path attribute the UI reads).
func NewControlUI(cfg ControlUIConfig) (*ControlUI, error) {
	cfg.BasePath = strings.TrimRight(cfg.BasePath, "/")
	if cfg.BasePath == "" {
		cfg.BasePath = "/openclaw"
	}
	if !basePathRE.MatchString(cfg.BasePath) || strings.HasPrefix(cfg.BasePath, "/api") || cfg.BasePath == "/mcp" || strings.HasPrefix(cfg.BasePath, "/occ") {
		return nil, fmt.Errorf("controlUi.basePath %q: must be a path like /openclaw, outside /api, /mcp and /occ", cfg.BasePath)
	}
	dir := filepath.Join(cfg.Root, "dist", "control-ui")
	raw, err := os.ReadFile(filepath.Join(dir, "index.html"))
	if err != nil {
		return nil, fmt.Errorf("controlUi.openclawRoot %q: no Control UI there (want an installed openclaw package with dist/control-ui/index.html): %w", cfg.Root, err)
	}
	if cfg.SignedIn == nil {
		return nil, fmt.Errorf("controlUi: no sign-in to put the Control UI behind")
	}
	u := &ControlUI{cfg: cfg, files: os.DirFS(dir)}
	u.index, u.csp = prepareIndex(raw, cfg.BasePath)
	return u, nil
}

// BasePath is where the UI is served.
func (u *ControlUI) BasePath() string { return u.cfg.BasePath }

var inlineScriptRE = regexp.MustCompile(`(?s)<script\b([^>]*)>(.*?)</script>`)

// prepareIndex points the page's relative asset paths at the base path, adds the attributes the
// UI reads on <html>, and builds a Content-Security-Policy that allows exactly its inline scripts.
func prepareIndex(raw []byte, base string) ([]byte, string) {
	s := string(raw)
	s = strings.NewReplacer(`src="./`, `src="`+base+`/`, `href="./`, `href="`+base+`/`).Replace(s)
	attrs := fmt.Sprintf(` data-openclaw-control-ui-base-path="%s" data-openclaw-terminal-enabled="false"`, html.EscapeString(base))
	s = regexp.MustCompile(`(?i)<html\b`).ReplaceAllLiteralString(s, "<html"+attrs)
	var hashes []string
	for _, m := range inlineScriptRE.FindAllStringSubmatch(s, -1) {
		if strings.Contains(m[1], "src=") {
			continue
		}
		sum := sha256.Sum256([]byte(m[2]))
		hashes = append(hashes, "'sha256-"+base64.StdEncoding.EncodeToString(sum[:])+"'")
	}
	csp := "default-src 'self'; script-src 'self' " + strings.Join(hashes, " ") + " 'wasm-unsafe-eval'; style-src 'self' 'unsafe-inline'; " +
		"img-src 'self' data: blob:; font-src 'self' data:; media-src 'self' blob: data:; connect-src 'self'; worker-src 'self' blob:; " +
		"frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
	return []byte(s), csp
}

// ServeHTTP serves the UI's files, its config, and its index page for every other path under the
// base path (the UI routes itself), to signed-in browsers only.
func (u *ControlUI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	base := u.cfg.BasePath
	rel, ok := strings.CutPrefix(r.URL.Path, base)
	if !ok || (rel != "" && !strings.HasPrefix(rel, "/")) {
		http.NotFound(w, r)
		return
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Referrer-Policy", "no-referrer")
	if !u.cfg.SignedIn(r) {
		if strings.Contains(r.Header.Get("Accept"), "text/html") || rel == "" || rel == "/" {
			http.Redirect(w, r, u.cfg.LoginURL+"?next="+base+"/", http.StatusSeeOther)
			return
		}
		http.Error(w, "sign in first (openclaw ui --openclaw)", http.StatusUnauthorized)
		return
	}
	if rel == "" {
		http.Redirect(w, r, base+"/", http.StatusMovedPermanently)
		return
	}
	switch rel {
	case "/control-ui-config.json", "/__openclaw/control-ui-config.json":
		w.Header().Set("Content-Type", "application/json; charset=utf-8")
		w.Header().Set("Cache-Control", "no-cache")
		_ = json.NewEncoder(w).Encode(map[string]any{"basePath": base, "assistantName": "OpenClaw", "serverVersion": orDefault(u.cfg.Version, "dev"),
			"embedSandbox": "strict", "allowExternalEmbedUrls": false, "automaticallyFetchFavicons": false, "communityInvite": false,
			"terminalEnabled": false, "cliAgentsEnabled": false, "pluginAssetsRequireAuth": true, "pluginFrameGrants": []any{}})
		return
	}
	name := strings.TrimPrefix(path.Clean(rel), "/")
	if name != "" && name != "." && name != "index.html" {
		if fi, err := fs.Stat(u.files, name); err == nil && fi.Mode().IsRegular() {
			u.serveFile(w, r, name)
			return
		}
		if path.Ext(name) != "" && !strings.Contains(r.Header.Get("Accept"), "text/html") {
			http.NotFound(w, r) // a missing asset is not the app
			return
		}
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-cache")
	w.Header().Set("Content-Security-Policy", u.csp)
	_, _ = w.Write(u.index)
}

func (u *ControlUI) serveFile(w http.ResponseWriter, r *http.Request, name string) {
	b, err := fs.ReadFile(u.files, name)
	if err != nil {
		http.NotFound(w, r)
		return
	}
	if ct := mime.TypeByExtension(path.Ext(name)); ct != "" {
		w.Header().Set("Content-Type", ct)
	}
	if strings.HasPrefix(name, "assets/") {
		w.Header().Set("Cache-Control", "public, max-age=31536000, immutable") // hashed names
	} else {
		w.Header().Set("Cache-Control", "no-cache")
	}
	http.ServeContent(w, r, name, time.Time{}, bytes.NewReader(b))
}

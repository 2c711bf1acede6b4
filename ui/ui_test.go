package ui_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/openclaw/cloudworkers/gateway/api"
	"github.com/openclaw/cloudworkers/gateway/auth"
	"github.com/openclaw/cloudworkers/gateway/store/storetest"
	"github.com/openclaw/cloudworkers/internal/clock"
	"github.com/openclaw/cloudworkers/ui"
)

const token = "tok-0123456789abcdef0123456789abcdef"

// signin is the gateway's sign-in as the gateway builds it, on a database in t's temp dir.
func signin(t testing.TB, clk clock.Clock, proxies ...string) *auth.Browser {
	t.Helper()
	pp, err := auth.ParseProxies(proxies)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	b, err := auth.OpenBrowser(ctx, auth.BrowserConfig{DB: storetest.Open(t), Token: token, Clock: clk, TrustedProxies: pp})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// serve is the API server with the UI mounted, as the gateway builds it, plus one GET and one
// POST route standing in for the API.
func serve(t *testing.T, b *auth.Browser) (*httptest.Server, *ui.Handler) {
	t.Helper()
	h, err := ui.New(ui.Config{Sessions: b})
	if err != nil {
		t.Fatal(err)
	}
	srv := api.New(api.Config{Token: token, UI: h, Browser: b, Mount: []func(g *echo.Group){func(g *echo.Group) {
		g.GET("/probe", func(c echo.Context) error { return c.String(http.StatusOK, "read") })
		g.POST("/probe", func(c echo.Context) error { return c.String(http.StatusOK, "changed") })
	}}})
	ts := httptest.NewServer(srv)
	t.Cleanup(ts.Close)
	return ts, h
}

func server(t *testing.T) (*httptest.Server, *ui.Handler) {
	t.Helper()
	return serve(t, signin(t, nil))
}

var noRedirect = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

func do(t *testing.T, method, u string, hdr map[string]string, body string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(method, u, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		if k == "Host" {
			req.Host = v
			continue
		}
		req.Header.Set(k, v)
	}
	res, err := noRedirect.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res, string(b)
}

func sessionCookie(t *testing.T, res *http.Response) *http.Cookie {
	t.Helper()
	for _, c := range res.Cookies() {
		if c.Name == auth.CookieName {
			return c
		}
	}
	t.Fatalf("no %s cookie in %v", auth.CookieName, res.Header["Set-Cookie"])
	return nil
}

// mintLink mints a sign-in code through the API, as `openclaw ui` does, and returns its link.
func mintLink(t testing.TB, base string) string {
	t.Helper()
	code, err := api.NewClient(base, token).MintSignInCode(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return base + code.Path
}

// signedIn signs in with a fresh code and returns the cookie header.
func signedIn(t *testing.T, base string) map[string]string {
	t.Helper()
	res, _ := do(t, "GET", mintLink(t, base), nil, "")
	c := sessionCookie(t, res)
	return map[string]string{"Cookie": c.Name + "=" + c.Value}
}

func TestSignInCodeWorksOnceAndLeavesTheAddressBar(t *testing.T) {
	ts, _ := server(t)
	link := mintLink(t, ts.URL)
	if !strings.HasPrefix(link, ts.URL+"/login?code=") || strings.Contains(link, token) {
		t.Fatalf("sign-in link %q", link)
	}
	res, _ := do(t, "GET", link, nil, "")
	if res.StatusCode != http.StatusSeeOther || res.Header.Get("Location") != "/" {
		t.Fatalf("sign-in link: %d to %q, want 303 to / (the code leaves the address bar)", res.StatusCode, res.Header.Get("Location"))
	}
	c := sessionCookie(t, res)
	if !c.HttpOnly || c.SameSite != http.SameSiteStrictMode || c.Path != "/" || c.Secure {
		t.Fatalf("cookie %+v: want HttpOnly, SameSite=Strict, Path=/ and, over plain HTTP, not Secure", c)
	}
	if strings.Contains(c.Value, token) || strings.Contains(link, c.Value) {
		t.Fatal("the cookie carries the token or the code")
	}
	cookie := map[string]string{"Cookie": c.Name + "=" + c.Value}
	if res, body := do(t, "GET", ts.URL+"/", cookie, ""); res.StatusCode != 200 || !strings.Contains(body, "<h1>Sessions</h1>") {
		t.Fatalf("signed-in home: %d %s", res.StatusCode, body)
	}
	if res, body := do(t, "GET", ts.URL+"/api/v1/probe", cookie, ""); res.StatusCode != 200 || body != "read" {
		t.Fatalf("API read with the cookie: %d %s", res.StatusCode, body)
	}
	// the same link again: refused, no cookie, and the page says how to get another
	res, body := do(t, "GET", link, nil, "")
	if res.StatusCode != http.StatusUnauthorized || len(res.Cookies()) != 0 || !strings.Contains(body, "already used") || !strings.Contains(body, "openclaw ui") {
		t.Fatalf("second use of the link: %d cookies %v %s", res.StatusCode, res.Cookies(), body)
	}
	if res, _ := do(t, "GET", ts.URL+"/", nil, ""); res.StatusCode != http.StatusSeeOther || res.Header.Get("Location") != "/login" {
		t.Fatalf("home without the cookie: %d to %q, want 303 to /login", res.StatusCode, res.Header.Get("Location"))
	}
	for _, forged := range []string{token, "x", c.Value + "x"} {
		if res, _ := do(t, "GET", ts.URL+"/", map[string]string{"Cookie": auth.CookieName + "=" + forged}, ""); res.StatusCode != http.StatusSeeOther {
			t.Fatalf("home with a forged cookie %q: %d, want a redirect to sign in", forged, res.StatusCode)
		}
	}
}

// An expired code does not sign in (the clock is the gateway's injected one).
func TestSignInCodeExpires(t *testing.T) {
	clk := clock.NewManual(time.Date(2026, 1, 2, 3, 4, 0, 0, time.UTC))
	ts, _ := serve(t, signin(t, clk))
	link := mintLink(t, ts.URL)
	clk.Advance(auth.CodeLifetime)
	res, body := do(t, "GET", link, nil, "")
	if res.StatusCode != http.StatusUnauthorized || len(res.Cookies()) != 0 || !strings.Contains(body, "expired") {
		t.Fatalf("an expired code: %d cookies %v %s", res.StatusCode, res.Cookies(), body)
	}
}

// The old link form, /login?token=…, is refused (right token or wrong), saying how to sign in.
func TestLoginTokenLinkIsRefused(t *testing.T) {
	ts, _ := server(t)
	for _, tok := range []string{token, "wrong"} {
		res, body := do(t, "GET", ts.URL+"/login?token="+url.QueryEscape(tok), nil, "")
		if res.StatusCode != http.StatusBadRequest || len(res.Cookies()) != 0 || !strings.Contains(body, "Run <code>openclaw ui</code>") ||
			!strings.Contains(body, "one-time sign-in link") || strings.Contains(body, tok) && tok == token {
			t.Fatalf("/login?token=%s: %d cookies %v %s", tok, res.StatusCode, res.Cookies(), body)
		}
	}
}

func TestLoginFormAndBadCode(t *testing.T) {
	ts, _ := server(t)
	res, body := do(t, "GET", ts.URL+"/login", nil, "")
	if res.StatusCode != 200 || !strings.Contains(body, `<label for="code">Sign-in code</label>`) || !strings.Contains(body, `id="code"`) ||
		!strings.Contains(body, "openclaw ui") {
		t.Fatalf("sign-in form: %d %s", res.StatusCode, body)
	}
	res, body = do(t, "GET", ts.URL+"/login?code=wrong", nil, "")
	if res.StatusCode != http.StatusUnauthorized || !strings.Contains(body, "not a code of this gateway") || len(res.Cookies()) != 0 {
		t.Fatalf("wrong code: %d cookies %v %s", res.StatusCode, res.Cookies(), body)
	}
	link, _ := url.Parse(mintLink(t, ts.URL))
	form := "code=" + url.QueryEscape(link.Query().Get("code"))
	ctype := "application/x-www-form-urlencoded"
	for _, origin := range []string{"", "http://evil.example", "null", "https" + strings.TrimPrefix(ts.URL, "http")} {
		res, _ := do(t, "POST", ts.URL+"/login", map[string]string{"Content-Type": ctype, "Origin": origin}, form)
		if res.StatusCode != http.StatusForbidden || len(res.Cookies()) != 0 {
			t.Fatalf("form sign-in from origin %q: %d cookies %v, want 403 and none", origin, res.StatusCode, res.Cookies())
		}
	}
	res, _ = do(t, "POST", ts.URL+"/login", map[string]string{"Content-Type": ctype, "Origin": ts.URL}, form)
	if res.StatusCode != http.StatusSeeOther {
		t.Fatalf("form sign-in from the gateway's page: %d", res.StatusCode)
	}
	sessionCookie(t, res)
}

// Sign-out ends the session on the gateway: the cookie, kept by anyone, gets 401 from the API
// and a redirect from the UI.
func TestLoggedOutCookieIsRefused(t *testing.T) {
	ts, _ := server(t)
	cookie := signedIn(t, ts.URL)
	if res, _ := do(t, "POST", ts.URL+"/logout", map[string]string{"Cookie": cookie["Cookie"], "Origin": "http://evil.example"}, ""); res.StatusCode != http.StatusForbidden {
		t.Fatalf("sign-out from another origin: %d, want 403", res.StatusCode)
	}
	res, _ := do(t, "POST", ts.URL+"/logout", map[string]string{"Cookie": cookie["Cookie"], "Origin": ts.URL}, "")
	if out := sessionCookie(t, res); res.StatusCode != http.StatusSeeOther || out.MaxAge >= 0 || out.Value != "" {
		t.Fatalf("sign-out: %d cookie %+v, want the cookie cleared", res.StatusCode, out)
	}
	if res, body := do(t, "GET", ts.URL+"/api/v1/probe", cookie, ""); res.StatusCode != http.StatusUnauthorized || !strings.Contains(body, "openclaw ui") {
		t.Fatalf("API with the signed-out cookie: %d %s, want 401 saying how to sign in", res.StatusCode, body)
	}
	if res, _ := do(t, "GET", ts.URL+"/", cookie, ""); res.StatusCode != http.StatusSeeOther || res.Header.Get("Location") != "/login" {
		t.Fatalf("UI with the signed-out cookie: %d to %q, want 303 to /login", res.StatusCode, res.Header.Get("Location"))
	}
}

// The browser-session routes need the operator token: a session cannot mint itself another
// sign-in code (and so outlive its lifetime), nor list or end sessions.
func TestSessionRoutesNeedTheBearerToken(t *testing.T) {
	ts, _ := server(t)
	cookie := signedIn(t, ts.URL)
	for _, c := range []struct{ method, path string }{
		{"POST", "/api/v1/ui/signin-codes"}, {"GET", "/api/v1/ui/sessions"}, {"DELETE", "/api/v1/ui/sessions/bs_x"},
	} {
		res, body := do(t, c.method, ts.URL+c.path, map[string]string{"Cookie": cookie["Cookie"], "Origin": ts.URL}, "")
		if res.StatusCode != http.StatusForbidden || !strings.Contains(body, "bearer-required") {
			t.Fatalf("%s %s with the cookie: %d %s", c.method, c.path, res.StatusCode, body)
		}
	}
	c := api.NewClient(ts.URL, token)
	list, err := c.BrowserSessions(context.Background())
	if err != nil || len(list) != 1 || !list[0].Active() {
		t.Fatalf("sessions: %+v %v", list, err)
	}
	if s, err := c.RevokeBrowserSession(context.Background(), list[0].ID); err != nil || s.State != auth.SessionRevoked {
		t.Fatalf("revoke: %+v %v", s, err)
	}
	if res, _ := do(t, "GET", ts.URL+"/api/v1/probe", cookie, ""); res.StatusCode != http.StatusUnauthorized {
		t.Fatalf("API with a revoked session's cookie: %d, want 401", res.StatusCode)
	}
}

// A request signed in by the cookie that changes state must come from the gateway's own pages,
// scheme included; the bearer token needs no Origin, and its scheme is case-insensitive.
func TestCookieStateChangesNeedSameOrigin(t *testing.T) {
	ts, _ := server(t)
	cookie := signedIn(t, ts.URL)["Cookie"]
	for _, c := range []struct {
		name string
		hdr  map[string]string
		want int
	}{
		{"cookie, no origin", map[string]string{"Cookie": cookie}, http.StatusForbidden},
		{"cookie, other origin", map[string]string{"Cookie": cookie, "Origin": "http://evil.example"}, http.StatusForbidden},
		{"cookie, other port", map[string]string{"Cookie": cookie, "Origin": "http://127.0.0.1:1"}, http.StatusForbidden},
		{"cookie, null origin", map[string]string{"Cookie": cookie, "Origin": "null"}, http.StatusForbidden},
		{"cookie, https origin over http", map[string]string{"Cookie": cookie, "Origin": "https" + strings.TrimPrefix(ts.URL, "http")}, http.StatusForbidden},
		{"cookie, same origin", map[string]string{"Cookie": cookie, "Origin": ts.URL}, http.StatusOK},
		{"bearer, no origin", map[string]string{"Authorization": "Bearer " + token}, http.StatusOK},
		{"lowercase bearer", map[string]string{"Authorization": "bearer " + token}, http.StatusOK},
		{"uppercase bearer", map[string]string{"Authorization": "BEARER " + token}, http.StatusOK},
		{"basic scheme", map[string]string{"Authorization": "Basic " + token}, http.StatusUnauthorized},
		{"unknown cookie, same origin", map[string]string{"Cookie": auth.CookieName + "=other", "Origin": ts.URL}, http.StatusUnauthorized},
		{"cookie and a wrong bearer", map[string]string{"Cookie": cookie, "Origin": ts.URL, "Authorization": "Bearer nope"}, http.StatusUnauthorized},
	} {
		t.Run(c.name, func(t *testing.T) {
			res, body := do(t, "POST", ts.URL+"/api/v1/probe", c.hdr, "")
			if res.StatusCode != c.want {
				t.Fatalf("POST: %d %s, want %d", res.StatusCode, body, c.want)
			}
			if c.want == http.StatusForbidden && !strings.Contains(body, "origin-mismatch") {
				t.Fatalf("refusal does not say why: %s", body)
			}
		})
	}
	// a WebSocket opened with the cookie from another origin is refused before the upgrade
	res, _ := do(t, "GET", ts.URL+"/api/v1/probe", map[string]string{"Cookie": cookie, "Origin": "http://evil.example",
		"Upgrade": "websocket", "Connection": "Upgrade"}, "")
	if res.StatusCode != http.StatusForbidden {
		t.Fatalf("cross-origin WebSocket with the cookie: %d, want 403", res.StatusCode)
	}
}

// Over plain HTTP the cookie is Secure only when a trusted proxy says the browser came over
// https; then the Origin check expects https too.
func TestSecureCookieBehindATrustedProxy(t *testing.T) {
	for _, c := range []struct {
		name    string
		proxies []string
		proto   string
		secure  bool
	}{
		{"no proxy configured", nil, "https", false},
		{"trusted proxy, https", []string{"127.0.0.0/8"}, "https", true},
		{"trusted proxy, http", []string{"127.0.0.0/8"}, "http", false},
		{"trusted proxy, no header", []string{"127.0.0.1"}, "", false},
		{"other proxy, https", []string{"10.0.0.0/8"}, "https", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			ts, _ := serve(t, signin(t, nil, c.proxies...))
			hdr := map[string]string{}
			if c.proto != "" {
				hdr["X-Forwarded-Proto"] = c.proto
			}
			res, _ := do(t, "GET", mintLink(t, ts.URL), hdr, "")
			ck := sessionCookie(t, res)
			if ck.Secure != c.secure {
				t.Fatalf("cookie Secure = %v, want %v", ck.Secure, c.secure)
			}
			hdr["Cookie"] = ck.Name + "=" + ck.Value
			want := map[bool]string{true: "https", false: "http"}
			for scheme, ok := range map[string]bool{want[c.secure]: true, want[!c.secure]: false} {
				hdr["Origin"] = scheme + strings.TrimPrefix(ts.URL, "http")
				res, _ := do(t, "POST", ts.URL+"/api/v1/probe", hdr, "")
				if (res.StatusCode == http.StatusOK) != ok {
					t.Fatalf("POST with Origin %s: %d, want allowed=%v", hdr["Origin"], res.StatusCode, ok)
				}
			}
		})
	}
}

func TestAssetsAndCaching(t *testing.T) {
	ts, h := server(t)
	names := h.AssetNames()
	js, css := names["app.js"], names["app.css"]
	if js == "" || css == "" || js == "/assets/app.js" {
		t.Fatalf("asset names %v: want hashed names", names)
	}
	res, body := do(t, "GET", ts.URL+js, nil, "")
	if res.StatusCode != 200 || !strings.Contains(res.Header.Get("Cache-Control"), "immutable") ||
		!strings.HasPrefix(res.Header.Get("Content-Type"), "text/javascript") || !strings.Contains(body, "use strict") {
		t.Fatalf("hashed asset: %d %v", res.StatusCode, res.Header)
	}
	for _, p := range []string{"/assets/", "/assets/app.js", "/assets/../ui.go", "/static/", "/templates/layout.html"} {
		res, body := do(t, "GET", ts.URL+p, nil, "")
		if res.StatusCode == 200 || strings.Contains(body, "app.js") {
			t.Fatalf("GET %s: %d %q (no listings, no unhashed names)", p, res.StatusCode, body)
		}
	}
	c := signedIn(t, ts.URL)
	for _, p := range []string{"/", "/sessions/ses_x", "/sessions/ses_x/commits/0123", "/environments", "/environments/env_x", "/profiles", "/new", "/login"} {
		res, body := do(t, "GET", ts.URL+p, c, "")
		if res.StatusCode != 200 || res.Header.Get("Cache-Control") != "no-store" || !strings.Contains(body, js[len("/assets/"):]) && p != "/login" {
			t.Fatalf("page %s: %d cache %q", p, res.StatusCode, res.Header.Get("Cache-Control"))
		}
		if !strings.Contains(res.Header.Get("Content-Security-Policy"), "frame-ancestors 'none'") {
			t.Fatalf("page %s: CSP %q", p, res.Header.Get("Content-Security-Policy"))
		}
	}
	if res, _ := do(t, "GET", ts.URL+"/nope", c, ""); res.StatusCode != 404 {
		t.Fatalf("unknown page: %d", res.StatusCode)
	}
}

// The Host check (DNS rebinding) covers the UI's pages and sign-in too: a code sent through a
// foreign Host is not even looked at (it stays usable).
func TestUIHostCheck(t *testing.T) {
	ts, _ := server(t)
	link := mintLink(t, ts.URL)
	for _, p := range []string{"/", strings.TrimPrefix(link, ts.URL), "/login"} {
		res, _ := do(t, "GET", ts.URL+p, map[string]string{"Host": "rebind.example:80"}, "")
		if res.StatusCode != http.StatusMisdirectedRequest || len(res.Cookies()) != 0 {
			t.Fatalf("GET %s with a foreign Host: %d, want 421", p, res.StatusCode)
		}
	}
	if res, _ := do(t, "GET", link, nil, ""); res.StatusCode != http.StatusSeeOther {
		t.Fatalf("the code after a refused foreign Host: %d, want it still usable", res.StatusCode)
	}
}

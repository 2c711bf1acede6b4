package ui_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/labstack/echo/v4"

	"github.com/openclaw/cloudworkers/gateway/api"
	"github.com/openclaw/cloudworkers/ui"
)

const token = "tok-0123456789abcdef"

// server is the API server with the UI mounted, as the gateway builds it, plus one GET and one
// POST route standing in for the API.
func server(t *testing.T) (*httptest.Server, *ui.Handler) {
	t.Helper()
	h, err := ui.New(ui.Config{Token: token})
	if err != nil {
		t.Fatal(err)
	}
	srv := api.New(api.Config{Token: token, UI: h, Mount: []func(g *echo.Group){func(g *echo.Group) {
		g.GET("/probe", func(c echo.Context) error { return c.String(http.StatusOK, "read") })
		g.POST("/probe", func(c echo.Context) error { return c.String(http.StatusOK, "changed") })
	}}})
	ts := httptest.NewServer(srv)
	t.Cleanup(ts.Close)
	return ts, h
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
		if c.Name == api.SessionCookie {
			return c
		}
	}
	t.Fatalf("no %s cookie in %v", api.SessionCookie, res.Header["Set-Cookie"])
	return nil
}

func TestLoginLinkSetsCookieAndDropsToken(t *testing.T) {
	ts, _ := server(t)
	res, _ := do(t, "GET", ts.URL+"/login?token="+url.QueryEscape(token), nil, "")
	if res.StatusCode != http.StatusSeeOther || res.Header.Get("Location") != "/" {
		t.Fatalf("login link: %d to %q, want 303 to / (the token leaves the address bar)", res.StatusCode, res.Header.Get("Location"))
	}
	c := sessionCookie(t, res)
	if !c.HttpOnly || c.SameSite != http.SameSiteStrictMode || c.Path != "/" {
		t.Fatalf("cookie %+v: want HttpOnly, SameSite=Strict, Path=/", c)
	}
	if strings.Contains(c.Value, token) {
		t.Fatal("the cookie carries the token itself")
	}
	cookie := map[string]string{"Cookie": c.Name + "=" + c.Value}
	if res, body := do(t, "GET", ts.URL+"/", cookie, ""); res.StatusCode != 200 || !strings.Contains(body, "<h1>Sessions</h1>") {
		t.Fatalf("signed-in home: %d %s", res.StatusCode, body)
	}
	if res, body := do(t, "GET", ts.URL+"/api/v1/probe", cookie, ""); res.StatusCode != 200 || body != "read" {
		t.Fatalf("API read with the cookie: %d %s", res.StatusCode, body)
	}
	if res, _ := do(t, "GET", ts.URL+"/", nil, ""); res.StatusCode != http.StatusSeeOther || res.Header.Get("Location") != "/login" {
		t.Fatalf("home without the cookie: %d to %q, want 303 to /login", res.StatusCode, res.Header.Get("Location"))
	}
	if res, _ := do(t, "GET", ts.URL+"/", map[string]string{"Cookie": api.SessionCookie + "=" + token}, ""); res.StatusCode != http.StatusSeeOther {
		t.Fatalf("home with the raw token as cookie: %d, want a redirect to sign in", res.StatusCode)
	}
}

func TestLoginFormAndBadToken(t *testing.T) {
	ts, _ := server(t)
	res, body := do(t, "GET", ts.URL+"/login", nil, "")
	if res.StatusCode != 200 || !strings.Contains(body, `<label for="token">Token</label>`) || !strings.Contains(body, `id="token"`) {
		t.Fatalf("sign-in form: %d %s", res.StatusCode, body)
	}
	res, body = do(t, "GET", ts.URL+"/login?token=wrong", nil, "")
	if res.StatusCode != http.StatusUnauthorized || !strings.Contains(body, "not this gateway&#39;s token") || len(res.Cookies()) != 0 {
		t.Fatalf("wrong token: %d cookies %v %s", res.StatusCode, res.Cookies(), body)
	}
	form := "token=" + url.QueryEscape(token)
	ctype := "application/x-www-form-urlencoded"
	for _, origin := range []string{"", "http://evil.example", "null"} {
		res, _ := do(t, "POST", ts.URL+"/login", map[string]string{"Content-Type": ctype, "Origin": origin}, form)
		if res.StatusCode != http.StatusForbidden || len(res.Cookies()) != 0 {
			t.Fatalf("form sign-in from origin %q: %d cookies %v, want 403 and none", origin, res.StatusCode, res.Cookies())
		}
	}
	res, _ = do(t, "POST", ts.URL+"/login", map[string]string{"Content-Type": ctype, "Origin": ts.URL}, form)
	if res.StatusCode != http.StatusSeeOther {
		t.Fatalf("form sign-in from the gateway's page: %d", res.StatusCode)
	}
	c := sessionCookie(t, res)
	res, _ = do(t, "POST", ts.URL+"/logout", map[string]string{"Cookie": c.Name + "=" + c.Value, "Origin": ts.URL}, "")
	if out := sessionCookie(t, res); res.StatusCode != http.StatusSeeOther || out.MaxAge >= 0 || out.Value != "" {
		t.Fatalf("sign-out: %d cookie %+v, want the cookie cleared", res.StatusCode, out)
	}
	if res, _ := do(t, "POST", ts.URL+"/logout", map[string]string{"Cookie": c.Name + "=" + c.Value, "Origin": "http://evil.example"}, ""); res.StatusCode != http.StatusForbidden {
		t.Fatalf("sign-out from another origin: %d, want 403", res.StatusCode)
	}
}

// A request signed in by the cookie that changes state must come from the gateway's own pages;
// the bearer token needs no Origin.
func TestCookieStateChangesNeedSameOrigin(t *testing.T) {
	ts, _ := server(t)
	cookie := api.SessionCookie + "=" + api.SessionValue(token)
	for _, c := range []struct {
		name string
		hdr  map[string]string
		want int
	}{
		{"cookie, no origin", map[string]string{"Cookie": cookie}, http.StatusForbidden},
		{"cookie, other origin", map[string]string{"Cookie": cookie, "Origin": "http://evil.example"}, http.StatusForbidden},
		{"cookie, other port", map[string]string{"Cookie": cookie, "Origin": "http://127.0.0.1:1"}, http.StatusForbidden},
		{"cookie, null origin", map[string]string{"Cookie": cookie, "Origin": "null"}, http.StatusForbidden},
		{"cookie, same origin", map[string]string{"Cookie": cookie, "Origin": ts.URL}, http.StatusOK},
		{"bearer, no origin", map[string]string{"Authorization": "Bearer " + token}, http.StatusOK},
		{"wrong cookie, same origin", map[string]string{"Cookie": api.SessionCookie + "=" + api.SessionValue("other"), "Origin": ts.URL}, http.StatusUnauthorized},
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
	c := map[string]string{"Cookie": api.SessionCookie + "=" + api.SessionValue(token)}
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

// The Host check (DNS rebinding) covers the UI's pages and sign-in too.
func TestUIHostCheck(t *testing.T) {
	ts, _ := server(t)
	for _, p := range []string{"/", "/login?token=" + token, "/login"} {
		res, _ := do(t, "GET", ts.URL+p, map[string]string{"Host": "rebind.example:80"}, "")
		if res.StatusCode != http.StatusMisdirectedRequest || len(res.Cookies()) != 0 {
			t.Fatalf("GET %s with a foreign Host: %d, want 421", p, res.StatusCode)
		}
	}
}

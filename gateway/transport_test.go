package gateway

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/openclaw/cloudworkers/gateway/api"
	"github.com/openclaw/cloudworkers/gateway/auth"
	"github.com/openclaw/cloudworkers/gateway/occ"
	"github.com/openclaw/cloudworkers/gateway/store"
	"github.com/openclaw/cloudworkers/internal/testrig/testenv"
	"github.com/openclaw/cloudworkers/providers"
	"github.com/openclaw/cloudworkers/providers/fake"
)

// selfSigned writes a new self-signed certificate for 127.0.0.1 and its key to dir and returns
// their paths and the certificate.
func selfSigned(t *testing.T, dir, name string) (certFile, keyFile string, cert *x509.Certificate) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		t.Fatal(err)
	}
	cert, err = x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile, cert
}

// logLines is a slog handler keeping every record.
type logLines struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (l *logLines) Enabled(context.Context, slog.Level) bool { return true }
func (l *logLines) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.recs = append(l.recs, r.Clone())
	return nil
}
func (l *logLines) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logLines) WithGroup(string) slog.Handler      { return l }

func (l *logLines) warnings(containing string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, r := range l.recs {
		if r.Level == slog.LevelWarn && strings.Contains(r.Message, containing) {
			n++
		}
	}
	return n
}

// runGateway runs the real gateway in this process with cfg (DataDir and Listen default to a
// temp dir and a loopback port) until the returned stop is called (or the test ends); it returns
// the bound address and the operator token.
func runGateway(t *testing.T, cfg Config, log *slog.Logger) (addr, token string, stop func()) {
	t.Helper()
	if cfg.DataDir == "" {
		cfg.DataDir = t.TempDir()
	}
	if cfg.Listen == "" {
		cfg.Listen = "127.0.0.1:0"
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	addrc := make(chan string, 1)
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, cfg, Deps{
			Providers: func(*store.DB, string, *slog.Logger) (providers.Registry, error) {
				return providers.Registry{"fake": fake.New()}, nil
			},
			OnReady: func(addr string) { addrc <- addr },
			Log:     log,
		})
	}()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("gateway run: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	select {
	case addr = <-addrc:
	case err := <-done:
		t.Fatalf("gateway stopped: %v", err)
	case <-testenv.Context(t, 30*time.Second).Done():
		t.Fatal("gateway did not start")
	}
	tok, err := os.ReadFile(filepath.Join(cfg.DataDir, "gateway.token"))
	if err != nil {
		t.Fatal(err)
	}
	return addr, strings.TrimSpace(string(tok)), stop
}

var noRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }

// get sends a GET with the headers and returns the answer (body read and closed).
func get(t *testing.T, c *http.Client, u string, hdr map[string]string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, u, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	res, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res, string(b)
}

// bearer adds "Authorization: <scheme> <token>" to each request.
type bearer struct {
	scheme, token string
	next          http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", b.scheme+" "+b.token)
	return b.next.RoundTrip(r)
}

// A gateway with tls.cert and tls.key serves the API, the Control UI and /mcp over TLS: the
// sign-in cookie is Secure, the Origin check expects https, and plain HTTP is refused.
func TestTLSGatewayServesTheUIWithASecureCookie(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile, cert := selfSigned(t, dir, "gw")
	addr, tok, _ := runGateway(t, Config{TLS: TLSConfig{Cert: certFile, Key: keyFile}}, nil)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}
	t.Cleanup(tr.CloseIdleConnections)
	hc := &http.Client{Transport: tr, CheckRedirect: noRedirect, Timeout: 30 * time.Second}
	base := "https://" + addr
	ctx := testenv.Context(t, 30*time.Second)

	c := api.NewClient(base, tok)
	c.HTTP = hc
	info, err := c.Gateway(ctx)
	if err != nil || info.Transport == nil || !info.Transport.TLS {
		t.Fatalf("gateway over TLS: %+v %v", info.Transport, err)
	}
	code, err := c.MintSignInCode(ctx)
	if err != nil {
		t.Fatal(err)
	}
	res, _ := get(t, hc, base+code.Path, nil)
	var ck *http.Cookie
	for _, k := range res.Cookies() {
		if k.Name == auth.CookieName {
			ck = k
		}
	}
	if res.StatusCode != http.StatusSeeOther || ck == nil || !ck.Secure || !ck.HttpOnly || ck.SameSite != http.SameSiteStrictMode {
		t.Fatalf("sign-in over TLS: %d cookie %+v, want 303 and a Secure, HttpOnly, SameSite=Strict cookie", res.StatusCode, ck)
	}
	cookie := map[string]string{"Cookie": ck.Name + "=" + ck.Value}
	if res, body := get(t, hc, base+"/", cookie); res.StatusCode != http.StatusOK || !strings.Contains(body, "<h1>Sessions</h1>") {
		t.Fatalf("the UI over TLS: %d %.200s", res.StatusCode, body)
	}
	for origin, want := range map[string]int{base: http.StatusNotFound, "http://" + addr: http.StatusForbidden} {
		// a state change with the cookie: the Origin must be https://host (404: no such route, past auth)
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/api/v1/nothing", nil)
		req.Header.Set("Cookie", cookie["Cookie"])
		req.Header.Set("Origin", origin)
		res, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != want {
			t.Fatalf("POST with the cookie from Origin %s: %d, want %d", origin, res.StatusCode, want)
		}
	}
	// plain HTTP on the TLS port is not served
	if res, _ := get(t, &http.Client{Timeout: 10 * time.Second}, "http://"+addr+"/api/v1/gateway", map[string]string{"Authorization": "Bearer " + tok}); res.StatusCode == http.StatusOK {
		t.Fatal("plain HTTP on the TLS listener answered 200")
	}
	// /mcp over TLS, whose tools call the API through the gateway's pinned loopback client
	mc := &http.Client{Transport: bearer{scheme: "bearer", token: tok, next: tr}}
	cs, err := sdk.NewClient(&sdk.Implementation{Name: "tls-test", Version: "test"}, nil).Connect(ctx,
		&sdk.StreamableClientTransport{Endpoint: base + "/mcp", HTTPClient: mc, MaxRetries: -1}, nil)
	if err != nil {
		t.Fatalf("connect to /mcp over TLS: %v", err)
	}
	defer cs.Close()
	r, err := cs.CallTool(ctx, &sdk.CallToolParams{Name: "list_sessions", Arguments: map[string]any{}})
	if err != nil || r.IsError {
		t.Fatalf("list_sessions through /mcp over TLS: %v %+v", err, r)
	}
}

// The bearer scheme is case-insensitive on every door: /api/v1, /mcp and /occ/v1.
func TestLowercaseBearerOnEveryDoor(t *testing.T) {
	dataDir := t.TempDir()
	addr, tok, _ := runGateway(t, Config{DataDir: dataDir}, nil)
	occTok, err := occ.ReadToken(dataDir)
	if err != nil {
		t.Fatal(err)
	}
	hc := &http.Client{Timeout: 30 * time.Second}
	for _, scheme := range []string{"bearer", "BEARER", "Bearer"} {
		t.Run(scheme, func(t *testing.T) {
			if res, body := get(t, hc, "http://"+addr+"/api/v1/gateway", map[string]string{"Authorization": scheme + " " + tok}); res.StatusCode != http.StatusOK {
				t.Fatalf("/api/v1 with %q: %d %s", scheme, res.StatusCode, body)
			}
			if res, body := get(t, hc, "http://"+addr+"/occ/v1/compute", map[string]string{"Authorization": scheme + " " + occTok}); res.StatusCode != http.StatusOK {
				t.Fatalf("/occ/v1 with %q: %d %s", scheme, res.StatusCode, body)
			}
			ctx := testenv.Context(t, 30*time.Second)
			mc := &http.Client{Transport: bearer{scheme: scheme, token: tok, next: http.DefaultTransport}}
			cs, err := sdk.NewClient(&sdk.Implementation{Name: "bearer-test", Version: "test"}, nil).Connect(ctx,
				&sdk.StreamableClientTransport{Endpoint: "http://" + addr + "/mcp", HTTPClient: mc, MaxRetries: -1}, nil)
			if err != nil {
				t.Fatalf("/mcp with %q: %v", scheme, err)
			}
			_ = cs.Close()
		})
	}
	// and a wrong token stays refused, whatever the scheme's case
	for _, p := range []string{"/api/v1/gateway", "/occ/v1/compute"} {
		if res, _ := get(t, hc, "http://"+addr+p, map[string]string{"Authorization": "bearer wrong"}); res.StatusCode != http.StatusUnauthorized {
			t.Fatalf("%s with a wrong token: %d, want 401", p, res.StatusCode)
		}
	}
}

// Refused authentications at every door (/api/v1, the UI's sign-in, /mcp, /occ/v1) go to one
// log aggregated per source: 200 refusals from one address write one line with why and one
// summary counting all 200 (written when the gateway stops, at the latest).
func TestRefusalsOfEveryDoorShareOneLog(t *testing.T) {
	var h logLines
	addr, _, stop := runGateway(t, Config{}, slog.New(&h))
	hc := &http.Client{Timeout: 30 * time.Second}
	const n = 200
	for i := range n {
		var req *http.Request
		switch i % 4 {
		case 0:
			req, _ = http.NewRequest(http.MethodGet, "http://"+addr+"/api/v1/gateway", nil)
			req.Header.Set("Authorization", "bearer wrong")
		case 1:
			req, _ = http.NewRequest(http.MethodGet, "http://"+addr+"/login?code=wrong", nil)
		case 2:
			req, _ = http.NewRequest(http.MethodPost, "http://"+addr+"/mcp", strings.NewReader(`{}`))
			req.Header.Set("Authorization", "Bearer wrong")
		case 3:
			req, _ = http.NewRequest(http.MethodGet, "http://"+addr+"/occ/v1/compute", nil)
		}
		res, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != http.StatusUnauthorized {
			t.Fatalf("refusal %d (%s): %d, want 401", i, req.URL.Path, res.StatusCode)
		}
	}
	stop()
	h.mu.Lock()
	defer h.mu.Unlock()
	first, summaries := 0, 0
	var refused int64
	for _, r := range h.recs {
		switch r.Message {
		case "authentication failed":
			first++
		case "authentication failed repeatedly":
			summaries++
			r.Attrs(func(a slog.Attr) bool {
				if a.Key == "refused" {
					refused = a.Value.Int64()
				}
				return true
			})
		}
	}
	if first != 1 || summaries != 1 || refused != n {
		t.Fatalf("%d first lines and %d summaries counting %d refusals, want 1, 1 and %d", first, summaries, refused, n)
	}
}

// Rotating the operator token (a new gateway.token, then a restart) ends every browser session.
func TestTokenRotationEndsBrowserSessions(t *testing.T) {
	dataDir := t.TempDir()
	addr, tok, stop := runGateway(t, Config{DataDir: dataDir}, nil)
	ctx := testenv.Context(t, 30*time.Second)
	hc := &http.Client{CheckRedirect: noRedirect, Timeout: 30 * time.Second}
	code, err := api.NewClient(addr, tok).MintSignInCode(ctx)
	if err != nil {
		t.Fatal(err)
	}
	res, _ := get(t, hc, "http://"+addr+code.Path, nil)
	if len(res.Cookies()) != 1 {
		t.Fatalf("sign-in: %d %v", res.StatusCode, res.Cookies())
	}
	cookie := map[string]string{"Cookie": res.Cookies()[0].Name + "=" + res.Cookies()[0].Value}
	if res, _ := get(t, hc, "http://"+addr+"/api/v1/gateway", cookie); res.StatusCode != http.StatusOK {
		t.Fatalf("the cookie before rotation: %d", res.StatusCode)
	}
	stop()

	rotated := tok[:len(tok)-4] + "abcd"
	if rotated == tok {
		rotated = tok[:len(tok)-4] + "efgh"
	}
	if err := os.WriteFile(filepath.Join(dataDir, "gateway.token"), []byte(rotated+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	addr, tok2, _ := runGateway(t, Config{DataDir: dataDir}, nil)
	if tok2 != rotated {
		t.Fatalf("the restarted gateway's token: %q, want the rotated one", tok2)
	}
	if res, _ := get(t, hc, "http://"+addr+"/api/v1/gateway", cookie); res.StatusCode != http.StatusUnauthorized {
		t.Fatalf("the cookie after rotation: %d, want 401", res.StatusCode)
	}
	list, err := api.NewClient(addr, tok2).BrowserSessions(ctx)
	if err != nil || len(list) != 1 || list[0].State != auth.SessionRevoked || list[0].RevokedReason != "operator token rotated" {
		t.Fatalf("browser sessions after rotation: %+v %v", list, err)
	}
}

// The certificate is read again on reload (SIGHUP); a bad file keeps the one in use.
func TestCertificateReload(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile, first := selfSigned(t, dir, "one")
	c, err := loadCertificate(TLSConfig{Cert: certFile, Key: keyFile})
	if err != nil {
		t.Fatal(err)
	}
	serving := func() *x509.Certificate {
		got, err := c.get(nil)
		if err != nil {
			t.Fatal(err)
		}
		return got.Leaf
	}
	if !serving().Equal(first) {
		t.Fatal("not serving the loaded certificate")
	}
	newCert, newKey, second := selfSigned(t, dir, "two")
	for _, f := range [][2]string{{newCert, certFile}, {newKey, keyFile}} {
		if err := os.Rename(f[0], f[1]); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.reload(); err != nil || !serving().Equal(second) {
		t.Fatalf("reload: %v; serving the new certificate: %v", err, serving().Equal(second))
	}
	if err := os.WriteFile(certFile, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	var fe *providers.FieldError
	if err := c.reload(); !errors.As(err, &fe) || !serving().Equal(second) {
		t.Fatalf("reload of a bad file: %v; still serving the last good certificate: %v", err, serving().Equal(second))
	}
	if _, err := loadCertificate(TLSConfig{Cert: filepath.Join(dir, "missing.crt"), Key: keyFile}); err == nil || !strings.Contains(err.Error(), "tls") {
		t.Fatalf("a missing certificate at start: %v, want an error naming tls", err)
	}
}

// A listener on a non-loopback address without TLS is logged at WARN at start (doctor's side is
// in cmd/openclaw).
func TestCleartextListenerWarns(t *testing.T) {
	for _, c := range []struct {
		listen   string
		tls      bool
		loopback bool
	}{
		{"127.0.0.1:7420", false, true},
		{"[::1]:7420", false, true},
		{"localhost:7420", false, true},
		{"0.0.0.0:7420", false, false},
		{":7420", false, false},
		{"[::]:7420", false, false},
		{"192.0.2.1:7420", false, false},
		{"gw.example:7420", false, false},
		{"0.0.0.0:7420", true, false},
	} {
		t.Run(c.listen, func(t *testing.T) {
			if got := ListenIsLoopback(c.listen); got != c.loopback {
				t.Fatalf("ListenIsLoopback = %v, want %v", got, c.loopback)
			}
			var h logLines
			warnCleartext(slog.New(&h), c.listen, c.tls, 0)
			want := 0
			if !c.loopback && !c.tls {
				want = 1
			}
			if got := h.warnings("without TLS"); got != want {
				t.Fatalf("%d WARN lines, want %d", got, want)
			}
		})
	}
}

// The real gateway logs the WARN when it starts on a non-loopback address without TLS, and not
// on loopback (the non-loopback case binds 0.0.0.0 only long enough to start and stop).
func TestGatewayStartWarnsOfACleartextListener(t *testing.T) {
	for _, c := range []struct {
		listen string
		want   int
	}{{"127.0.0.1:0", 0}, {"0.0.0.0:0", 1}} {
		t.Run(c.listen, func(t *testing.T) {
			var h logLines
			_, _, stop := runGateway(t, Config{Listen: c.listen}, slog.New(&h))
			stop()
			if got := h.warnings("non-loopback address without TLS"); got != c.want {
				t.Fatalf("%d WARN lines of a cleartext listener, want %d", got, c.want)
			}
		})
	}
}

func TestTransportConfigIsChecked(t *testing.T) {
	for _, c := range []struct {
		name  string
		edit  func(*Config)
		field string
	}{
		{"cert without key", func(c *Config) { c.TLS.Cert = "a.crt" }, "tls.key"},
		{"key without cert", func(c *Config) { c.TLS.Key = "a.key" }, "tls.cert"},
		{"bad proxy", func(c *Config) { c.TrustedProxies = []string{"10.0.0.0/8", "proxy.example"} }, "trustedProxies"},
		{"idle too short", func(c *Config) { c.UI.SessionIdle = providers.Duration(time.Second) }, "ui.sessionIdle"},
		{"lifetime negative", func(c *Config) { c.UI.SessionLifetime = -1 }, "ui.sessionLifetime"},
		{"idle above lifetime", func(c *Config) { c.UI.SessionLifetime = providers.Duration(time.Hour) }, "ui.sessionIdle"},
		{"good", func(c *Config) {
			c.TLS = TLSConfig{Cert: "a.crt", Key: "a.key"}
			c.TrustedProxies = []string{"10.0.0.0/8", "192.0.2.1"}
			c.UI = UIConfig{SessionIdle: providers.Duration(time.Hour), SessionLifetime: providers.Duration(24 * time.Hour)}
		}, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			var cfg Config
			cfg.SetDefaults()
			c.edit(&cfg)
			err := cfg.Validate()
			var fe *providers.FieldError
			if c.field == "" {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			if !errors.As(err, &fe) || fe.Field != c.field {
				t.Fatalf("Validate: %v, want an error naming %s", err, c.field)
			}
		})
	}
}

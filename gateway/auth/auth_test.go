package auth_test

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openclaw/cloudworkers/gateway/auth"
	"github.com/openclaw/cloudworkers/gateway/store"
	"github.com/openclaw/cloudworkers/gateway/store/storetest"
	"github.com/openclaw/cloudworkers/internal/clock"
	"github.com/openclaw/cloudworkers/internal/testrig/testenv"
)

const token = "operator-token-0123456789abcdef0123"

func TestBearerSchemeIsCaseInsensitive(t *testing.T) {
	for _, c := range []struct {
		header string
		want   string
		ok     bool
	}{
		{"Bearer tok", "tok", true},
		{"bearer tok", "tok", true},
		{"BEARER tok", "tok", true},
		{"bEaReR tok", "tok", true},
		{"Bearer  tok", "tok", true},
		{"Bearer ", "", false},
		{"Bearer", "", false},
		{"Bearertok", "", false},
		{"Basic dG9rOg==", "", false},
		{"", "", false},
	} {
		t.Run(c.header, func(t *testing.T) {
			r := httptest.NewRequest("GET", "/", nil)
			if c.header != "" {
				r.Header.Set("Authorization", c.header)
			}
			got, ok := auth.Bearer(r)
			if got != c.want || ok != c.ok {
				t.Fatalf("Bearer(%q) = %q, %v; want %q, %v", c.header, got, ok, c.want, c.ok)
			}
			if auth.BearerIs(r, "tok") != c.ok {
				t.Fatalf("BearerIs(%q, tok) = %v, want %v", c.header, !c.ok, c.ok)
			}
		})
	}
	r := httptest.NewRequest("GET", "/", nil)
	r.Header.Set("Authorization", "Bearer ")
	if auth.BearerIs(r, "") {
		t.Fatal("an empty token matched an empty want")
	}
}

// lines is a slog handler that keeps every record (for counting log lines).
type lines struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (l *lines) Enabled(context.Context, slog.Level) bool { return true }
func (l *lines) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.recs = append(l.recs, r.Clone())
	return nil
}
func (l *lines) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *lines) WithGroup(string) slog.Handler      { return l }

func (l *lines) all() []slog.Record {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]slog.Record(nil), l.recs...)
}

func attr(r slog.Record, key string) slog.Value {
	var v slog.Value
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == key {
			v = a.Value
			return false
		}
		return true
	})
	return v
}

func refusedFrom(remote string) *http.Request {
	r := httptest.NewRequest("GET", "/api/v1/sessions", nil)
	r.RemoteAddr = remote
	return r
}

// 500 refused authentications from one source in a minute write two lines, the second saying
// how many were refused; a source of its own gets its own first line.
func TestRefusalsAreAggregatedPerSourceAndMinute(t *testing.T) {
	clk := clock.NewManual(time.Date(2026, 1, 2, 3, 4, 0, 0, time.UTC))
	var h lines
	l := auth.NewRefusals(slog.New(&h), clk)
	for i := range 500 {
		l.Refuse(refusedFrom(fmt.Sprintf("192.0.2.7:%d", 40000+i)), "api", "wrong bearer token") // a new port each time
		if i%100 == 0 {
			clk.Advance(time.Second)
		}
	}
	if got := len(h.all()); got != 1 {
		t.Fatalf("%d log lines during the minute, want 1 (the first refusal)", got)
	}
	first := h.all()[0]
	if first.Level != slog.LevelWarn || first.Message != "authentication failed" || attr(first, "reason").String() != "wrong bearer token" {
		t.Fatalf("first line: %s %q reason %q", first.Level, first.Message, attr(first, "reason"))
	}
	l.Flush() // the minute has not ended: nothing to summarise yet
	if got := len(h.all()); got != 1 {
		t.Fatalf("%d log lines after an early flush, want 1", got)
	}
	clk.Advance(time.Minute)
	l.Flush()
	recs := h.all()
	if len(recs) != 2 {
		t.Fatalf("%d log lines after the minute, want 2", len(recs))
	}
	sum := recs[1]
	if sum.Level != slog.LevelWarn || sum.Message != "authentication failed repeatedly" || attr(sum, "refused").Int64() != 500 ||
		attr(sum, "source").String() != "192.0.2.7" {
		t.Fatalf("summary: %s %q refused=%v source=%v", sum.Level, sum.Message, attr(sum, "refused"), attr(sum, "source"))
	}
	// a new minute from the same source logs its first refusal again; another source its own
	l.Refuse(refusedFrom("192.0.2.7:1"), "mcp", "no credentials")
	l.Refuse(refusedFrom("198.51.100.1:1"), "occ", "wrong bearer token")
	l.Flush()
	if got := len(h.all()); got != 4 {
		t.Fatalf("%d log lines, want 4 (one more per source)", got)
	}
	// a single refusal in a window has no summary
	clk.Advance(time.Minute)
	l.Flush()
	if got := len(h.all()); got != 4 {
		t.Fatalf("%d log lines after single refusals' windows ended, want still 4", got)
	}
}

// Many sources at once: past MaxRefusalSources they are counted together, so the lines of a
// minute stay bounded whatever the number of sources.
func TestRefusalsFromManySourcesStayBounded(t *testing.T) {
	clk := clock.NewManual(time.Date(2026, 1, 2, 3, 4, 0, 0, time.UTC))
	var h lines
	l := auth.NewRefusals(slog.New(&h), clk)
	n := auth.MaxRefusalSources + 3000
	for i := range n {
		a := netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)})
		l.Refuse(refusedFrom(netip.AddrPortFrom(a, 1).String()), "api", "no credentials")
	}
	clk.Advance(time.Minute)
	l.Flush()
	recs := h.all()
	if max := auth.MaxRefusalSources + 2; len(recs) > max {
		t.Fatalf("%d log lines for %d sources, want at most %d", len(recs), n, max)
	}
	last := recs[len(recs)-1]
	if attr(last, "source").String() != auth.OtherSources || attr(last, "refused").Int64() != 3000 {
		t.Fatalf("the sources past the bound: %q refused=%v, want %s refused=3000", last.Message, attr(last, "refused"), auth.OtherSources)
	}
}

func TestRefusalsRunFlushesAtTheEnd(t *testing.T) {
	clk := clock.NewManual(time.Date(2026, 1, 2, 3, 4, 0, 0, time.UTC))
	var h lines
	l := auth.NewRefusals(slog.New(&h), clk)
	ctx, cancel := context.WithCancel(testenv.Context(t, 10*time.Second))
	done := make(chan struct{})
	go func() { defer close(done); l.Run(ctx) }()
	for range 3 {
		l.Refuse(refusedFrom("192.0.2.1:9"), "api", "no credentials")
	}
	cancel()
	<-done
	if recs := h.all(); len(recs) != 2 || attr(recs[1], "refused").Int64() != 3 {
		t.Fatalf("lines after Run ended: %d, want the first and a summary of 3", len(recs))
	}
}

func openBrowser(t *testing.T, db *store.DB, tok string, clk clock.Clock, proxies ...netip.Prefix) *auth.Browser {
	t.Helper()
	b, err := auth.OpenBrowser(testenv.Context(t, 10*time.Second), auth.BrowserConfig{DB: db, Token: tok, Clock: clk, TrustedProxies: proxies})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestSignInCodeWorksOnceAndExpires(t *testing.T) {
	ctx := testenv.Context(t, 10*time.Second)
	clk := clock.NewManual(time.Date(2026, 1, 2, 3, 4, 0, 0, time.UTC))
	db := storetest.Open(t)
	b := openBrowser(t, db, token, clk)

	for _, c := range []struct {
		name    string
		use     func(code string) (string, error)
		wantErr string
	}{
		{"fresh", func(code string) (string, error) { s, _, err := b.Redeem(ctx, code, "", ""); return s, err }, ""},
		{"used twice", func(code string) (string, error) {
			if _, _, err := b.Redeem(ctx, code, "", ""); err != nil {
				return "", err
			}
			s, _, err := b.Redeem(ctx, code, "", "")
			return s, err
		}, "already used"},
		{"expired", func(code string) (string, error) {
			clk.Advance(auth.CodeLifetime)
			s, _, err := b.Redeem(ctx, code, "", "")
			return s, err
		}, "expired"},
		{"just before it expires", func(code string) (string, error) {
			clk.Advance(auth.CodeLifetime - time.Millisecond)
			s, _, err := b.Redeem(ctx, code, "", "")
			return s, err
		}, ""},
		{"unknown", func(code string) (string, error) {
			s, _, err := b.Redeem(ctx, code+"x", "", "")
			return s, err
		}, "not a code of this gateway"},
	} {
		t.Run(c.name, func(t *testing.T) {
			code, err := b.MintCode(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if len(code.Code) < 22 { // base64 of at least 128 bits
				t.Fatalf("code %q is shorter than 128 bits", code.Code)
			}
			sec, err := c.use(code.Code)
			if c.wantErr == "" {
				if err != nil || sec == "" {
					t.Fatalf("redeem: %q %v", sec, err)
				}
				if _, err := b.Lookup(ctx, sec); err != nil {
					t.Fatalf("the new session: %v", err)
				}
				return
			}
			if !errors.Is(err, auth.ErrCodeRefused) || !strings.Contains(err.Error(), c.wantErr) || !strings.Contains(err.Error(), "openclaw ui") {
				t.Fatalf("redeem: %v, want %v saying %q and how to get another", err, auth.ErrCodeRefused, c.wantErr)
			}
		})
	}
	// only hashes are stored
	code, err := b.MintCode(ctx)
	if err != nil {
		t.Fatal(err)
	}
	sec, _, err := b.Redeem(ctx, code.Code, "", "")
	if err != nil {
		t.Fatal(err)
	}
	var n int
	if err := db.R.QueryRowContext(ctx, `SELECT (SELECT COUNT(*) FROM signin_codes WHERE hash = ?) + (SELECT COUNT(*) FROM browser_sessions WHERE secret_hash = ? OR id = ?)`,
		code.Code, sec, sec).Scan(&n); err != nil || n != 0 {
		t.Fatalf("a code or a cookie stored as it is: %d rows (%v)", n, err)
	}
}

func TestUnusedCodesAreBounded(t *testing.T) {
	ctx := testenv.Context(t, 10*time.Second)
	clk := clock.NewManual(time.Date(2026, 1, 2, 3, 4, 0, 0, time.UTC))
	b := openBrowser(t, storetest.Open(t), token, clk)
	for range auth.MaxLiveCodes {
		if _, err := b.MintCode(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := b.MintCode(ctx); !errors.Is(err, auth.ErrTooManyCodes) {
		t.Fatalf("code %d: %v, want %v", auth.MaxLiveCodes+1, err, auth.ErrTooManyCodes)
	}
	clk.Advance(auth.CodeLifetime)
	if _, err := b.MintCode(ctx); err != nil {
		t.Fatalf("after the unused codes expired: %v", err)
	}
}

func signIn(t *testing.T, b *auth.Browser) (string, auth.Session) {
	t.Helper()
	ctx := testenv.Context(t, 10*time.Second)
	code, err := b.MintCode(ctx)
	if err != nil {
		t.Fatal(err)
	}
	sec, s, err := b.Redeem(ctx, code.Code, "192.0.2.1", "test")
	if err != nil {
		t.Fatal(err)
	}
	return sec, s
}

// A session ends after the idle lifetime without a request, after the absolute lifetime
// however active, when revoked, and when the operator token changes.
func TestBrowserSessionLifetimes(t *testing.T) {
	for _, c := range []struct {
		name  string
		end   func(t *testing.T, b *auth.Browser, clk *clock.Manual, db *store.DB, s auth.Session) *auth.Browser
		state string
	}{
		{"active while used", func(_ *testing.T, b *auth.Browser, clk *clock.Manual, _ *store.DB, _ auth.Session) *auth.Browser {
			clk.Advance(auth.DefaultSessionIdle - time.Minute)
			return b
		}, auth.SessionActive},
		{"idle", func(_ *testing.T, b *auth.Browser, clk *clock.Manual, _ *store.DB, _ auth.Session) *auth.Browser {
			clk.Advance(auth.DefaultSessionIdle)
			return b
		}, auth.SessionIdle},
		{"absolute lifetime", func(_ *testing.T, b *auth.Browser, clk *clock.Manual, _ *store.DB, s auth.Session) *auth.Browser {
			clk.Advance(s.ExpiresAt.Sub(clk.Now()))
			return b
		}, auth.SessionExpired},
		{"revoked", func(t *testing.T, b *auth.Browser, _ *clock.Manual, _ *store.DB, s auth.Session) *auth.Browser {
			if _, err := b.Revoke(testenv.Context(t, 10*time.Second), s.ID, "test"); err != nil {
				t.Fatal(err)
			}
			return b
		}, auth.SessionRevoked},
		{"token rotated", func(t *testing.T, _ *auth.Browser, clk *clock.Manual, db *store.DB, _ auth.Session) *auth.Browser {
			return openBrowser(t, db, token+"-rotated", clk)
		}, auth.SessionRevoked},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx := testenv.Context(t, 10*time.Second)
			clk := clock.NewManual(time.Date(2026, 1, 2, 3, 4, 0, 0, time.UTC))
			db := storetest.Open(t)
			b := openBrowser(t, db, token, clk)
			sec, s := signIn(t, b)
			if c.state == auth.SessionExpired {
				// a request every 6 hours: never idle, so that only the absolute lifetime ends it
				for clk.Now().Add(6 * time.Hour).Before(s.ExpiresAt) {
					clk.Advance(6 * time.Hour)
					if _, err := b.Lookup(ctx, sec); err != nil {
						t.Fatalf("a used session ended early at %s: %v", clk.Now(), err)
					}
				}
			}
			b = c.end(t, b, clk, db, s)
			_, err := b.Lookup(ctx, sec)
			if c.state == auth.SessionActive {
				if err != nil {
					t.Fatalf("lookup: %v", err)
				}
			} else if !errors.Is(err, auth.ErrNoSession) {
				t.Fatalf("lookup of a session that should be %s: %v", c.state, err)
			}
			list, err := b.List(ctx)
			if err != nil || len(list) != 1 || list[0].ID != s.ID || list[0].State != c.state {
				t.Fatalf("list: %+v %v, want %s %s", list, err, s.ID, c.state)
			}
		})
	}
}

func TestLiveSessionsAreBounded(t *testing.T) {
	clk := clock.NewManual(time.Date(2026, 1, 2, 3, 4, 0, 0, time.UTC))
	b := openBrowser(t, storetest.Open(t), token, clk)
	first, _ := signIn(t, b)
	for range auth.MaxLiveSessions {
		clk.Advance(time.Second)
		signIn(t, b)
	}
	ctx := testenv.Context(t, 10*time.Second)
	if _, err := b.Lookup(ctx, first); !errors.Is(err, auth.ErrNoSession) {
		t.Fatalf("the session idle longest past %d sessions: %v, want ended", auth.MaxLiveSessions, err)
	}
	list, err := b.List(ctx)
	live := 0
	for _, s := range list {
		if s.Active() {
			live++
		}
	}
	if err != nil || live != auth.MaxLiveSessions {
		t.Fatalf("%d live sessions (%v), want %d", live, err, auth.MaxLiveSessions)
	}
}

// Secure and the Origin check follow the scheme the request came by: TLS, or a trusted proxy
// that says X-Forwarded-Proto: https.
func TestSchemeOfARequest(t *testing.T) {
	proxies, err := auth.ParseProxies([]string{"10.0.0.0/8", "192.0.2.9"})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name   string
		remote string
		tls    bool
		proto  string
		origin string
		secure bool
		same   bool
	}{
		{"plain http", "192.0.2.1:5", false, "", "http://gw:7420", false, true},
		{"plain http, https origin", "192.0.2.1:5", false, "", "https://gw:7420", false, false},
		{"tls", "192.0.2.1:5", true, "", "https://gw:7420", true, true},
		{"tls, http origin", "192.0.2.1:5", true, "", "http://gw:7420", true, false},
		{"untrusted proxy says https", "192.0.2.1:5", false, "https", "https://gw:7420", false, false},
		{"trusted proxy says https", "10.1.2.3:5", false, "https", "https://gw:7420", true, true},
		{"trusted single address says https", "192.0.2.9:5", false, "HTTPS, http", "https://gw:7420", true, true},
		{"trusted proxy says http", "10.1.2.3:5", false, "http", "https://gw:7420", false, false},
		{"other host", "192.0.2.1:5", false, "", "http://evil.example", false, false},
		{"no origin", "192.0.2.1:5", false, "", "", false, false},
		{"null origin", "192.0.2.1:5", false, "", "null", false, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := httptest.NewRequest("POST", "http://gw:7420/logout", nil)
			r.RemoteAddr = c.remote
			if c.tls {
				r.TLS = &tls.ConnectionState{}
			}
			if c.proto != "" {
				r.Header.Set("X-Forwarded-Proto", c.proto)
			}
			if c.origin != "" {
				r.Header.Set("Origin", c.origin)
			}
			if got := auth.Secure(r, proxies); got != c.secure {
				t.Errorf("Secure = %v, want %v", got, c.secure)
			}
			if got := auth.SameOrigin(r, proxies); got != c.same {
				t.Errorf("SameOrigin = %v, want %v", got, c.same)
			}
		})
	}
	if _, err := auth.ParseProxies([]string{"10.0.0.0/33"}); err == nil {
		t.Fatal("a bad prefix was accepted")
	}
}

// A session used more often than its idle lifetime stays signed in, however short that is.
func TestShortIdleLifetimeKeepsAUsedSession(t *testing.T) {
	ctx := testenv.Context(t, 10*time.Second)
	clk := clock.NewManual(time.Date(2026, 1, 2, 3, 4, 0, 0, time.UTC))
	b, err := auth.OpenBrowser(ctx, auth.BrowserConfig{DB: storetest.Open(t), Token: token, Clock: clk, Idle: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	sec, _ := signIn(t, b)
	for i := range 10 {
		clk.Advance(40 * time.Second)
		if _, err := b.Lookup(ctx, sec); err != nil {
			t.Fatalf("request %d, 40s after the last: %v", i, err)
		}
	}
	clk.Advance(time.Minute)
	if _, err := b.Lookup(ctx, sec); !errors.Is(err, auth.ErrNoSession) {
		t.Fatalf("a minute without a request: %v, want the session ended", err)
	}
}

// Behind a trusted proxy the client is the rightmost X-Forwarded-For hop that is not a trusted
// proxy; from any other peer the header is the client's own say and ignored.
func TestClientAddr(t *testing.T) {
	proxies, err := auth.ParseProxies([]string{"10.0.0.0/8"})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, remote, xff, want string
	}{
		{"direct", "192.0.2.1:5", "", "192.0.2.1"},
		{"direct, forged header", "192.0.2.1:5", "198.51.100.7", "192.0.2.1"},
		{"trusted proxy", "10.0.0.2:5", "198.51.100.7", "198.51.100.7"},
		{"trusted proxy, client-forged left entries", "10.0.0.2:5", "203.0.113.9, 198.51.100.7", "198.51.100.7"},
		{"two trusted proxies", "10.0.0.2:5", "198.51.100.7, 10.0.0.3", "198.51.100.7"},
		{"trusted proxy, no header", "10.0.0.2:5", "", "10.0.0.2"},
		{"trusted proxy, garbage", "10.0.0.2:5", "nonsense", "10.0.0.2"},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := httptest.NewRequest("GET", "/", nil)
			r.RemoteAddr = c.remote
			if c.xff != "" {
				r.Header.Set("X-Forwarded-For", c.xff)
			}
			if got := auth.ClientAddr(r, proxies); got != c.want {
				t.Fatalf("ClientAddr = %q, want %q", got, c.want)
			}
		})
	}
}

package auth

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"

	"github.com/openclaw/cloudworkers/gateway/store"
)

// CookieName is the Control UI's session cookie: a browser session's random secret.
const CookieName = "openclaw_session"

// ParseProxies parses trusted proxies: CIDR prefixes or single addresses.
func ParseProxies(list []string) ([]netip.Prefix, error) {
	out := make([]netip.Prefix, 0, len(list))
	for _, s := range list {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			a, aerr := netip.ParseAddr(s)
			if aerr != nil {
				return nil, fmt.Errorf("%q is not a CIDR prefix (10.0.0.0/8) or an IP address", s)
			}
			p = netip.PrefixFrom(a, a.BitLen())
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

// Secure reports whether r reached the gateway over TLS: on a TLS listener, or from a trusted
// proxy whose first X-Forwarded-Proto is https.
func Secure(r *http.Request, trusted []netip.Prefix) bool {
	if r.TLS != nil {
		return true
	}
	if len(trusted) == 0 {
		return false
	}
	proto, _, _ := strings.Cut(r.Header.Get("X-Forwarded-Proto"), ",")
	if !strings.EqualFold(strings.TrimSpace(proto), "https") {
		return false
	}
	return isTrusted(peer(r), trusted)
}

// peer is r's TCP peer address (the zero Addr when RemoteAddr is not an address).
func peer(r *http.Request) netip.Addr {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	a, _ := netip.ParseAddr(host)
	return a.Unmap()
}

func isTrusted(a netip.Addr, trusted []netip.Prefix) bool {
	if !a.IsValid() {
		return false
	}
	for _, p := range trusted {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// ClientAddr is the address of the client r comes from: its TCP peer, or, when that is a trusted
// proxy, the rightmost address of X-Forwarded-For that is not a trusted proxy (the entries left of
// it are the client's own say, and not believed).
func ClientAddr(r *http.Request, trusted []netip.Prefix) string {
	a := peer(r)
	if !a.IsValid() {
		return r.RemoteAddr
	}
	if !isTrusted(a, trusted) {
		return a.String()
	}
	hops := strings.Split(strings.Join(r.Header.Values("X-Forwarded-For"), ","), ",")
	for i := len(hops) - 1; i >= 0; i-- {
		h, err := netip.ParseAddr(strings.TrimSpace(hops[i]))
		if err != nil {
			break
		}
		if h = h.Unmap(); !isTrusted(h, trusted) {
			return h.String()
		}
	}
	return a.String()
}

// SameOrigin reports whether r's Origin header names the gateway r was sent to, scheme
// included: https when r came over TLS (or a trusted proxy says so), else http. A request
// without Origin is not same-origin: browsers send it on every state-changing request and
// every WebSocket.
func SameOrigin(r *http.Request, trusted []netip.Prefix) bool {
	o := r.Header.Get("Origin")
	if o == "" || o == "null" {
		return false
	}
	u, err := url.Parse(o)
	if err != nil || u.Path != "" || u.User != nil || u.RawQuery != "" {
		return false
	}
	want := "http"
	if Secure(r, trusted) {
		want = "https"
	}
	return u.Scheme == want && strings.EqualFold(u.Host, r.Host)
}

// Secure reports whether r came over TLS (see the function Secure).
func (b *Browser) Secure(r *http.Request) bool { return Secure(r, b.cfg.TrustedProxies) }

// SameOrigin reports whether r's Origin is this gateway, scheme included (see the function).
func (b *Browser) SameOrigin(r *http.Request) bool { return SameOrigin(r, b.cfg.TrustedProxies) }

// Session returns the live browser session of r's cookie; without one it is ErrNoSession
// (http.ErrNoCookie when r has no cookie at all).
func (b *Browser) Session(r *http.Request) (Session, error) {
	ck, err := r.Cookie(CookieName)
	if err != nil {
		return Session{}, errors.Join(ErrNoSession, http.ErrNoCookie)
	}
	return b.Lookup(r.Context(), ck.Value)
}

// SignedIn reports whether r carries the cookie of a live browser session.
func (b *Browser) SignedIn(r *http.Request) bool {
	_, err := b.Session(r)
	return err == nil
}

// SignIn redeems a sign-in code for r's browser and sets the session cookie on w: HttpOnly,
// SameSite=Strict, Path=/, Secure when r came over TLS, for the session's absolute lifetime.
// A refused code is logged (Refusals) and returned.
func (b *Browser) SignIn(w http.ResponseWriter, r *http.Request, code string) error {
	sec, s, err := b.Redeem(r.Context(), strings.TrimSpace(code), ClientAddr(r, b.cfg.TrustedProxies), r.UserAgent())
	if err != nil {
		if errors.Is(err, ErrCodeRefused) {
			b.cfg.Refusals.Refuse(r, "ui", err.Error())
		}
		return err
	}
	http.SetCookie(w, &http.Cookie{Name: CookieName, Value: sec, Path: "/", Expires: s.ExpiresAt,
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: b.Secure(r)})
	return nil
}

// SignOut ends the browser session of r's cookie, if any, and clears the cookie on w.
func (b *Browser) SignOut(w http.ResponseWriter, r *http.Request) {
	if ck, err := r.Cookie(CookieName); err == nil && ck.Value != "" {
		if _, err := b.revokeSecret(r.Context(), ck.Value, "signed out"); err != nil && !errors.Is(err, store.ErrNotFound) {
			b.cfg.Log.Warn("sign out", "err", err)
		}
	}
	http.SetCookie(w, &http.Cookie{Name: CookieName, Value: "", Path: "/", MaxAge: -1,
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: b.Secure(r)})
}

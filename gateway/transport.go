package gateway

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/openclaw/cloudworkers/gateway/auth"
	"github.com/openclaw/cloudworkers/internal/shutdown"
	"github.com/openclaw/cloudworkers/providers"
)

// TLSConfig is the config's tls section: the API listener serves TLS with this certificate and
// key (PEM files), read again on SIGHUP. Both or neither.
type TLSConfig struct {
	Cert string `yaml:"cert"`
	Key  string `yaml:"key"`
}

// Enabled reports whether TLS is configured.
func (t TLSConfig) Enabled() bool { return t.Cert != "" || t.Key != "" }

// UIConfig is the config's ui section: the Control UI's browser sessions.
type UIConfig struct {
	// SessionIdle ends a browser session that made no request this long (default 12h).
	SessionIdle providers.Duration `yaml:"sessionIdle"`
	// SessionLifetime ends a browser session this long after its sign-in (default 168h).
	SessionLifetime providers.Duration `yaml:"sessionLifetime"`
}

// minSessionLifetime bounds ui.sessionIdle and ui.sessionLifetime from below.
const minSessionLifetime = time.Minute

// validateTransport checks tls, trustedProxies and ui.
func (c *Config) validateTransport() error {
	if c.TLS.Enabled() && (c.TLS.Cert == "" || c.TLS.Key == "") {
		if c.TLS.Cert == "" {
			return providers.Fieldf("tls.cert", "is required with tls.key (both PEM files, or neither)")
		}
		return providers.Fieldf("tls.key", "is required with tls.cert (both PEM files, or neither)")
	}
	if _, err := auth.ParseProxies(c.TrustedProxies); err != nil {
		return providers.Fieldf("trustedProxies", "%v", err)
	}
	idle, life := orDefault(c.UI.SessionIdle, auth.DefaultSessionIdle), orDefault(c.UI.SessionLifetime, auth.DefaultSessionLifetime)
	switch {
	case c.UI.SessionIdle < 0 || c.UI.SessionIdle != 0 && idle < minSessionLifetime:
		return providers.Fieldf("ui.sessionIdle", "must be at least %s (0: the default, %s), got %s", minSessionLifetime, auth.DefaultSessionIdle, c.UI.SessionIdle.D())
	case c.UI.SessionLifetime < 0 || c.UI.SessionLifetime != 0 && life < minSessionLifetime:
		return providers.Fieldf("ui.sessionLifetime", "must be at least %s (0: the default, %s), got %s", minSessionLifetime, auth.DefaultSessionLifetime, c.UI.SessionLifetime.D())
	case idle > life:
		return providers.Fieldf("ui.sessionIdle", "must not be above ui.sessionLifetime (%s), got %s", life, idle)
	}
	return nil
}

// ListenIsLoopback reports whether a listen address (host:port) binds only loopback: a
// loopback IP or localhost. An empty host, 0.0.0.0, :: or any other name is not.
func ListenIsLoopback(listen string) bool {
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	a, err := netip.ParseAddr(host)
	return err == nil && a.Unmap().IsLoopback()
}

// certificate is the API listener's TLS certificate, swapped whole on reload.
type certificate struct {
	certFile, keyFile string
	cur               atomic.Pointer[tls.Certificate]
}

// loadCertificate reads the certificate and key named by cfg; an error names the config key.
func loadCertificate(cfg TLSConfig) (*certificate, error) {
	c := &certificate{certFile: cfg.Cert, keyFile: cfg.Key}
	if err := c.reload(); err != nil {
		return nil, err
	}
	return c, nil
}

// reload reads the files again; on an error the certificate in use stays.
func (c *certificate) reload() error {
	pair, err := tls.LoadX509KeyPair(c.certFile, c.keyFile)
	if err != nil {
		return providers.Fieldf("tls", "certificate %s and key %s: %v", c.certFile, c.keyFile, err)
	}
	if pair.Leaf == nil && len(pair.Certificate) > 0 {
		if pair.Leaf, err = x509.ParseCertificate(pair.Certificate[0]); err != nil {
			return providers.Fieldf("tls.cert", "%s: %v", c.certFile, err)
		}
	}
	c.cur.Store(&pair)
	return nil
}

func (c *certificate) get(*tls.ClientHelloInfo) (*tls.Certificate, error) { return c.cur.Load(), nil }

// serverConfig is the listener's TLS configuration: the current certificate at each handshake.
func (c *certificate) serverConfig() *tls.Config {
	return &tls.Config{GetCertificate: c.get, MinVersion: tls.VersionTLS12}
}

// pinnedClient is an HTTP client for this gateway's own loopback address (the /mcp server's API
// client): it accepts exactly the certificate the listener serves now, whatever names it holds.
func (c *certificate) pinnedClient() *http.Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = &tls.Config{
		MinVersion: tls.VersionTLS12,
		// The loopback address is not a name of the certificate: the check is the pin below.
		InsecureSkipVerify: true, //nolint:gosec // pinned in VerifyConnection
		VerifyConnection: func(cs tls.ConnectionState) error {
			cur := c.cur.Load()
			if len(cs.PeerCertificates) == 0 || cur == nil || len(cur.Certificate) == 0 ||
				!cs.PeerCertificates[0].Equal(cur.Leaf) {
				return errors.New("the gateway's loopback listener presented a certificate other than its own")
			}
			return nil
		},
	}
	return &http.Client{Transport: tr, Timeout: 15 * time.Minute}
}

// reloadOnHangup reads the certificate again at each SIGHUP until ctx ends.
func (c *certificate) reloadOnHangup(ctx context.Context, log *slog.Logger) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
			if err := c.reload(); err != nil {
				log.Error("TLS certificate reload on SIGHUP: keeping the certificate in use", "err", err)
				continue
			}
			log.Info("TLS certificate reloaded", "cert", c.certFile, "notAfter", c.cur.Load().Leaf.NotAfter)
		}
	}
}

// warnCleartext logs at WARN a listener on a non-loopback address without TLS.
func warnCleartext(log *slog.Logger, listen string, tlsOn bool, proxies int) {
	if tlsOn || ListenIsLoopback(listen) {
		return
	}
	msg := "listening on a non-loopback address without TLS: the operator token and the Control UI's session cookie cross the network in clear; set tls.cert and tls.key (--tls-cert, --tls-key) or listen on 127.0.0.1 behind a TLS proxy"
	if proxies > 0 {
		msg = "listening on a non-loopback address without TLS: traffic between the trusted proxies and the gateway is in clear; set tls.cert and tls.key (--tls-cert, --tls-key) or listen on loopback"
	}
	log.Warn(msg, "listen", listen)
}

// runOwned runs fn in a goroutine until the gateway stops: the closer pushed on closers cancels
// its context and waits for it to return.
func runOwned(ctx context.Context, closers *shutdown.Stack, name string, fn func(context.Context)) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn(ctx)
	}()
	closers.Push(name, func(wait context.Context) error {
		cancel()
		select {
		case <-done:
			return nil
		case <-wait.Done():
			return context.Cause(wait)
		}
	})
}

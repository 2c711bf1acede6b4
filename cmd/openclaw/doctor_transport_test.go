package main

import (
	"strings"
	"testing"

	"github.com/openclaw/cloudworkers/gateway/api"
)

// doctor flags a gateway that listens on a network address without TLS, unless a TLS proxy
// (trustedProxies) is in front; loopback and TLS pass.
func TestDoctorFlagsACleartextNetworkListener(t *testing.T) {
	for _, c := range []struct {
		name   string
		t      *api.Transport
		step   bool
		ok     bool
		detail string
	}{
		{"older gateway", nil, false, true, ""},
		{"loopback", &api.Transport{Listen: "127.0.0.1:7420", Loopback: true}, true, true, "loopback"},
		{"tls", &api.Transport{Listen: "0.0.0.0:7420", TLS: true}, true, true, "with TLS"},
		{"behind a trusted proxy", &api.Transport{Listen: "10.0.0.5:7420", TrustedProxies: 1}, true, true, "trusted proxy"},
		{"network, no TLS", &api.Transport{Listen: "0.0.0.0:7420"}, true, false, "without TLS"},
	} {
		t.Run(c.name, func(t *testing.T) {
			s, ok := transportStep(api.GatewayInfo{Transport: c.t})
			if ok != c.step {
				t.Fatalf("step given: %v, want %v", ok, c.step)
			}
			if !ok {
				return
			}
			if s.OK != c.ok || !strings.Contains(s.Detail, c.detail) || (!s.OK && !strings.Contains(s.Fix, "tls.cert")) {
				t.Fatalf("step %+v, want ok=%v saying %q (and a fix naming tls.cert when flagged)", s, c.ok, c.detail)
			}
		})
	}
}

package main

import (
	"fmt"

	"github.com/openclaw/cloudworkers/gateway/api"
)

// transportStep checks how the gateway listens: a non-loopback address without TLS sends the
// operator token and the Control UI's session cookie in clear, unless a TLS proxy (trustedProxies)
// is in front. A gateway that does not say how it listens gives no step.
func transportStep(info api.GatewayInfo) (doctorStep, bool) {
	t := info.Transport
	if t == nil {
		return doctorStep{}, false
	}
	s := doctorStep{Name: "transport", OK: true}
	switch {
	case t.TLS:
		s.Detail = fmt.Sprintf("listening on %s with TLS", t.Listen)
	case t.Loopback:
		s.Detail = fmt.Sprintf("listening on %s (loopback) without TLS", t.Listen)
	case t.TrustedProxies > 0:
		s.Detail = fmt.Sprintf("listening on %s without TLS behind %d trusted proxy entries: traffic between them and the gateway is in clear", t.Listen, t.TrustedProxies)
	default:
		s.OK = false
		s.Detail = fmt.Sprintf("listening on %s, a non-loopback address, without TLS: the operator token and the Control UI's session cookie cross the network in clear", t.Listen)
		s.Fix = "set tls.cert and tls.key in the gateway config (or --tls-cert/--tls-key), or listen on 127.0.0.1 behind a TLS proxy named in trustedProxies"
	}
	return s, true
}

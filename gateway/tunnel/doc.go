// Package tunnel keeps one pinned SSH control connection per environment, asks each box to forward a
// worker-local unix socket back over it, and serves the forwarded connections of all environments on
// one hub net.Listener, with keepalives and jittered reconnects.
package tunnel

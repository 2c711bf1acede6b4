package hub

import (
	"context"
	"net"
	"sync"

	"github.com/openclaw/cloudworkers/internal/clock"
	"github.com/openclaw/cloudworkers/protocol"
)

// TunnelConn is a connection that arrived through an environment's tunnel; *tunnel.Conn is one.
// The hub admits on it only a worker whose credential is for that environment, and counts its
// pre-admission connections per tunnel. Connections that are not TunnelConns (a local listener)
// share one pre-admission budget and are not checked against a tunnel.
type TunnelConn interface {
	net.Conn
	TunnelEnvironment() string
}

// tunnelOf returns the environment tag of c, "" when it did not come through a tunnel.
func tunnelOf(c net.Conn) string {
	if tc, ok := c.(TunnelConn); ok {
		return tc.TunnelEnvironment()
	}
	return ""
}

// gateListener admits at most Limits.PreAdmission unadmitted connections per tunnel, and closes a
// connection not admitted within AdmissionTimeout of its accept (HTTP upgrade included).
type gateListener struct {
	net.Listener
	s *Server
}

func (l gateListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		tag := tunnelOf(c)
		s := l.s
		s.bmu.Lock()
		full := s.preAdmission[tag] >= s.cfg.Limits.PreAdmission
		if !full {
			s.preAdmission[tag]++
		}
		s.bmu.Unlock()
		if full {
			_ = c.Close()
			s.refused.add("worker.reject", tag, protocol.Errorf(protocol.CodeCapacityExceeded,
				"more than %d connections waiting for admission", s.cfg.Limits.PreAdmission))
			continue
		}
		pc := &preConn{Conn: c, s: s, tag: tag}
		pc.mu.Lock()
		pc.stopTimer = clock.AfterFunc(s.cfg.DeadlineClock, s.cfg.AdmissionTimeout, pc.expire)
		pc.mu.Unlock()
		return pc, nil
	}
}

// preConn is an accepted connection; it holds a pre-admission slot until admitted or closed.
type preConn struct {
	net.Conn
	s   *Server
	tag string

	mu        sync.Mutex
	stopTimer func() bool
	admitted  bool
	released  bool
	expired   bool
}

// expire closes a connection that was not admitted in time.
func (c *preConn) expire() {
	c.mu.Lock()
	if c.admitted {
		c.mu.Unlock()
		return
	}
	c.expired = true
	c.mu.Unlock()
	c.s.log.Debug("worker connection not admitted in time; closed", "tunnel", c.tag, "timeout", c.s.cfg.AdmissionTimeout)
	_ = c.Close()
}

// admit gives back the pre-admission slot; it reports false when the deadline already closed the connection.
func (c *preConn) admit() bool {
	c.mu.Lock()
	if c.expired {
		c.mu.Unlock()
		return false
	}
	c.admitted = true
	c.stopTimer()
	c.mu.Unlock()
	c.release()
	return true
}

func (c *preConn) release() {
	c.mu.Lock()
	done := c.released
	c.released = true
	c.mu.Unlock()
	if done {
		return
	}
	c.s.bmu.Lock()
	defer c.s.bmu.Unlock()
	if c.s.preAdmission[c.tag]--; c.s.preAdmission[c.tag] <= 0 {
		delete(c.s.preAdmission, c.tag)
	}
}

func (c *preConn) Close() error {
	c.mu.Lock()
	if c.stopTimer != nil {
		c.stopTimer()
	}
	c.mu.Unlock()
	c.release()
	return c.Conn.Close()
}

type preConnKey struct{}

// connContext makes the accepted *preConn reachable from the request's context.
func connContext(ctx context.Context, c net.Conn) context.Context {
	if pc, ok := c.(*preConn); ok {
		return context.WithValue(ctx, preConnKey{}, pc)
	}
	return ctx
}

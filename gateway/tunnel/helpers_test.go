package tunnel

import (
	"context"
	"errors"
	"io"
	"net"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openclaw/cloudworkers/gateway/tunnel/tunneltest"
	"github.com/openclaw/cloudworkers/internal/testrig/testenv"
	"github.com/openclaw/cloudworkers/providers/local/localtest"
	"golang.org/x/crypto/ssh"
)

// waitLong bounds every wait of these tests: generous, for a loaded CI machine.
const waitLong = 15 * time.Second

func testContext(t *testing.T) context.Context { return testenv.Context(t, 30*time.Second) }

// box is an in-process local box.
type box struct{ localtest.Box }

// startBox runs a local box in this process until the test ends.
func startBox(t *testing.T) box { return box{localtest.Start(t)} }

const testSocket = ".openclaw-worker/gateway.sock"

// target returns a Target for env on b, reached through addr ("host:port") when not empty.
func (b box) target(env, addr string) Target {
	t := Target{
		EnvironmentID: env,
		Host:          b.Host,
		Port:          b.Port,
		User:          b.User,
		KeyPath:       b.ClientKeyPath,
		HostKeys:      []string{b.HostKey},
		SocketPath:    testSocket,
	}
	if addr != "" {
		host, port, err := net.SplitHostPort(addr)
		if err != nil {
			panic(err)
		}
		t.Host = host
		t.Port, _ = strconv.Atoi(port)
	}
	return t
}

func (b box) socket(rel string) string { return filepath.Join(b.Dir, rel) }

// dialSocket connects to a forwarded socket from the box side, as a worker does.
func dialSocket(t *testing.T, path string) net.Conn {
	t.Helper()
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatalf("dial forwarded socket: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// acceptOne accepts one connection from the hub within waitLong.
func acceptOne(t *testing.T, h *Mux) *Conn {
	t.Helper()
	type result struct {
		c   net.Conn
		err error
	}
	ch := make(chan result, 1)
	go func() {
		c, err := h.Accept()
		ch <- result{c, err}
	}()
	select {
	case r := <-ch:
		if r.err != nil {
			t.Fatalf("accept: %v", r.err)
		}
		c, ok := r.c.(*Conn)
		if !ok {
			t.Fatalf("accept returned %T, want *Conn", r.c)
		}
		t.Cleanup(func() { c.Close() })
		return c
	case <-time.After(waitLong):
		t.Fatal("no connection accepted")
	}
	panic("unreachable")
}

// roundTrip sends msg from the box side and checks it arrives on the hub side, and back.
func roundTrip(t *testing.T, boxSide net.Conn, hubSide net.Conn, msg string) {
	t.Helper()
	if _, err := io.WriteString(boxSide, msg); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, len(msg))
	if _, err := io.ReadFull(hubSide, buf); err != nil || string(buf) != msg {
		t.Fatalf("hub side read %q, %v; want %q", buf, err, msg)
	}
	if _, err := io.WriteString(hubSide, strings.ToUpper(msg)); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(boxSide, buf); err != nil || string(buf) != strings.ToUpper(msg) {
		t.Fatalf("box side read %q, %v", buf, err)
	}
}

// statusLog records OnStatus calls.
type statusLog struct {
	mu   sync.Mutex
	seen map[string][]Status
}

func (l *statusLog) record(env string, s Status) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.seen == nil {
		l.seen = map[string][]Status{}
	}
	l.seen[env] = append(l.seen[env], s)
}

func (l *statusLog) get(env string) []Status {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]Status(nil), l.seen[env]...)
}

// testHub returns a hub with quick backoff and a status log; it is closed when the test ends.
func testHub(t *testing.T, mod func(*Config)) (*Mux, *statusLog) {
	t.Helper()
	log := &statusLog{}
	cfg := Config{
		BackoffMin:  10 * time.Millisecond,
		BackoffMax:  100 * time.Millisecond,
		DialTimeout: waitLong,
		OnStatus:    log.record,
	}
	if mod != nil {
		mod(&cfg)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	h := NewMux(cfg)
	t.Cleanup(func() { _ = h.Close(context.Background()) })
	return h, log
}

// writeKey writes a fresh ed25519 private key in OpenSSH format and returns its path and signer.
func writeKey(t *testing.T) (string, ssh.Signer) { return tunneltest.Key(t) }

// checkNoLeak waits until the number of goroutines is back to baseline.
func checkNoLeak(t *testing.T, baseline int) {
	t.Helper()
	deadline := time.NewTimer(waitLong)
	defer deadline.Stop()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for runtime.NumGoroutine() > baseline {
		select {
		case <-deadline.C:
			var b strings.Builder
			_ = pprof.Lookup("goroutine").WriteTo(&b, 1)
			t.Fatalf("goroutines: %d, baseline %d\n%s", runtime.NumGoroutine(), baseline, b.String())
		case <-tick.C:
		}
	}
}

// proxy is a loopback TCP proxy to a box that can be paused: while paused it accepts and reads
// but forwards no byte in either direction and closes nothing, as a partitioned link behaves.
type proxy struct {
	ln     net.Listener
	target string
	done   chan struct{}
	wg     sync.WaitGroup

	mu       sync.Mutex
	paused   bool
	resume   chan struct{}
	conns    []net.Conn
	accepted int
}

func startProxy(t *testing.T, target string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln, target: target, done: make(chan struct{})}
	p.wg.Go(p.serve)
	t.Cleanup(p.close)
	return p
}

func (p *proxy) addr() string { return p.ln.Addr().String() }

func (p *proxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.accepted++
		p.conns = append(p.conns, c, up)
		p.mu.Unlock()
		p.wg.Go(func() { p.pipe(up, c) })
		p.wg.Go(func() { p.pipe(c, up) })
	}
}

func (p *proxy) pipe(dst, src net.Conn) {
	defer dst.Close()
	defer src.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !p.gate() {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// gate blocks while the proxy is paused; false when the proxy is closed.
func (p *proxy) gate() bool {
	p.mu.Lock()
	if !p.paused {
		p.mu.Unlock()
		return true
	}
	ch := p.resume
	p.mu.Unlock()
	select {
	case <-ch:
		return true
	case <-p.done:
		return false
	}
}

func (p *proxy) pause() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.paused {
		p.paused, p.resume = true, make(chan struct{})
	}
}

func (p *proxy) unpause() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.paused {
		p.paused = false
		close(p.resume)
	}
}

func (p *proxy) acceptedCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.accepted
}

func (p *proxy) close() {
	select {
	case <-p.done:
		return
	default:
	}
	close(p.done)
	p.ln.Close()
	p.mu.Lock()
	for _, c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

func isMismatch(err error) bool {
	_, ok := errors.AsType[*HostKeyMismatchError](err)
	return ok
}

func authorizedKey(k ssh.PublicKey) string { return string(ssh.MarshalAuthorizedKey(k)) }

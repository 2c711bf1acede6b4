package hub_test

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/openclaw/cloudworkers/gateway/hub"
	"github.com/openclaw/cloudworkers/gateway/store"
	"github.com/openclaw/cloudworkers/internal/clock"
	"github.com/openclaw/cloudworkers/protocol"
	"github.com/openclaw/cloudworkers/worker/remote"
	"github.com/openclaw/cloudworkers/worker/tools"
)

const (
	envA    = "env-a"
	envB    = "env-b"
	bundleA = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
	bundleB = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
)

// harness is a hub on a unix socket in a temp dir, backed by a real SQLite database.
type harness struct {
	t       *testing.T
	db      *store.DB
	creds   *hub.Credentials
	srv     *hub.Server
	sock    string
	offset  atomic.Int64 // added to the credential clock
	admits  chan string
	departs chan string
	runs    *runTable // the turns the harness started (gateway/turns' record, in the gateway)

	mu sync.Mutex
	ln *trackListener
	wg sync.WaitGroup
}

func newHarness(t *testing.T, mod func(*hub.Config)) *harness {
	t.Helper()
	ctx := testContext(t)
	dir := t.TempDir()
	db, err := store.Open(ctx, filepath.Join(dir, "gateway.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	h := &harness{t: t, db: db, sock: filepath.Join(dir, "w.sock"),
		admits: make(chan string, 16), departs: make(chan string, 16), runs: &runTable{m: map[string]run{}}}
	if len(h.sock) > 100 { // unix socket paths are short
		d, err := os.MkdirTemp("", "hub")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(d) })
		h.sock = filepath.Join(d, "w.sock")
	}
	h.creds = hub.NewCredentials(db)
	h.creds.Clock = offsetClock{h}
	cfg := hub.Config{
		DB:          db,
		Credentials: h.creds,
		ExpectedBundle: func(envID string) (string, bool) {
			switch envID {
			case envA:
				return bundleA, true
			case envB:
				return bundleB, true
			}
			return "", false
		},
		HeartbeatTimeout: 3 * time.Second,
		OnAdmit:          func(env string) { h.admits <- env },
		OnDisconnect:     func(env string) { h.departs <- env },
		Runs:             h.runs,
	}
	if mod != nil {
		mod(&cfg)
	}
	h.srv, err = hub.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	h.listen()
	t.Cleanup(func() {
		_ = h.srv.Close(context.Background())
		h.wg.Wait()
	})
	return h
}

// listen starts serving on a fresh listener at the socket path.
func (h *harness) listen() {
	h.t.Helper()
	ln, err := net.Listen("unix", h.sock)
	if err != nil {
		h.t.Fatal(err)
	}
	tl := &trackListener{Listener: ln}
	h.mu.Lock()
	h.ln = tl
	h.mu.Unlock()
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		_ = h.srv.Serve(tl)
	}()
}

// dropTunnel closes the listener and every accepted connection, like a tunnel going down.
func (h *harness) dropTunnel() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ln.drop()
}

func (h *harness) mint(env, bundle string, ttl time.Duration, methods []string) string {
	h.t.Helper()
	s, err := h.creds.Mint(testContext(h.t), env, bundle, ttl, methods)
	if err != nil {
		h.t.Fatal(err)
	}
	return s
}

func (h *harness) workerConfig(env, cred, bundle string) remote.Config {
	return remote.Config{SocketPath: h.sock, EnvironmentID: env, Credential: cred, OwnerEpoch: 1,
		BundleHash: bundle, Version: "test", BackoffMin: 5 * time.Millisecond, BackoffMax: 50 * time.Millisecond}
}

// run starts remote.Run and returns its result channel; the worker is stopped at cleanup.
func (h *harness) run(cfg remote.Config) <-chan error {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		done <- remote.Run(ctx, cfg)
	}()
	h.t.Cleanup(func() {
		cancel()
		<-finished
	})
	return done
}

// auditRows returns the detail of each audit row of kind.
func (h *harness) auditRows(kind string) []string {
	h.t.Helper()
	rows, err := h.db.ListAudit(testContext(h.t), "", 1000)
	if err != nil {
		h.t.Fatal(err)
	}
	var out []string
	for _, r := range rows {
		if r.Kind == kind {
			out = append(out, r.EnvironmentID+" "+r.Detail)
		}
	}
	return out
}

// closedAuditRows closes the server, which writes the refusals counted so far (one row per kind and
// environment per window), and returns the rows of kind.
func (h *harness) closedAuditRows(kind string) []string {
	h.t.Helper()
	if err := h.srv.Close(testContext(h.t)); err != nil {
		h.t.Fatal(err)
	}
	return h.auditRows(kind)
}

func (h *harness) waitAudit(kind, substr string) {
	h.t.Helper()
	waitFor(h.t, kind+" audit row containing "+substr, func() bool {
		for _, r := range h.auditRows(kind) {
			if strings.Contains(r, substr) {
				return true
			}
		}
		return false
	})
}

type trackListener struct {
	net.Listener
	mu    sync.Mutex
	conns []net.Conn
}

func (l *trackListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.mu.Lock()
		l.conns = append(l.conns, c)
		l.mu.Unlock()
	}
	return c, err
}

func (l *trackListener) drop() {
	l.Listener.Close()
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, c := range l.conns {
		c.Close()
	}
}

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond) // polling interval, not a wait for an event
	}
}

func recvChan[T any](t *testing.T, what string, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(15 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
	}
	panic("unreachable")
}

func TestAdmitHeartbeatShutdown(t *testing.T) {
	const hbTimeout = 900 * time.Millisecond
	h := newHarness(t, func(c *hub.Config) { c.HeartbeatTimeout = hbTimeout })
	ctx := testContext(t)
	secret := h.mint(envA, bundleA, time.Hour, nil)
	done := h.run(h.workerConfig(envA, secret, bundleA))

	if err := h.srv.WaitAdmitted(ctx, envA); err != nil {
		t.Fatal(err)
	}
	if got := recvChan(t, "OnAdmit", h.admits); got != envA {
		t.Fatalf("OnAdmit(%q), want %q", got, envA)
	}
	if !h.srv.Admitted(envA) || h.srv.Admitted(envB) {
		t.Fatal("Admitted disagrees with the connected worker")
	}
	h.waitAudit("worker.admit", envA)

	// Heartbeats keep the connection past several heartbeat timeouts.
	select {
	case env := <-h.departs:
		t.Fatalf("worker of %s disconnected despite heartbeats", env)
	case err := <-done:
		t.Fatalf("Run returned early: %v", err)
	case <-time.After(2 * hbTimeout):
	}

	if err := h.srv.Shutdown(ctx, envA, "test over"); err != nil {
		t.Fatal(err)
	}
	if err := recvChan(t, "Run to return", done); err != nil {
		t.Fatalf("Run after shutdown = %v, want nil", err)
	}
	if got := recvChan(t, "OnDisconnect", h.departs); got != envA {
		t.Fatalf("OnDisconnect(%q)", got)
	}
	if h.srv.Admitted(envA) {
		t.Fatal("still admitted after shutdown")
	}
	if err := h.srv.Shutdown(ctx, envA, "again"); !errors.Is(err, hub.ErrNotAdmitted) {
		t.Fatalf("Shutdown without a worker = %v, want ErrNotAdmitted", err)
	}

	// Only the hash is stored: the secret appears nowhere in the database files.
	assertNotInDB(t, h.db, secret)
}

func assertNotInDB(t *testing.T, db *store.DB, secret string) {
	t.Helper()
	sum := sha256.Sum256([]byte(secret))
	var found bool
	for _, suffix := range []string{"", "-wal"} {
		b, err := os.ReadFile(db.Path() + suffix)
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(b, []byte(secret)) || bytes.Contains(b, []byte(secret[4:])) {
			t.Fatalf("secret found in %s", db.Path()+suffix)
		}
		found = found || bytes.Contains(b, []byte(hex.EncodeToString(sum[:])))
	}
	if !found {
		t.Fatal("credential hash not found in the database files: the check above proves nothing")
	}
}

// expectTools has the gateway check the worker's tool manifest against this build's.
func expectTools(c *hub.Config) { c.ExpectedTools = tools.Manifest() }

// A worker presenting this build's tools is admitted when the gateway checks them.
func TestAdmissionChecksTheToolManifest(t *testing.T) {
	h := newHarness(t, expectTools)
	cfg := h.workerConfig(envA, h.mint(envA, bundleA, time.Hour, nil), bundleA)
	cfg.Tools = tools.Manifest()
	h.run(cfg)
	if err := h.srv.WaitAdmitted(testContext(t), envA); err != nil {
		t.Fatalf("a worker with the bundle's tools: %v", err)
	}
}

func TestAdmissionRejections(t *testing.T) {
	tests := []struct {
		name string
		code protocol.Code
		// setup mints what it needs and returns the worker's config.
		setup func(h *harness) remote.Config
		// mod changes the gateway's config (nil: none).
		mod func(*hub.Config)
	}{
		{"forged", protocol.CodeUnauthorized, func(h *harness) remote.Config {
			h.mint(envA, bundleA, time.Hour, nil)
			return h.workerConfig(envA, "ocw_forgedforgedforgedforgedforgedforgedforgedf", bundleA)
		}, nil},
		{"revoked", protocol.CodeUnauthorized, func(h *harness) remote.Config {
			s := h.mint(envA, bundleA, time.Hour, nil)
			if n, err := h.creds.RevokeEnv(testContext(h.t), envA); err != nil || n != 1 {
				h.t.Fatalf("RevokeEnv = %d, %v", n, err)
			}
			return h.workerConfig(envA, s, bundleA)
		}, nil},
		{"expired", protocol.CodeCredentialExpired, func(h *harness) remote.Config {
			s := h.mint(envA, bundleA, time.Minute, nil)
			h.offset.Store(int64(2 * time.Minute))
			return h.workerConfig(envA, s, bundleA)
		}, nil},
		{"other-env", protocol.CodeWrongEnvironment, func(h *harness) remote.Config {
			return h.workerConfig(envA, h.mint(envB, bundleB, time.Hour, nil), bundleB)
		}, nil},
		{"wrong-bundle", protocol.CodeBundleMismatch, func(h *harness) remote.Config {
			return h.workerConfig(envA, h.mint(envA, bundleA, time.Hour, nil), bundleB)
		}, nil},
		{"stale-credential-bundle", protocol.CodeBundleMismatch, func(h *harness) remote.Config {
			// The credential and the worker agree, but the gateway now expects another bundle.
			return h.workerConfig(envA, h.mint(envA, bundleB, time.Hour, nil), bundleB)
		}, nil},
		{"version", protocol.CodeUnsupportedVersion, func(h *harness) remote.Config {
			cfg := h.workerConfig(envA, h.mint(envA, bundleA, time.Hour, nil), bundleA)
			cfg.ProtocolVersion = protocol.ProtocolVersion + 1
			return cfg
		}, nil},
		// The bundle hash is right, but the tools the worker offers are not the bundle's: one
		// schema changed, one tool added, or none presented.
		{"tool-schema", protocol.CodeBundleMismatch, func(h *harness) remote.Config {
			cfg := h.workerConfig(envA, h.mint(envA, bundleA, time.Hour, nil), bundleA)
			cfg.Tools = tools.Manifest()
			cfg.Tools[0].Schema = strings.Repeat("0", 64)
			return cfg
		}, expectTools},
		{"tool-added", protocol.CodeBundleMismatch, func(h *harness) remote.Config {
			cfg := h.workerConfig(envA, h.mint(envA, bundleA, time.Hour, nil), bundleA)
			cfg.Tools = append(tools.Manifest(), protocol.ToolDigest{Name: "zz_exfiltrate", Schema: strings.Repeat("1", 64)})
			return cfg
		}, expectTools},
		{"no-tools", protocol.CodeBundleMismatch, func(h *harness) remote.Config {
			return h.workerConfig(envA, h.mint(envA, bundleA, time.Hour, nil), bundleA)
		}, expectTools},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, tt.mod)
			done := h.run(tt.setup(h))
			err := recvChan(t, "Run to give up", done)
			var ae *remote.AdmissionError
			if !errors.As(err, &ae) || ae.Err.Code != tt.code {
				t.Fatalf("Run = %v, want admission error %s", err, tt.code)
			}
			rows := h.closedAuditRows("worker.reject")
			if len(rows) != 1 || !strings.Contains(rows[0], "1 refused") || !strings.Contains(rows[0], " "+string(tt.code)+": ") {
				t.Fatalf("reject audit rows = %q, want one with code %s", rows, tt.code)
			}
			if h.srv.Admitted(envA) || len(h.auditRows("worker.admit")) != 0 {
				t.Fatal("rejected worker was admitted")
			}
		})
	}
}

// rawConn is a hand-driven WebSocket client for frames the real worker never sends.
func rawConn(t *testing.T, h *harness) *websocket.Conn {
	t.Helper()
	c, _, err := websocket.Dial(testContext(t), "ws://worker/worker", &websocket.DialOptions{HTTPClient: unixClient(h.sock)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.CloseNow() })
	return c
}

func unixClient(sock string) *http.Client {
	return &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}}}
}

func sendRaw(t *testing.T, c *websocket.Conn, b []byte) {
	t.Helper()
	if err := c.Write(testContext(t), websocket.MessageText, b); err != nil {
		t.Fatal(err)
	}
}

func sendFrame(t *testing.T, c *websocket.Conn, f protocol.Frame) {
	t.Helper()
	b, err := json.Marshal(f)
	if err != nil {
		t.Fatal(err)
	}
	sendRaw(t, c, b)
}

func recvFrame(t *testing.T, c *websocket.Conn) protocol.Frame {
	t.Helper()
	_, b, err := c.Read(testContext(t))
	if err != nil {
		t.Fatal(err)
	}
	f, err := protocol.Decode(b, protocol.DefaultFrameLimit)
	if err != nil {
		t.Fatalf("gateway sent an invalid frame %s: %v", b, err)
	}
	return f
}

// connectFrame is a connect request; mod, if any, changes the admission (e.g. claims a session).
func connectFrame(t *testing.T, env, cred, bundle string, mod ...func(*protocol.Admission)) protocol.Frame {
	t.Helper()
	a := protocol.Admission{EnvironmentID: env, Credential: cred, OwnerEpoch: 1,
		Handshake: protocol.Handshake{BundleHash: bundle, Version: protocol.ProtocolVersion, ProtocolFeatures: protocol.Features}}
	for _, m := range mod {
		m(&a)
	}
	f, err := protocol.Request("c1", protocol.MethodConnect, protocol.ConnectParams{Role: protocol.RoleWorker, Admission: a})
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func TestRawRejections(t *testing.T) {
	padded := func(n int) []byte {
		head := `{"type":"req","id":"c1","method":"connect","params":{"pad":"`
		tail := `"}}`
		return []byte(head + strings.Repeat("x", n-len(head)-len(tail)) + tail)
	}
	hb, _ := protocol.Request("1", protocol.MethodHeartbeat, nil)
	hbJSON, _ := json.Marshal(hb)
	tests := []struct {
		name   string
		frame  []byte
		code   protocol.Code
		status websocket.StatusCode
	}{
		{"heartbeat first", hbJSON, protocol.CodeExpectedConnect, websocket.StatusPolicyViolation},
		{"event first", []byte(`{"type":"event","event":"worker.heartbeat"}`), protocol.CodeExpectedConnect, websocket.StatusPolicyViolation},
		{"garbage", []byte(`hello`), protocol.CodeInvalidFrame, websocket.StatusPolicyViolation},
		{"unknown field", []byte(`{"type":"req","id":"c1","method":"connect","params":{},"admin":true}`), protocol.CodeInvalidFrame, websocket.StatusPolicyViolation},
		{"at limit", padded(protocol.PreAdmissionFrameLimit), protocol.CodeInvalidFrame, websocket.StatusPolicyViolation},
		{"over limit", padded(protocol.PreAdmissionFrameLimit + 1), protocol.CodeFrameTooLarge, websocket.StatusMessageTooBig},
		{"far over limit", padded(4 * protocol.PreAdmissionFrameLimit), protocol.CodeFrameTooLarge, websocket.StatusMessageTooBig},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, nil)
			c := rawConn(t, h)
			sendRaw(t, c, tt.frame)
			f := recvFrame(t, c)
			if f.Type != protocol.TypeRes || f.OK || f.Error.Code != tt.code {
				t.Fatalf("response = %+v, want error %s", f, tt.code)
			}
			_, _, err := c.Read(testContext(t))
			if got := websocket.CloseStatus(err); got != tt.status {
				t.Fatalf("after rejection read = %v, want close status %v", err, tt.status)
			}
			rows := h.closedAuditRows("worker.reject")
			if len(rows) != 1 || !strings.Contains(rows[0], string(tt.code)+": ") {
				t.Fatalf("reject audit rows = %q, want one with code %s", rows, tt.code)
			}
		})
	}
}

func TestMethodAllowlist(t *testing.T) {
	h := newHarness(t, nil)
	ctx := testContext(t)
	secret := h.mint(envA, bundleA, time.Hour, []string{protocol.MethodHeartbeat})
	c := rawConn(t, h)
	sendFrame(t, c, connectFrame(t, envA, secret, bundleA))
	res := recvFrame(t, c)
	var cr protocol.ConnectResult
	if !res.OK || protocol.DecodeParams(res.Payload, &cr) != nil || cr.EnvironmentID != envA || cr.HeartbeatIntervalMs != 1000 {
		t.Fatalf("connect response = %+v (%s)", res, res.Payload)
	}
	if err := h.srv.WaitAdmitted(ctx, envA); err != nil {
		t.Fatal(err)
	}
	for i, m := range []string{protocol.MethodCredentialRefresh, "node.invoke", protocol.MethodConnect, protocol.MethodShutdown} {
		req, _ := protocol.Request("m"+string(rune('0'+i)), m, nil)
		sendFrame(t, c, req)
		f := recvFrame(t, c)
		if f.ID != req.ID || f.OK || f.Error.Code != protocol.CodeMethodNotAllowed {
			t.Fatalf("%s: response %+v, want method-not-allowed", m, f)
		}
	}
	// The connection stays open and served.
	hb, _ := protocol.Request("h1", protocol.MethodHeartbeat, nil)
	sendFrame(t, c, hb)
	if f := recvFrame(t, c); f.ID != "h1" || !f.OK {
		t.Fatalf("heartbeat response %+v", f)
	}
	if !h.srv.Admitted(envA) {
		t.Fatal("worker lost admission after a refused method")
	}
}

func TestMintRejectsNonWorkerMethods(t *testing.T) {
	h := newHarness(t, nil)
	if _, err := h.creds.Mint(testContext(t), envA, bundleA, time.Hour, []string{"node.invoke"}); err == nil {
		t.Fatal("Mint granted a method outside WorkerMethods")
	}
}

func TestCredentialRefresh(t *testing.T) {
	h := newHarness(t, nil)
	ctx := testContext(t)
	secret := h.mint(envA, bundleA, time.Hour, nil)
	c := rawConn(t, h)
	sendFrame(t, c, connectFrame(t, envA, secret, bundleA))
	if f := recvFrame(t, c); !f.OK {
		t.Fatalf("connect: %+v", f.Error)
	}
	req, _ := protocol.Request("r1", protocol.MethodCredentialRefresh, nil)
	sendFrame(t, c, req)
	f := recvFrame(t, c)
	var rr protocol.CredentialRefreshResult
	if !f.OK || protocol.DecodeParams(f.Payload, &rr) != nil || rr.Credential == "" || rr.Credential == secret {
		t.Fatalf("refresh response %+v (%s)", f, f.Payload)
	}
	if rr.ExpiresInMs < (59 * time.Minute).Milliseconds() {
		t.Fatalf("refreshed credential expires in %dms, want the original lifetime", rr.ExpiresInMs)
	}
	nc, err := h.creds.Verify(ctx, rr.Credential)
	if err != nil || nc.EnvironmentID != envA || nc.BundleHash != bundleA {
		t.Fatalf("Verify(new) = %+v, %v", nc, err)
	}
	if _, err := h.creds.Verify(ctx, secret); err != nil {
		t.Fatalf("old credential invalid before its expiry: %v", err)
	}
	if _, err := h.creds.Refresh(ctx, rr.Credential); err != nil {
		t.Fatalf("Refresh: %v", err)
	}
	if _, err := h.creds.Refresh(ctx, "ocw_nope"); !errors.Is(err, hub.ErrUnknownCredential) {
		t.Fatalf("Refresh(forged) = %v", err)
	}
	assertNotInDB(t, h.db, rr.Credential)
}

// A worker launched anew gets the only credential of its environment: the credentials of earlier
// launches (and their refreshes), which a box may have kept, stop admitting; another
// environment's are untouched.
func TestMintSoleRevokesTheEnvironmentsEarlierCredentials(t *testing.T) {
	h := newHarness(t, nil)
	ctx := testContext(t)
	first := h.mint(envA, bundleA, time.Hour, nil)
	refreshed, err := h.creds.Refresh(ctx, first)
	if err != nil {
		t.Fatal(err)
	}
	other := h.mint("env-b", bundleA, time.Hour, nil)
	sole, err := h.creds.MintSole(ctx, envA, bundleA, time.Hour, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, old := range []string{first, refreshed} {
		if _, err := h.creds.Verify(ctx, old); !errors.Is(err, hub.ErrUnknownCredential) {
			t.Fatalf("an earlier launch's credential after MintSole: %v, want it revoked", err)
		}
	}
	for _, live := range []string{sole, other} {
		if _, err := h.creds.Verify(ctx, live); err != nil {
			t.Fatalf("Verify after MintSole: %v", err)
		}
	}
}

// TestWorkerRefreshesAndReconnects covers the worker's own refresh: after the original credential
// is revoked, a dropped tunnel is survived with the refreshed one.
func TestWorkerRefreshesAndReconnects(t *testing.T) {
	h := newHarness(t, func(c *hub.Config) { c.HeartbeatTimeout = 300 * time.Millisecond })
	ctx := testContext(t)
	// The worker refreshes at half the lifetime, so after about a second.
	secret := h.mint(envA, bundleA, 2*time.Second, nil)
	done := h.run(h.workerConfig(envA, secret, bundleA))
	if err := h.srv.WaitAdmitted(ctx, envA); err != nil {
		t.Fatal(err)
	}
	h.waitAudit("worker.credential.refresh", "replaced by")
	sum := sha256.Sum256([]byte(secret))
	if _, err := h.db.W.ExecContext(ctx, `UPDATE worker_credentials SET revoked_at = ? WHERE hash = ?`,
		store.FormatTime(time.Now()), hex.EncodeToString(sum[:])); err != nil {
		t.Fatal(err)
	}
	// Make every live credential long-lived so the reconnect does not race expiry.
	if _, err := h.db.W.ExecContext(ctx, `UPDATE worker_credentials SET expires_at = ? WHERE revoked_at = ''`,
		store.FormatTime(time.Now().Add(time.Hour))); err != nil {
		t.Fatal(err)
	}
	recvChan(t, "first admission", h.admits)
	h.dropTunnel()
	recvChan(t, "disconnect", h.departs)
	h.listen()
	if got := recvChan(t, "re-admission", h.admits); got != envA {
		t.Fatalf("OnAdmit(%q)", got)
	}
	if err := h.srv.Shutdown(ctx, envA, "done"); err != nil {
		t.Fatal(err)
	}
	if err := recvChan(t, "Run to return", done); err != nil {
		t.Fatalf("Run = %v", err)
	}
	if rows := h.closedAuditRows("worker.reject"); len(rows) != 0 {
		t.Fatalf("worker was rejected: %q", rows)
	}
}

func TestReconnectAfterTunnelDrop(t *testing.T) {
	h := newHarness(t, nil)
	ctx := testContext(t)
	done := h.run(h.workerConfig(envA, h.mint(envA, bundleA, time.Hour, nil), bundleA))
	for round := range 3 {
		if got := recvChan(t, "admission", h.admits); got != envA {
			t.Fatalf("round %d: OnAdmit(%q)", round, got)
		}
		h.dropTunnel()
		recvChan(t, "disconnect", h.departs)
		h.listen()
	}
	if err := h.srv.WaitAdmitted(ctx, envA); err != nil {
		t.Fatal(err)
	}
	if n := len(h.auditRows("worker.admit")); n < 4 {
		t.Fatalf("%d admissions, want at least 4", n)
	}
	select {
	case err := <-done:
		t.Fatalf("Run returned across tunnel drops: %v", err)
	default:
	}
	if err := h.srv.Shutdown(ctx, envA, "done"); err != nil {
		t.Fatal(err)
	}
	if err := recvChan(t, "Run to return", done); err != nil {
		t.Fatalf("Run = %v", err)
	}
}

func TestNewerConnectionReplacesOlder(t *testing.T) {
	h := newHarness(t, nil)
	secret := h.mint(envA, bundleA, time.Hour, nil)
	first := rawConn(t, h)
	sendFrame(t, first, connectFrame(t, envA, secret, bundleA))
	if f := recvFrame(t, first); !f.OK {
		t.Fatalf("first connect: %+v", f.Error)
	}
	recvChan(t, "first admission", h.admits)
	second := rawConn(t, h)
	sendFrame(t, second, connectFrame(t, envA, secret, bundleA))
	if f := recvFrame(t, second); !f.OK {
		t.Fatalf("second connect: %+v", f.Error)
	}
	recvChan(t, "second admission", h.admits)
	if _, _, err := first.Read(testContext(t)); websocket.CloseStatus(err) != websocket.StatusPolicyViolation {
		t.Fatalf("replaced connection read = %v, want a policy close", err)
	}
	hb, _ := protocol.Request("h1", protocol.MethodHeartbeat, nil)
	sendFrame(t, second, hb)
	if f := recvFrame(t, second); !f.OK {
		t.Fatalf("heartbeat on the newer connection: %+v", f.Error)
	}
	select {
	case env := <-h.departs:
		t.Fatalf("OnDisconnect(%s) on replacement", env)
	default:
	}
	if !h.srv.Admitted(envA) {
		t.Fatal("environment lost its worker on replacement")
	}
}

func TestOtherPathsAreNotFound(t *testing.T) {
	h := newHarness(t, nil)
	client := unixClient(h.sock)
	for _, p := range []string{"/", "/api/v1/environments", "/worker/x", "/metrics"} {
		resp, err := client.Get("http://worker" + p)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound {
			t.Errorf("GET %s = %d, want 404", p, resp.StatusCode)
		}
	}
}

func TestCloseEndsWorkersAndWaiters(t *testing.T) {
	h := newHarness(t, nil)
	ctx := testContext(t)
	waitErr := make(chan error, 1)
	go func() { waitErr <- h.srv.WaitAdmitted(ctx, envB) }()
	done := h.run(h.workerConfig(envA, h.mint(envA, bundleA, time.Hour, nil), bundleA))
	if err := h.srv.WaitAdmitted(ctx, envA); err != nil {
		t.Fatal(err)
	}
	if err := h.srv.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := recvChan(t, "WaitAdmitted to end", waitErr); !errors.Is(err, hub.ErrClosed) {
		t.Fatalf("WaitAdmitted after Close = %v", err)
	}
	recvChan(t, "disconnect", h.departs)
	select {
	case err := <-done:
		t.Fatalf("Run returned on a closed gateway (it should keep retrying): %v", err)
	default:
	}
}

func TestSilentWorkerIsDropped(t *testing.T) {
	h := newHarness(t, func(c *hub.Config) { c.HeartbeatTimeout = 200 * time.Millisecond })
	c := rawConn(t, h)
	sendFrame(t, c, connectFrame(t, envA, h.mint(envA, bundleA, time.Hour, nil), bundleA))
	if f := recvFrame(t, c); !f.OK {
		t.Fatalf("connect: %+v", f.Error)
	}
	recvChan(t, "admission", h.admits)
	// No heartbeats: the hub ends the admission after HeartbeatTimeout.
	if got := recvChan(t, "disconnect of a silent worker", h.departs); got != envA {
		t.Fatalf("OnDisconnect(%q)", got)
	}
	if _, _, err := c.Read(testContext(t)); err == nil {
		t.Fatal("connection still open after heartbeat timeout")
	}
}

// offsetClock is the real clock moved on by the harness's offset (the credential clock).
type offsetClock struct{ h *harness }

func (c offsetClock) Now() time.Time { return time.Now().Add(time.Duration(c.h.offset.Load())) }
func (c offsetClock) NewTimer(d time.Duration) clock.Timer {
	return clock.Real.NewTimer(d)
}
func (c offsetClock) NewTicker(d time.Duration) clock.Ticker {
	return clock.Real.NewTicker(d)
}

// runTable is the harness's record of running turns (hub.Runs), which gateway/turns keeps in the
// gateway.
type runTable struct {
	mu       sync.Mutex
	m        map[string]run    // session → its running turn
	yielding map[string]string // session → the run a live move stops at its next model call
}

type run struct {
	id    string
	epoch uint64
}

func (r *runTable) start(session, runID string, epoch uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.m[session] = run{runID, epoch}
}

func (r *runTable) end(session string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.m, session)
}

// yield marks session's run as stopping at its next model call (a live move; hub.Yields).
func (r *runTable) yield(session, runID string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.yielding == nil {
		r.yielding = map[string]string{}
	}
	r.yielding[session] = runID
}

func (r *runTable) Yielding(session, runID string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.yielding[session] == runID
}

func (r *runTable) RunningTurn(_ context.Context, session string) (string, uint64, bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	t, ok := r.m[session]
	return t.id, t.epoch, ok, nil
}

// A copied credential admits nothing: the first admission binds the credential's lineage to the
// worker's launch key; another key, no proof, or a proof signed long ago is refused, while the
// worker itself reconnects, and uses its refreshed credential, with its key.
func TestACopiedCredentialAdmitsNothing(t *testing.T) {
	h := newHarness(t, func(c *hub.Config) { c.RequireWorkerKey = true })
	ctx := testContext(t)
	_, own, _ := ed25519.GenerateKey(nil)
	_, stolen, _ := ed25519.GenerateKey(nil)
	secret := h.mint(envA, bundleA, time.Hour, nil)
	connect := func(key ed25519.PrivateKey, at time.Time, cred string) protocol.Frame {
		c := rawConn(t, h)
		sendFrame(t, c, connectFrame(t, envA, cred, bundleA, func(a *protocol.Admission) {
			if key != nil {
				protocol.SignAdmission(a, key, at)
			}
		}))
		f := recvFrame(t, c)
		if f.OK {
			t.Cleanup(func() { c.CloseNow() })
		}
		return f
	}
	refused := func(what string, f protocol.Frame, says string) {
		t.Helper()
		if f.OK || f.Error.Code != protocol.CodeUnauthorized || !strings.Contains(f.Error.Message, says) {
			t.Fatalf("%s: %+v, want unauthorized saying %q", what, f.Error, says)
		}
	}
	refused("no proof", connect(nil, time.Now(), secret), "no worker key proof")
	if f := connect(own, time.Now(), secret); !f.OK {
		t.Fatalf("the worker's first admission: %+v", f.Error)
	}
	refused("a copy of the credential with another key", connect(stolen, time.Now(), secret), "bound to another worker key")
	refused("a proof signed long ago", connect(own, time.Now().Add(-hub.AdmissionProofSkew-time.Minute), secret), "signed")
	if f := connect(own, time.Now(), secret); !f.OK {
		t.Fatalf("the worker reconnecting with its key: %+v", f.Error)
	}
	refreshed, err := h.creds.Refresh(ctx, secret)
	if err != nil {
		t.Fatal(err)
	}
	refused("the refreshed credential with another key", connect(stolen, time.Now(), refreshed), "bound to another worker key")
	if f := connect(own, time.Now(), refreshed); !f.OK {
		t.Fatalf("the refreshed credential with the worker's key: %+v", f.Error)
	}
	// a proof made for another credential does not verify for this one
	refused("a proof of another admission", connectWith(t, h, func(a *protocol.Admission) {
		b := *a
		b.Credential = "ocw_other"
		protocol.SignAdmission(&b, stolen, time.Now())
		a.PublicKey, a.Proof, a.SignedAtMs = b.PublicKey, b.Proof, b.SignedAtMs
	}, envA, refreshed), "does not verify")
}

// connectWith sends a connect of cred changed by mod on a fresh connection and returns the answer.
func connectWith(t *testing.T, h *harness, mod func(*protocol.Admission), env, cred string) protocol.Frame {
	t.Helper()
	c := rawConn(t, h)
	sendFrame(t, c, connectFrame(t, env, cred, bundleA, mod))
	return recvFrame(t, c)
}

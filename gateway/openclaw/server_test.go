package openclaw

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/openclaw/cloudworkers/gateway/sessions"
	"github.com/openclaw/cloudworkers/gateway/store"
	"github.com/openclaw/cloudworkers/gateway/turns"
	"github.com/openclaw/cloudworkers/internal/testrig/testenv"
	"github.com/openclaw/cloudworkers/protocol"
)

const testToken = "oct_test-operator-token"

// fakeTurns runs a turn as a burst of live events: start, the text in deltas, end.
type fakeTurns struct {
	s    *sessions.Store
	mu   sync.Mutex
	runs map[string]turns.Turn
	// deltas is the reply of every turn, one live event each
	deltas []string
	// moves: each turn moves live halfway through its reply (it stops, then goes on with a new
	// run epoch, as a live move's continuation does)
	moves bool
}

func (f *fakeTurns) Send(ctx context.Context, sessionID, text, key string) (turns.Turn, error) {
	f.mu.Lock()
	runID := "run_" + strconv.Itoa(len(f.runs)+1)
	t := turns.Turn{SessionID: sessionID, RunID: runID, IdempotencyKey: key, Status: turns.TurnRunning, RunEpoch: uint64(len(f.runs) + 1)}
	f.runs[runID] = t
	f.mu.Unlock()
	go func() {
		ses, _ := f.s.Get(context.Background(), sessionID)
		seq, epoch := uint64(0), t.RunEpoch
		pub := func(ev protocol.LiveEvent) {
			seq++
			_, _ = f.s.PublishLive(context.Background(), sessions.LiveParams{SessionID: sessionID, OwnerEpoch: ses.OwnerEpoch,
				RunEpoch: epoch, RunID: runID, Seq: seq, Event: ev})
		}
		pub(protocol.LiveEvent{Type: protocol.LiveLifecycleStart})
		for i, d := range f.deltas {
			if f.moves && i == len(f.deltas)/2 {
				pub(protocol.LiveEvent{Type: protocol.LiveLifecycleYield})
				epoch += 100 // the continuation: a run epoch of its own, the same run id
				seq = 0
				pub(protocol.LiveEvent{Type: protocol.LiveLifecycleResume})
			}
			pub(protocol.LiveEvent{Type: protocol.LiveTextDelta, Delta: d})
		}
		pub(protocol.LiveEvent{Type: protocol.LiveLifecycleEnd})
		f.mu.Lock()
		done := f.runs[runID]
		done.Status = turns.TurnDone
		f.runs[runID] = done
		f.mu.Unlock()
	}()
	return t, nil
}

func (f *fakeTurns) Cancel(string) bool { return false }

func (f *fakeTurns) Get(_ context.Context, runID string) (turns.Turn, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	t, ok := f.runs[runID]
	if !ok {
		return t, store.ErrNotFound
	}
	return t, nil
}

func (f *fakeTurns) Busy(string) bool { return false }

type rig struct {
	srv  *Server
	url  string
	sess *sessions.Store
}

func newRig(t *testing.T, mod func(*Config)) *rig {
	t.Helper()
	ctx := context.Background()
	db, err := store.Open(ctx, filepath.Join(t.TempDir(), "gw.db"))
	if err != nil {
		t.Fatal(err)
	}
	ss, err := sessions.New(sessions.Config{DB: db})
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Token: func() string { return testToken }, Sessions: ss, Devices: NewDevices(db, nil),
		Turns: &fakeTurns{s: ss, runs: map[string]turns.Turn{}, deltas: []string{"Hello ", "from ", "the ", "fake."}}}
	if mod != nil {
		mod(&cfg)
	}
	srv, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv)
	t.Cleanup(func() {
		_ = srv.Close(context.Background())
		hs.Close()
		_ = ss.Close(context.Background())
		_ = db.Close()
	})
	return &rig{srv: srv, url: "ws" + strings.TrimPrefix(hs.URL, "http"), sess: ss}
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// tclient is a raw protocol client.
type tclient struct {
	t     *testing.T
	ws    *websocket.Conn
	nonce string
	ts    int64
}

func dial(t *testing.T, r *rig) *tclient {
	t.Helper()
	ws, _, err := websocket.Dial(testCtx(t), r.url, nil)
	if err != nil {
		t.Fatal(err)
	}
	ws.SetReadLimit(16 << 20)
	t.Cleanup(func() { _ = ws.CloseNow() })
	c := &tclient{t: t, ws: ws}
	ev := c.read()
	if ev["event"] != "connect.challenge" {
		t.Fatalf("first frame %v, want connect.challenge", ev)
	}
	p := ev["payload"].(map[string]any)
	c.nonce, c.ts = p["nonce"].(string), int64(p["ts"].(float64))
	return c
}

func (c *tclient) write(v any) {
	c.t.Helper()
	b, _ := json.Marshal(v)
	if err := c.ws.Write(testCtx(c.t), websocket.MessageText, b); err != nil {
		c.t.Fatal(err)
	}
}

func (c *tclient) read() map[string]any {
	c.t.Helper()
	_, b, err := c.ws.Read(testCtx(c.t))
	if err != nil {
		c.t.Fatalf("read: %v", err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		c.t.Fatal(err)
	}
	return m
}

// res reads frames until the response to id.
func (c *tclient) res(id string) map[string]any {
	c.t.Helper()
	for {
		m := c.read()
		if m["type"] == "res" && m["id"] == id {
			return m
		}
	}
}

// closeStatus waits for the server to close and returns the status.
func (c *tclient) closeStatus() websocket.StatusCode {
	c.t.Helper()
	for {
		if _, _, err := c.ws.Read(testCtx(c.t)); err != nil {
			return websocket.CloseStatus(err)
		}
	}
}

func connectBody(token string) map[string]any {
	return map[string]any{"minProtocol": 4, "maxProtocol": 4, "role": "operator", "scopes": []string{"operator.read", "operator.write"},
		"client": map[string]any{"id": "test", "version": "1", "platform": "linux", "mode": "cli"}, "auth": map[string]any{"token": token}}
}

func (c *tclient) connect(params map[string]any) map[string]any {
	c.t.Helper()
	c.write(map[string]any{"type": "req", "id": "c1", "method": "connect", "params": params})
	return c.res("c1")
}

func errCode(m map[string]any) (code, msg, detail string) {
	e, _ := m["error"].(map[string]any)
	if e == nil {
		return "", "", ""
	}
	code, _ = e["code"].(string)
	msg, _ = e["message"].(string)
	if d, ok := e["details"].(map[string]any); ok {
		detail, _ = d["code"].(string)
	}
	return
}

// Before connect, a client gets the challenge and nothing else: another first request, a
// non-frame, or a frame over 64 KiB ends the connection with the protocol's error; a wrong or
// missing token is AUTH_TOKEN_MISMATCH / AUTH_TOKEN_MISSING, never a dropped socket.
func TestHandshakeRefusals(t *testing.T) {
	r := newRig(t, func(c *Config) { c.HandshakeTimeout = 300 * time.Millisecond })
	cases := []struct {
		name       string
		send       func(c *tclient)
		wantDetail string
		wantMsg    string
	}{
		{"another method first", func(c *tclient) {
			c.write(map[string]any{"type": "req", "id": "x", "method": "sessions.list", "params": map[string]any{}})
		}, "", "first request must be connect"},
		{"wrong token", func(c *tclient) {
			c.write(map[string]any{"type": "req", "id": "x", "method": "connect", "params": connectBody("wrong")})
		},
			DetailAuthTokenMismatch, "token mismatch"},
		{"no token", func(c *tclient) {
			c.write(map[string]any{"type": "req", "id": "x", "method": "connect", "params": connectBody("")})
		},
			DetailAuthTokenMissing, "token missing"},
		{"protocol 3 only", func(c *tclient) {
			p := connectBody(testToken)
			p["minProtocol"], p["maxProtocol"] = 3, 3
			c.write(map[string]any{"type": "req", "id": "x", "method": "connect", "params": p})
		}, DetailProtocolMismatch, "protocol mismatch"},
		{"node role", func(c *tclient) {
			p := connectBody(testToken)
			p["role"] = "node"
			c.write(map[string]any{"type": "req", "id": "x", "method": "connect", "params": p})
		}, "", "invalid role"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := dial(t, r)
			tc.send(c)
			m := c.res("x")
			code, msg, detail := errCode(m)
			if m["ok"] != false || code != CodeInvalidRequest || detail != tc.wantDetail || !strings.Contains(msg, tc.wantMsg) {
				t.Fatalf("got %v, want INVALID_REQUEST %q (detail %q)", m, tc.wantMsg, tc.wantDetail)
			}
			if st := c.closeStatus(); st != websocket.StatusPolicyViolation {
				t.Fatalf("closed with %v, want policy violation", st)
			}
		})
	}
	t.Run("not a frame", func(t *testing.T) {
		c := dial(t, r)
		if err := c.ws.Write(testCtx(t), websocket.MessageText, []byte("hello")); err != nil {
			t.Fatal(err)
		}
		if st := c.closeStatus(); st != websocket.StatusPolicyViolation {
			t.Fatalf("closed with %v, want policy violation", st)
		}
	})
	t.Run("more than 64 KiB before connect", func(t *testing.T) {
		c := dial(t, r)
		big := map[string]any{"type": "req", "id": "x", "method": "connect", "params": map[string]any{"pad": strings.Repeat("a", 70<<10)}}
		b, _ := json.Marshal(big)
		_ = c.ws.Write(testCtx(t), websocket.MessageText, b)
		if st := c.closeStatus(); st != websocket.StatusMessageTooBig {
			t.Fatalf("closed with %v, want message too big", st)
		}
	})
	t.Run("silent client", func(t *testing.T) {
		c := dial(t, r)
		if st := c.closeStatus(); st != websocket.StatusPolicyViolation {
			t.Fatalf("a client that never sends connect: closed with %v, want policy violation", st)
		}
	})
}

// A device identity is checked: the id must be the key's fingerprint and the signature must cover
// the v3 (or v2) payload with this connection's nonce and the token.
func TestDeviceSignature(t *testing.T) {
	r := newRig(t, nil)
	pub, priv, _ := ed25519.GenerateKey(rand.Reader)
	sum := sha256.Sum256(pub)
	id := hex.EncodeToString(sum[:])
	sign := func(c *tclient, payloadNonce string, tamper func(parts []string) []string) map[string]any {
		p := connectBody(testToken)
		parts := []string{"v3", id, "test", "cli", "operator", "operator.read,operator.write", strconv.FormatInt(c.ts, 10), testToken, payloadNonce, "linux", ""}
		if tamper != nil {
			parts = tamper(parts)
		}
		sig := ed25519.Sign(priv, []byte(strings.Join(parts, "|")))
		p["device"] = map[string]any{"id": id, "publicKey": base64.RawURLEncoding.EncodeToString(pub),
			"signature": base64.RawURLEncoding.EncodeToString(sig), "signedAt": c.ts, "nonce": c.nonce}
		return p
	}
	t.Run("valid v3", func(t *testing.T) {
		c := dial(t, r)
		if m := c.connect(sign(c, c.nonce, nil)); m["ok"] != true {
			t.Fatalf("a correctly signed device was refused: %v", m)
		}
	})
	t.Run("valid v2", func(t *testing.T) {
		c := dial(t, r)
		if m := c.connect(sign(c, c.nonce, func(p []string) []string { p[0] = "v2"; return p[:9] })); m["ok"] != true {
			t.Fatalf("a v2-signed device was refused: %v", m)
		}
	})
	for _, tc := range []struct {
		name   string
		params func(c *tclient) map[string]any
		detail string
	}{
		{"signed for another nonce", func(c *tclient) map[string]any { return sign(c, "other", nil) }, DetailDeviceSigInvalid},
		{"signed other scopes", func(c *tclient) map[string]any {
			return sign(c, c.nonce, func(p []string) []string { p[5] = "operator.read"; return p })
		}, DetailDeviceSigInvalid},
		{"id not the key's", func(c *tclient) map[string]any {
			p := sign(c, c.nonce, nil)
			p["device"].(map[string]any)["id"] = strings.Repeat("0", 64)
			return p
		}, DetailDeviceIDMismatch},
		{"stale nonce field", func(c *tclient) map[string]any {
			p := sign(c, c.nonce, nil)
			p["device"].(map[string]any)["nonce"] = "stale"
			return p
		}, DetailDeviceNonceMismatch},
		{"bad key", func(c *tclient) map[string]any {
			p := sign(c, c.nonce, nil)
			p["device"].(map[string]any)["publicKey"] = "AAAA"
			return p
		}, DetailDevicePublicKeyBad},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := dial(t, r)
			m := c.connect(tc.params(c))
			if _, _, detail := errCode(m); m["ok"] != false || detail != tc.detail {
				t.Fatalf("got %v, want %s", m, tc.detail)
			}
		})
	}
}

// After connect: hello-ok lists exactly the methods that exist; an unknown method, malformed
// params and a missing scope are answered with the protocol's errors and the connection lives on.
func TestRequestsAfterConnect(t *testing.T) {
	r := newRig(t, nil)
	c := dial(t, r)
	p := connectBody(testToken)
	p["scopes"] = []string{"operator.read"}
	hello := c.connect(p)
	payload := hello["payload"].(map[string]any)
	var listed []string
	for _, m := range payload["features"].(map[string]any)["methods"].([]any) {
		listed = append(listed, m.(string))
	}
	if len(listed) != len(methods) {
		t.Fatalf("hello-ok lists %d methods, %d exist", len(listed), len(methods))
	}
	for _, m := range listed {
		if _, ok := methods[m]; !ok {
			t.Errorf("hello-ok lists %s, which is not implemented", m)
		}
	}
	if s := payload["auth"].(map[string]any)["scopes"].([]any); len(s) != 1 || s[0] != "operator.read" {
		t.Fatalf("granted scopes %v, want only operator.read", s)
	}
	for _, tc := range []struct {
		id, method string
		params     any
		code, msg  string
	}{
		{"1", "cron.list", map[string]any{}, CodeInvalidRequest, "unknown method: cron.list"},
		{"2", "chat.send", map[string]any{"sessionKey": "main", "message": "hi", "idempotencyKey": "k"}, CodeForbidden, "missing scope: operator.write"},
		{"3", "sessions.list", "not an object", CodeInvalidRequest, "invalid sessions.list params"},
		{"4", "chat.history", map[string]any{"sessionKey": "agent:main:ses_nope"}, CodeInvalidRequest, "unknown session key"},
		{"5", "environments.status", map[string]any{"environmentId": "env_x"}, CodeInvalidRequest, "unknown environment"},
	} {
		c.write(map[string]any{"type": "req", "id": tc.id, "method": tc.method, "params": tc.params})
		m := c.res(tc.id)
		if code, msg, _ := errCode(m); m["ok"] != false || code != tc.code || !strings.Contains(msg, tc.msg) {
			t.Errorf("%s: got %v, want %s %q", tc.method, m, tc.code, tc.msg)
		}
	}
	c.write(map[string]any{"type": "req", "id": "6", "method": "health", "params": map[string]any{}})
	if m := c.res("6"); m["ok"] != true {
		t.Fatalf("health after refusals: %v", m)
	}
}

// A sent message streams back as chat deltas and a final, with the client's idempotency key as
// runId, for a session named by its key.
func TestChatSendStreams(t *testing.T) {
	r := newRig(t, nil)
	s, err := r.sess.Create(context.Background(), sessions.CreateParams{Title: "t"})
	if err != nil {
		t.Fatal(err)
	}
	c := dial(t, r)
	if m := c.connect(connectBody(testToken)); m["ok"] != true {
		t.Fatal(m)
	}
	key := "agent:main:" + s.ID
	c.write(map[string]any{"type": "req", "id": "s", "method": "chat.send", "params": map[string]any{"sessionKey": key, "message": "hi", "idempotencyKey": "idem-1"}})
	var text string
	for {
		m := c.read()
		if m["type"] == "res" {
			if m["ok"] != true || m["payload"].(map[string]any)["runId"] != "idem-1" {
				t.Fatalf("chat.send answered %v", m)
			}
			continue
		}
		if m["event"] != "chat" {
			continue
		}
		p := m["payload"].(map[string]any)
		if p["runId"] != "idem-1" || p["sessionKey"] != key {
			t.Fatalf("chat event %v: want runId idem-1 and the session's key", p)
		}
		if p["state"] == "delta" {
			text += p["deltaText"].(string)
		}
		if p["state"] == "final" {
			break
		}
	}
	if text != "Hello from the fake." {
		t.Fatalf("streamed %q", text)
	}
}

// A client that never reads is cut once what is queued for it passes maxBufferedBytes: the
// gateway's memory stays bounded and the connection ends.
func TestSlowConsumerIsCut(t *testing.T) {
	r := newRig(t, func(c *Config) { c.MaxBufferedBytes = 64 << 10 })
	s, err := r.sess.Create(context.Background(), sessions.CreateParams{Title: "t"})
	if err != nil {
		t.Fatal(err)
	}
	big := strings.Repeat("x", 30<<10)
	r.srv.cfg.Turns.(*fakeTurns).deltas = []string{big, big, big, big, big, big, big, big}
	ws, _, err := websocket.Dial(testCtx(t), r.url, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ws.CloseNow()
	c := &tclient{t: t, ws: ws}
	ev := c.read()
	c.nonce = ev["payload"].(map[string]any)["nonce"].(string)
	if m := c.connect(connectBody(testToken)); m["ok"] != true {
		t.Fatal(m)
	}
	// many runs' events queue up while this client reads nothing
	for i := range 40 {
		c.write(map[string]any{"type": "req", "id": strconv.Itoa(i), "method": "chat.send",
			"params": map[string]any{"sessionKey": "agent:main:" + s.ID, "message": "hi", "idempotencyKey": "k" + strconv.Itoa(i)}})
	}
	deadline := time.Now().Add(15 * time.Second)
	for r.srv.Connections() > 0 {
		if time.Now().After(deadline) {
			t.Fatal("a client that reads nothing is still connected")
		}
		time.Sleep(20 * time.Millisecond) // polling the server's connection count
	}
	_, _, err = ws.Read(testCtx(t))
	var ce websocket.CloseError
	if errors.As(err, &ce) && ce.Code != websocket.StatusPolicyViolation {
		t.Fatalf("closed with %v, want policy violation (slow consumer)", ce)
	}
}

// The shutdown event reaches connected clients when the gateway stops, and new ones are refused.
func TestShutdownEvent(t *testing.T) {
	r := newRig(t, nil)
	c := dial(t, r)
	if m := c.connect(connectBody(testToken)); m["ok"] != true {
		t.Fatal(m)
	}
	go func() { _ = r.srv.Close(context.Background()) }()
	for {
		m := c.read()
		if m["event"] == "shutdown" {
			break
		}
	}
	if st := c.closeStatus(); st != websocket.StatusServiceRestart {
		t.Fatalf("closed with %v, want service restart", st)
	}
}

// A verified device that signs in with the operator token is issued a device token: it connects
// with that token afterwards (its signature checked again), only as that device and with the scopes
// it was issued; revoking it closes its connections and refuses it from then on.
func TestDeviceTokens(t *testing.T) {
	r := newRig(t, nil)
	pub, priv, _ := ed25519.GenerateKey(rand.Reader)
	other, otherPriv, _ := ed25519.GenerateKey(rand.Reader)
	signed := func(c *tclient, pub ed25519.PublicKey, priv ed25519.PrivateKey, token string, scopes []string) map[string]any {
		sum := sha256.Sum256(pub)
		id := hex.EncodeToString(sum[:])
		p := connectBody(token)
		p["scopes"] = scopes
		parts := []string{"v3", id, "test", "cli", "operator", strings.Join(scopes, ","), strconv.FormatInt(c.ts, 10), token, c.nonce, "linux", ""}
		p["device"] = map[string]any{"id": id, "publicKey": base64.RawURLEncoding.EncodeToString(pub),
			"signature": base64.RawURLEncoding.EncodeToString(ed25519.Sign(priv, []byte(strings.Join(parts, "|")))), "signedAt": c.ts, "nonce": c.nonce}
		return p
	}
	c := dial(t, r)
	m := c.connect(signed(c, pub, priv, testToken, []string{"operator.read"}))
	auth := m["payload"].(map[string]any)["auth"].(map[string]any)
	tok, _ := auth["deviceToken"].(string)
	if m["ok"] != true || !strings.HasPrefix(tok, DeviceTokenPrefix) {
		t.Fatalf("a verified device signing in with the operator token got no device token: %v", m)
	}

	// the device token, as that device: more scopes than it was issued is AUTH_SCOPE_MISMATCH;
	// connected with the scopes it was issued, no more
	cx := dial(t, r)
	if _, _, detail := errCode(cx.connect(signed(cx, pub, priv, tok, []string{"operator.read", "operator.admin"}))); detail != DetailAuthScopeMismatch {
		t.Errorf("a device token asking for more scopes: detail %q, want %s", detail, DetailAuthScopeMismatch)
	}
	c2 := dial(t, r)
	m = c2.connect(signed(c2, pub, priv, tok, []string{"operator.read"}))
	if m["ok"] != true {
		t.Fatalf("the device's own token was refused: %v", m)
	}
	if s := m["payload"].(map[string]any)["auth"].(map[string]any)["scopes"].([]any); len(s) != 1 || s[0] != "operator.read" {
		t.Fatalf("a device token granted %v, want only operator.read (what it was issued for)", s)
	}
	// the Control UI's reconnect: auth.deviceToken alone (no token), the signature over it
	c5 := dial(t, r)
	p5 := signed(c5, pub, priv, tok, []string{"operator.read"})
	p5["auth"] = map[string]any{"deviceToken": tok}
	if m := c5.connect(p5); m["ok"] != true {
		t.Fatalf("a reconnect with auth.deviceToken signed over it was refused: %v", m)
	}
	c2.write(map[string]any{"type": "req", "id": "w", "method": "sessions.create", "params": map[string]any{}})
	if code, _, _ := errCode(c2.res("w")); code != CodeForbidden {
		t.Fatalf("a read-only device token could write")
	}

	for name, params := range map[string]func(c *tclient) map[string]any{
		"another device":   func(c *tclient) map[string]any { return signed(c, other, otherPriv, tok, []string{"operator.read"}) },
		"no device at all": func(c *tclient) map[string]any { return connectBody(tok) },
	} {
		c3 := dial(t, r)
		if _, _, detail := errCode(c3.connect(params(c3))); detail != DetailDeviceTokenMismatch {
			t.Errorf("device token from %s: detail %q, want %s", name, detail, DetailDeviceTokenMismatch)
		}
	}

	// revoked: the open connection is closed, the token refused
	list, err := r.srv.cfg.Devices.List(context.Background())
	if err != nil || len(list) != 1 {
		t.Fatalf("devices: %v %v", list, err)
	}
	if _, err := r.srv.cfg.Devices.Revoke(context.Background(), list[0].ID); err != nil {
		t.Fatal(err)
	}
	if n := r.srv.DropDevice(list[0].ID); n != 3 {
		t.Errorf("revoking closed %d connections, want the device's 3", n)
	}
	if st := c2.closeStatus(); st != websocket.StatusPolicyViolation {
		t.Errorf("the revoked device's connection closed with %v", st)
	}
	c4 := dial(t, r)
	if _, _, detail := errCode(c4.connect(signed(c4, pub, priv, tok, []string{"operator.read"}))); detail != DetailDeviceTokenMismatch {
		t.Errorf("a revoked device token: detail %q, want %s", detail, DetailDeviceTokenMismatch)
	}
	if _, err := r.srv.cfg.Devices.Revoke(context.Background(), "nope"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("revoking an unknown device: %v", err)
	}
}

// One device holds at most MaxConnectionsPerDevice connections: past it a connect is refused
// (UNAVAILABLE, retryable) before any token is issued, another device is not affected, and a
// closed connection frees its slot.
func TestConnectionsPerDevice(t *testing.T) {
	r := newRig(t, func(c *Config) { c.MaxConnectionsPerDevice = 2 })
	pub, priv, _ := ed25519.GenerateKey(rand.Reader)
	other, otherPriv, _ := ed25519.GenerateKey(rand.Reader)
	signed := func(c *tclient, pub ed25519.PublicKey, priv ed25519.PrivateKey) map[string]any {
		sum := sha256.Sum256(pub)
		id := hex.EncodeToString(sum[:])
		p := connectBody(testToken)
		scopes := []string{"operator.read", "operator.write"}
		parts := []string{"v3", id, "test", "cli", "operator", strings.Join(scopes, ","), strconv.FormatInt(c.ts, 10), testToken, c.nonce, "linux", ""}
		p["device"] = map[string]any{"id": id, "publicKey": base64.RawURLEncoding.EncodeToString(pub),
			"signature": base64.RawURLEncoding.EncodeToString(ed25519.Sign(priv, []byte(strings.Join(parts, "|")))), "signedAt": c.ts, "nonce": c.nonce}
		return p
	}
	var open []*tclient
	for i := 0; i < 2; i++ {
		c := dial(t, r)
		if m := c.connect(signed(c, pub, priv)); m["ok"] != true {
			t.Fatalf("connection %d of the device: %v", i+1, m)
		}
		open = append(open, c)
	}
	issued, _ := r.srv.cfg.Devices.List(context.Background())
	third := dial(t, r)
	m := third.connect(signed(third, pub, priv))
	if code, msg, _ := errCode(m); code != CodeUnavailable || !strings.Contains(msg, "maxConnectionsPerDevice: 2") {
		t.Fatalf("a third connection of the device: %v", m)
	}
	if st := third.closeStatus(); st != websocket.StatusTryAgainLater {
		t.Errorf("the refused connection closed with %v, want 1013", st)
	}
	if after, _ := r.srv.cfg.Devices.List(context.Background()); len(after) != len(issued) || (len(after) == 1 && after[0].ID != issued[0].ID) {
		t.Errorf("a refused connection changed the device tokens: %v, then %v", issued, after)
	}
	o := dial(t, r)
	if m := o.connect(signed(o, other, otherPriv)); m["ok"] != true {
		t.Fatalf("another device was refused: %v", m)
	}
	_ = open[0].ws.Close(websocket.StatusNormalClosure, "")
	testenv.Eventually(t, "the closed connection's slot freed", func() bool {
		c := dial(t, r)
		ok := c.connect(signed(c, pub, priv))["ok"] == true
		_ = c.ws.Close(websocket.StatusNormalClosure, "")
		return ok
	})
}

// sessions.messages.subscribe delivers each message a session's transcript gains afterwards as
// a session.message event (entry id and position), not the messages it already had, and a
// session nobody subscribed to sends none.
func TestSessionMessageEvents(t *testing.T) {
	r := newRig(t, nil)
	ctx := testCtx(t)
	text := func(role, s string) protocol.Message {
		return protocol.Message{Role: role, Content: []protocol.Content{{Type: protocol.ContentText, Text: s}}, Timestamp: 1}
	}
	s, err := r.sess.Create(ctx, sessions.CreateParams{Title: "t"})
	if err != nil {
		t.Fatal(err)
	}
	other, err := r.sess.Create(ctx, sessions.CreateParams{Title: "other"})
	if err != nil {
		t.Fatal(err)
	}
	first, err := r.sess.Commit(ctx, sessions.CommitParams{SessionID: s.ID, OwnerEpoch: s.OwnerEpoch, RunEpoch: 1, Seq: 1,
		Messages: []protocol.Message{text(protocol.RoleUser, "before")}})
	if err != nil {
		t.Fatal(err)
	}
	c := dial(t, r)
	if m := c.connect(connectBody(testToken)); m["ok"] != true {
		t.Fatalf("connect: %v", m)
	}
	key := sessionKeyFor(s.Agent, s.ID)
	if m := call(c, "sub", "sessions.messages.subscribe", map[string]any{"key": key}); m["ok"] != true {
		t.Fatalf("subscribe: %v", m)
	}
	if _, err := r.sess.Commit(ctx, sessions.CommitParams{SessionID: other.ID, OwnerEpoch: other.OwnerEpoch, RunEpoch: 1, Seq: 1,
		Messages: []protocol.Message{text(protocol.RoleUser, "elsewhere")}}); err != nil {
		t.Fatal(err)
	}
	res, err := r.sess.Commit(ctx, sessions.CommitParams{SessionID: s.ID, OwnerEpoch: s.OwnerEpoch, RunEpoch: 2, Seq: 1, BaseLeafID: first.NewLeafID,
		Messages: []protocol.Message{text(protocol.RoleUser, "hello"), text(protocol.RoleAssistant, "hi there")}})
	if err != nil {
		t.Fatal(err)
	}
	var got []map[string]any
	for len(got) < 2 {
		m := c.read()
		if m["type"] != "event" || m["event"] != "session.message" {
			continue
		}
		got = append(got, m["payload"].(map[string]any))
	}
	for i, want := range []struct{ text string }{{"hello"}, {"hi there"}} {
		p := got[i]
		msg, _ := p["message"].(map[string]any)
		content, _ := msg["content"].([]any)
		var txt string
		if len(content) == 1 {
			txt, _ = content[0].(map[string]any)["text"].(string)
		}
		if p["sessionKey"] != key || p["messageId"] != res.EntryIDs[i] || p["messageSeq"] != float64(i+2) || txt != want.text {
			t.Fatalf("session.message %d: %v, want %q as entry %s at position %d of %s", i, p, want.text, res.EntryIDs[i], i+2, key)
		}
	}
	// After unsubscribe the session's messages stop; the other session's, subscribed now, come.
	if m := call(c, "unsub", "sessions.messages.unsubscribe", map[string]any{"key": key}); m["ok"] != true {
		t.Fatalf("unsubscribe: %v", m)
	}
	otherKey := sessionKeyFor(other.Agent, other.ID)
	if m := call(c, "sub2", "sessions.messages.subscribe", map[string]any{"key": otherKey}); m["ok"] != true {
		t.Fatalf("subscribe: %v", m)
	}
	if _, err := r.sess.Commit(ctx, sessions.CommitParams{SessionID: s.ID, OwnerEpoch: s.OwnerEpoch, RunEpoch: 3, Seq: 1, BaseLeafID: res.NewLeafID,
		Messages: []protocol.Message{text(protocol.RoleUser, "after unsubscribe")}}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.sess.Commit(ctx, sessions.CommitParams{SessionID: other.ID, OwnerEpoch: other.OwnerEpoch, RunEpoch: 2, Seq: 1,
		BaseLeafID: mustLeaf(t, r, other.ID), Messages: []protocol.Message{text(protocol.RoleUser, "to the other")}}); err != nil {
		t.Fatal(err)
	}
	for {
		m := c.read()
		if m["type"] != "event" || m["event"] != "session.message" {
			continue
		}
		p := m["payload"].(map[string]any)
		if p["sessionKey"] == key {
			t.Fatalf("a session.message after unsubscribe: %v", p)
		}
		if p["sessionKey"] == otherKey {
			break
		}
	}
}

func mustLeaf(t *testing.T, r *rig, id string) string {
	t.Helper()
	s, err := r.sess.Get(testCtx(t), id)
	if err != nil {
		t.Fatal(err)
	}
	return s.LeafID
}

// A turn that moves live between owners is one run to an OpenClaw client: one lifecycle start
// and one end, one final chat message with the whole reply, and a seq that only rises across the
// move.
func TestALiveMoveIsOneTurnToAClient(t *testing.T) {
	r := newRig(t, func(c *Config) { c.Turns.(*fakeTurns).moves = true })
	s, err := r.sess.Create(context.Background(), sessions.CreateParams{Title: "t"})
	if err != nil {
		t.Fatal(err)
	}
	c := dial(t, r)
	if m := c.connect(connectBody(testToken)); m["ok"] != true {
		t.Fatal(m)
	}
	key := "agent:main:" + s.ID
	c.write(map[string]any{"type": "req", "id": "s", "method": "chat.send", "params": map[string]any{"sessionKey": key, "message": "hi", "idempotencyKey": "idem-live"}})
	var text string
	var phases []string
	var last float64 // agent and chat events of a run share one seq
	for {
		m := c.read()
		if m["type"] != "event" || (m["event"] != "chat" && m["event"] != "agent") {
			continue
		}
		p := m["payload"].(map[string]any)
		seq, _ := p["seq"].(float64)
		if seq <= last {
			t.Fatalf("%s seq %v after %v", m["event"], seq, last)
		}
		last = seq
		if m["event"] == "agent" && p["stream"] == "lifecycle" {
			phases = append(phases, p["data"].(map[string]any)["phase"].(string))
			continue
		}
		if m["event"] != "chat" {
			continue
		}
		switch p["state"] {
		case "delta":
			text += p["deltaText"].(string)
		case "final":
			if text != "Hello from the fake." {
				t.Fatalf("streamed %q across the move", text)
			}
			if !slices.Equal(phases, []string{"start", "end"}) {
				t.Fatalf("lifecycle phases %v, want one start and one end", phases)
			}
			return
		default:
			t.Fatalf("chat state %v during a live move", p["state"])
		}
	}
}

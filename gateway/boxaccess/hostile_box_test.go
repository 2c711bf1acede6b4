package boxaccess_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/coder/websocket/wsjson"
	"github.com/labstack/echo/v4"
	"golang.org/x/crypto/ssh"

	"github.com/openclaw/cloudworkers/gateway/boxaccess"
	"github.com/openclaw/cloudworkers/gateway/envs"
	"github.com/openclaw/cloudworkers/gateway/profiles"
	"github.com/openclaw/cloudworkers/gateway/store/storetest"
	"github.com/openclaw/cloudworkers/gateway/tunnel/tunneltest"
	"github.com/openclaw/cloudworkers/internal/testrig/testenv"
	"github.com/openclaw/cloudworkers/providers"
	"github.com/openclaw/cloudworkers/providers/fake"
)

// stallingBox is an SSH server on loopback that completes the handshake and then never answers
// the channel open (stallOpen) or the exec request of a session it accepted.
func stallingBox(t *testing.T, stallOpen bool) string {
	return sshBox(t, nil, func(_ net.Conn, nch ssh.NewChannel) {
		if stallOpen {
			return // never accepted, never rejected
		}
		_, reqs, err := nch.Accept()
		if err != nil {
			return
		}
		for range reqs { // every request is left unanswered
		}
	})
}

// boxService serves the box access routes of one environment (with a worker recorded) whose
// box is at addr.
func boxService(t *testing.T, addr string, startTimeout time.Duration) (baseURL, envID string) {
	t.Helper()
	return boxServiceWith(t, addr, func(_ *boxaccess.Config, d *boxaccess.Deps) { d.StartTimeout = startTimeout })
}

// boxServiceWith is boxService with mod applied to the service's config and deps.
func boxServiceWith(t *testing.T, addr string, mod func(*boxaccess.Config, *boxaccess.Deps)) (baseURL, envID string) {
	t.Helper()
	ctx := testenv.Context(t, 20*time.Second)
	prov := fake.New()
	reg := providers.Registry{"fake": prov}
	db := storetest.Open(t)
	prof := profiles.New(db, reg, nil)
	if _, err := prof.Put(ctx, &providers.Profile{ID: "p1", Provider: "fake", MaxEnvironments: 1}); err != nil {
		t.Fatal(err)
	}
	mgr := envs.New(envs.Config{DB: db, Profiles: prof, Providers: reg, GatewayID: "gw_test", SweepInterval: -1})
	if err := mgr.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = mgr.Close(context.Background()) })
	e, _, err := mgr.Create(ctx, "p1", "k1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := mgr.WaitFor(ctx, e.ID, func(e envs.Environment) bool { return e.State == envs.Bootstrapping }); err != nil {
		t.Fatal(err)
	}
	if err := mgr.SetWorker(ctx, e.ID, "h", "/tmp/sock", "/home/box"); err != nil {
		t.Fatal(err)
	}
	deps := boxaccess.Deps{Envs: mgr,
		Dial: func(ctx context.Context, _ envs.Environment) (*ssh.Client, error) {
			var d net.Dialer
			nc, err := d.DialContext(ctx, "tcp", addr)
			if err != nil {
				return nil, err
			}
			c, chans, reqs, err := ssh.NewClientConn(nc, addr, &ssh.ClientConfig{User: "u", HostKeyCallback: ssh.InsecureIgnoreHostKey()})
			if err != nil {
				nc.Close()
				return nil, err
			}
			return ssh.NewClient(c, chans, reqs), nil
		}}
	var cfg boxaccess.Config
	mod(&cfg, &deps)
	svc, err := boxaccess.New(cfg, deps)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := svc.Close(cctx); err != nil {
			t.Errorf("box access close: %v", err)
		}
	})
	ec := echo.New()
	// errors carry their text, as the gateway's API renders them
	ec.HTTPErrorHandler = func(err error, c echo.Context) {
		code, msg := http.StatusInternalServerError, err.Error()
		if he, ok := err.(*echo.HTTPError); ok {
			code, msg = he.Code, fmt.Sprint(he.Message)
		}
		_ = c.JSON(code, map[string]string{"message": msg})
	}
	boxaccess.RegisterAPI(ec.Group("/api/v1"), svc)
	srv := httptest.NewServer(ec)
	t.Cleanup(srv.Close)
	return srv.URL, e.ID
}

// A box that accepts the SSH connection but never opens the session, or never starts the
// command, gets the exec refused after box.commandTimeout, with an exit naming it.
func TestExecOnABoxThatNeverStartsTheCommandEnds(t *testing.T) {
	for _, stallOpen := range []bool{true, false} {
		name := map[bool]string{true: "channel open unanswered", false: "exec request unanswered"}[stallOpen]
		t.Run(name, func(t *testing.T) {
			base, id := boxService(t, stallingBox(t, stallOpen), 300*time.Millisecond)
			ctx := testenv.Context(t, 15*time.Second)
			ws := startExec(ctx, t, base, id, "true")
			var m boxaccess.Control
			for {
				typ, b, err := ws.Read(ctx)
				if err != nil {
					t.Fatalf("no exit from the gateway while the box never started the command: %v", err)
				}
				if typ == websocket.MessageText {
					if err := jsonUnmarshal(b, &m); err != nil {
						t.Fatal(err)
					}
					break
				}
			}
			if m.Type != boxaccess.ControlExit || m.Exit == nil || !strings.Contains(m.Exit.Error, "box.commandTimeout") {
				t.Fatalf("exit %+v, want an error naming box.commandTimeout", m.Exit)
			}
		})
	}
}

// env logs on a box that never answers ends with an error naming box.commandTimeout instead of
// holding the request (and one of the environment's box sessions) for as long as the box likes.
func TestLogsOnABoxThatNeverAnswersEnds(t *testing.T) {
	for _, stallOpen := range []bool{true, false} {
		name := map[bool]string{true: "channel open unanswered", false: "exec request unanswered"}[stallOpen]
		t.Run(name, func(t *testing.T) {
			base, id := boxService(t, stallingBox(t, stallOpen), 300*time.Millisecond)
			resp, b := getLogs(t, base, id)
			if resp.StatusCode != http.StatusGatewayTimeout || !strings.Contains(string(b), "box.commandTimeout") {
				t.Fatalf("%d %s, want 504 naming box.commandTimeout", resp.StatusCode, b)
			}
		})
	}
}

func jsonUnmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }

// freezingConn is a box's side of its connection that, once frozen, takes in what the gateway
// sends and answers nothing; hungUp closes when the gateway closes the connection.
type freezingConn struct {
	net.Conn
	frozen atomic.Bool
	execed chan struct{} // closed at the exec request
	hungUp chan struct{}
}

func (c *freezingConn) Read(p []byte) (int, error) {
	for {
		n, err := c.Conn.Read(p)
		if err != nil {
			close(c.hungUp)
			return n, err
		}
		if !c.frozen.Load() {
			return n, nil
		}
	}
}

// freezingBox starts the command it is asked for, then stops answering anything (it answers
// neither the close of the session nor keepalives). It sends on conns each connection's.
func freezingBox(t *testing.T, conns chan<- *freezingConn) string {
	wrap := func(raw net.Conn) net.Conn {
		nc := &freezingConn{Conn: raw, execed: make(chan struct{}), hungUp: make(chan struct{})}
		conns <- nc
		return nc
	}
	return sshBox(t, wrap, func(c net.Conn, nch ssh.NewChannel) {
		nc := c.(*freezingConn)
		_, reqs, err := nch.Accept()
		if err != nil {
			return
		}
		for req := range reqs {
			if req.Type == "exec" {
				nc.frozen.Store(true) // from here on nothing the gateway sends is read
				_ = req.Reply(true, nil)
				close(nc.execed) // and the session gets no output, no exit status, no close
			} else if req.WantReply {
				_ = req.Reply(false, nil)
			}
		}
	})
}

// An operator who leaves an exec on a box that stopped answering frees the session: the
// gateway hangs up on the box instead of waiting for it to answer the session's close.
func TestExecLeftOnAFrozenBoxHangsUpOnTheBox(t *testing.T) {
	conns := make(chan *freezingConn, 4)
	base, id := boxService(t, freezingBox(t, conns), 5*time.Second)
	ctx := testenv.Context(t, 15*time.Second)
	ws := startExec(ctx, t, base, id, "sleep", "infinity")
	var box *freezingConn
	select {
	case box = <-conns:
	case <-ctx.Done():
		t.Fatal("the gateway never connected to the box")
	}
	select {
	case <-box.execed:
	case <-ctx.Done():
		t.Fatal("the gateway never asked the box to start the command")
	}
	ws.CloseNow() // the operator leaves (Ctrl-C, lost network)
	select {
	case <-box.hungUp:
	case <-ctx.Done():
		t.Fatal("the gateway still holds the connection to a frozen box its operator left")
	}
}

// A box that never reads its command's stdin cannot hold the session: the gateway keeps reading
// the operator's socket (a queue of input waits for the box), and once the box has taken nothing
// for boxAccess.stdinStall the session ends, hangs up on the box and says why.
func TestExecOnABoxThatNeverReadsStdinEnds(t *testing.T) {
	conns := make(chan *freezingConn, 4)
	base, id := boxServiceWith(t, freezingBox(t, conns), func(c *boxaccess.Config, d *boxaccess.Deps) {
		d.StartTimeout, c.StdinStall = 5*time.Second, providers.Duration(300*time.Millisecond)
	})
	ctx := testenv.Context(t, 15*time.Second)
	ws := startExec(ctx, t, base, id, "cat")
	box := <-conns
	select {
	case <-box.execed:
	case <-ctx.Done():
		t.Fatal("the gateway never asked the box to start the command")
	}
	frame := append([]byte{boxaccess.StreamStdin}, make([]byte, 32<<10)...)
	sent := 0
	for ; sent < 8<<20; sent += len(frame) - 1 { // more than the SSH window and the queue
		if err := ws.Write(ctx, websocket.MessageBinary, frame); err != nil {
			break // the gateway closed the session
		}
	}
	var exit *boxaccess.Exit
	for exit == nil {
		typ, b, err := ws.Read(ctx)
		if err != nil {
			t.Fatalf("no exit after sending %d bytes the box never reads: %v", sent, err)
		}
		var m boxaccess.Control
		if typ == websocket.MessageText && json.Unmarshal(b, &m) == nil && m.Type == boxaccess.ControlExit {
			exit = m.Exit
		}
	}
	if exit.Code != -1 || !strings.Contains(exit.Error, "did not read the command's input for 300ms") {
		t.Fatalf("exit %+v, want the unread input named", exit)
	}
	select {
	case <-box.hungUp:
	case <-ctx.Done():
		t.Fatal("the gateway still holds the connection to the box")
	}
}

// scriptedBox is an SSH server on loopback that hands each channel the gateway opens to handle.
func scriptedBox(t *testing.T, handle func(ssh.NewChannel)) string {
	return sshBox(t, nil, func(_ net.Conn, nch ssh.NewChannel) { handle(nch) })
}

// sshBox is an SSH server on loopback (without authentication) that hands each channel the
// gateway opens to handle, with the box's side of its connection (wrapped by wrap, when given).
func sshBox(t *testing.T, wrap func(net.Conn) net.Conn, handle func(net.Conn, ssh.NewChannel)) string {
	t.Helper()
	_, signer := tunneltest.Key(t)
	cfg := &ssh.ServerConfig{NoClientAuth: true}
	cfg.AddHostKey(signer)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			if wrap != nil {
				nc = wrap(nc)
			}
			go func() {
				defer nc.Close()
				context.AfterFunc(t.Context(), func() { nc.Close() })
				_, chans, reqs, err := ssh.NewServerConn(nc, cfg)
				if err != nil {
					return
				}
				go ssh.DiscardRequests(reqs)
				for nch := range chans {
					go handle(nc, nch)
				}
			}()
		}
	}()
	return ln.Addr().String()
}

// hostileText is what a box puts where the operator's terminal shows it: escape sequences that
// retitle the window and clear the screen, and far more than a message needs.
var hostileText = "\x1b]0;owned\x07\x1b[2J\x1b[31mBOOM\r" + strings.Repeat("A", 100<<10)

// clean reports what is wrong with a text from the box as the operator would see it.
func clean(s string) string {
	if strings.ContainsAny(s, "\x1b\x07\r") {
		return "holds control characters"
	}
	if len(s) > 4096 {
		return "is " + strconv.Itoa(len(s)) + " bytes"
	}
	return ""
}

// execExit runs one command on the box at addr and returns its exit.
func execExit(t *testing.T, addr string) boxaccess.Exit {
	t.Helper()
	base, id := boxService(t, addr, 5*time.Second)
	ctx := testenv.Context(t, 15*time.Second)
	ws := startExec(ctx, t, base, id, "true")
	ws.SetReadLimit(1 << 20)
	for {
		typ, b, err := ws.Read(ctx)
		if err != nil {
			t.Fatalf("no exit: %v", err)
		}
		var m boxaccess.Control
		if typ == websocket.MessageText && json.Unmarshal(b, &m) == nil && m.Type == boxaccess.ControlExit && m.Exit != nil {
			return *m.Exit
		}
	}
}

// What a box says about how a command ended (a refused session's message, an exit signal's
// name) reaches the operator's terminal without its control characters, and bounded.
func TestExecExitFromAHostileBoxIsPrintable(t *testing.T) {
	t.Run("session refused with a hostile message", func(t *testing.T) {
		exit := execExit(t, scriptedBox(t, func(nch ssh.NewChannel) { _ = nch.Reject(ssh.Prohibited, hostileText) }))
		if exit.Error == "" || clean(exit.Error) != "" {
			t.Fatalf("exit error %s: %.200q", clean(exit.Error), exit.Error)
		}
	})
	t.Run("exit signal with a hostile name", func(t *testing.T) {
		exit := execExit(t, scriptedBox(t, onExec(func(ch ssh.Channel) {
			_, _ = ch.SendRequest("exit-signal", false, ssh.Marshal(struct {
				Signal     string
				CoreDumped bool
				Msg, Lang  string
			}{Signal: hostileText}))
		})))
		if exit.Signal+exit.Error == "" || clean(exit.Signal) != "" || clean(exit.Error) != "" {
			t.Fatalf("exit signal %s, error %s: %.200q %.200q", clean(exit.Signal), clean(exit.Error), exit.Signal, exit.Error)
		}
	})
}

// env logs on a box that refuses the session, or fails the tail with a hostile stderr, answers
// an error without the box's control characters, bounded.
func TestLogsErrorFromAHostileBoxIsPrintable(t *testing.T) {
	for name, handle := range map[string]func(ssh.NewChannel){
		"session refused": func(nch ssh.NewChannel) { _ = nch.Reject(ssh.Prohibited, hostileText) },
		"tail fails": onExec(func(ch ssh.Channel) {
			_, _ = ch.Stderr().Write([]byte(hostileText[:4000]))
			_, _ = ch.SendRequest("exit-status", false, ssh.Marshal(struct{ Status uint32 }{1}))
		}),
	} {
		t.Run(name, func(t *testing.T) {
			base, id := boxService(t, scriptedBox(t, handle), 5*time.Second)
			resp, b := getLogs(t, base, id)
			var body struct {
				Message string `json:"message"`
			}
			if err := json.Unmarshal(b, &body); err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode < 400 || body.Message == "" || clean(body.Message) != "" {
				t.Fatalf("%d, message %s: %.200q", resp.StatusCode, clean(body.Message), body.Message)
			}
		})
	}
}

// startExec opens an exec of argv on the environment id; the socket is closed when t ends.
func startExec(ctx context.Context, t *testing.T, base, id string, argv ...string) *websocket.Conn {
	t.Helper()
	ws, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(base, "http")+"/api/v1/environments/"+id+"/exec", nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ws.CloseNow() })
	if err := wsjson.Write(ctx, ws, boxaccess.Start{Command: argv}); err != nil {
		t.Fatal(err)
	}
	return ws
}

// getLogs asks for the environment id's worker log and returns the answer and its body.
func getLogs(t *testing.T, base, id string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequestWithContext(testenv.Context(t, 15*time.Second), http.MethodGet, base+"/api/v1/environments/"+id+"/logs", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("no answer from env logs: %v", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, b
}

// onExec is a box's session that runs the exec it is asked for as do, then closes.
func onExec(do func(ssh.Channel)) func(ssh.NewChannel) {
	return func(nch ssh.NewChannel) {
		ch, reqs, err := nch.Accept()
		if err != nil {
			return
		}
		for req := range reqs {
			_ = req.Reply(req.Type == "exec", nil)
			if req.Type == "exec" {
				do(ch)
				ch.Close()
			}
		}
	}
}

package tunnel

import (
	"errors"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/openclaw/cloudworkers/internal/testrig/testenv"
)

func TestHubForwardsConnections(t *testing.T) {
	b := startBox(t)
	h, log := testHub(t, nil)
	ctx := testContext(t)
	if err := h.Open(ctx, b.target("env-a", "")); err != nil {
		t.Fatalf("open: %v", err)
	}
	if s := h.Status("env-a"); s != StatusConnected {
		t.Fatalf("status = %s, want connected", s)
	}
	if h.Client("env-a") == nil || h.Epoch("env-a") != 1 {
		t.Fatalf("client = %v, epoch = %d; want a client and epoch 1", h.Client("env-a"), h.Epoch("env-a"))
	}
	sock := b.socket(testSocket)
	fi, err := os.Stat(filepath.Dir(sock))
	if err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("socket directory: %v, %v; want mode 0700", fi, err)
	}

	w := dialSocket(t, sock)
	c := acceptOne(t, h)
	if c.EnvironmentID != "env-a" || c.Epoch != 1 {
		t.Fatalf("conn tagged %s/%d, want env-a/1", c.EnvironmentID, c.Epoch)
	}
	roundTrip(t, w, c, "hello from the worker")
	if got := log.get("env-a"); !slices.Equal(got, []Status{StatusConnecting, StatusConnected}) {
		t.Errorf("statuses = %v", got)
	}
}

func TestHubReplacesStaleSocket(t *testing.T) {
	tests := []struct {
		name   string
		socket string
		stale  func(t *testing.T, path string)
	}{
		{"stale socket", testSocket, func(t *testing.T, path string) {
			ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
			if err != nil {
				t.Fatal(err)
			}
			ln.SetUnlinkOnClose(false)
			ln.Close()
		}},
		{"leftover file", testSocket, func(t *testing.T, path string) {
			if err := os.WriteFile(path, []byte("x"), 0o600); err != nil {
				t.Fatal(err)
			}
		}},
		{"quoted path", "it's here/$(touch pwned)/gw.sock", func(t *testing.T, path string) {}},
		{"home prefix", "~/.ocw/gw.sock", func(t *testing.T, path string) {}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := startBox(t)
			sock := b.socket(strings.TrimPrefix(tt.socket, "~/"))
			if err := os.MkdirAll(filepath.Dir(sock), 0o700); err != nil {
				t.Fatal(err)
			}
			tt.stale(t, sock)
			h, _ := testHub(t, nil)
			tg := b.target("env-a", "")
			tg.SocketPath = tt.socket
			if tt.name == "quoted path" {
				tg.SocketPath = sock // absolute
			}
			if err := h.Open(testContext(t), tg); err != nil {
				t.Fatalf("open: %v", err)
			}
			fi, err := os.Lstat(sock)
			if err != nil || fi.Mode()&fs.ModeSocket == 0 {
				t.Fatalf("socket: %v, %v", fi, err)
			}
			w := dialSocket(t, sock)
			c := acceptOne(t, h)
			roundTrip(t, w, c, "ping")
			if _, err := os.Stat(filepath.Join(b.Dir, "pwned")); err == nil {
				t.Error("socket path was interpreted by the shell")
			}
		})
	}
}

// The forwarded socket's directory must be the box user's own: one that is a symlink, or that
// another user made first (on a shared /tmp), is refused before anything listens in it, since its
// owner could swap the socket and read the worker's credential. One of the box user's with a wider
// mode is made 0700.
func TestHubRefusesASocketDirectoryOfAnotherUser(t *testing.T) {
	for _, tc := range []struct {
		name  string
		plant func(t *testing.T, dir string)
		ok    bool
	}{
		{"symlink", func(t *testing.T, dir string) {
			if err := os.Symlink(t.TempDir(), dir); err != nil {
				t.Fatal(err)
			}
		}, false},
		{"another user's directory", func(t *testing.T, dir string) {
			if os.Geteuid() != 0 {
				testenv.Integration(t, "needs root to make a directory of another user")
			}
			if err := os.Mkdir(dir, 0o777); err != nil {
				t.Fatal(err)
			}
			if err := os.Chown(dir, 65534, 65534); err != nil {
				t.Fatal(err)
			}
		}, false},
		{"the box user's, mode 0755", func(t *testing.T, dir string) {
			if err := os.Mkdir(dir, 0o755); err != nil {
				t.Fatal(err)
			}
		}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := startBox(t)
			dir := b.socket("sockdir")
			tc.plant(t, dir)
			h, _ := testHub(t, nil)
			tg := b.target("env-a", "")
			tg.SocketPath = filepath.Join(dir, "gw.sock")
			err := h.Open(testContext(t), tg)
			if !tc.ok {
				if err == nil || !strings.Contains(err.Error(), "not a directory of the box user") {
					t.Fatalf("open with the socket in %s: %v, want it refused", tc.name, err)
				}
				if _, err := os.Lstat(tg.SocketPath); !errors.Is(err, fs.ErrNotExist) {
					t.Fatalf("a socket was made in %s: %v", tc.name, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 {
				t.Fatalf("socket directory after open: %v, %v; want mode 0700", fi, err)
			}
		})
	}
}

func TestHubHostKeyMismatchIsPermanent(t *testing.T) {
	b := startBox(t)
	p := startProxy(t, b.target("x", "").addr())
	var mu sync.Mutex
	var reported []*HostKeyMismatchError
	h, log := testHub(t, func(c *Config) {
		c.OnHostKeyMismatch = func(env string, err *HostKeyMismatchError) {
			mu.Lock()
			defer mu.Unlock()
			if env == "env-a" {
				reported = append(reported, err)
			}
		}
	})
	_, other := writeKey(t)
	tg := b.target("env-a", p.addr())
	tg.HostKeys = []string{authorizedKey(other.PublicKey())}

	err := h.Open(testContext(t), tg)
	var mm *HostKeyMismatchError
	if !errors.As(err, &mm) {
		t.Fatalf("open: %v, want *HostKeyMismatchError", err)
	}
	if mm.Presented == "" || len(mm.Expected) != 1 || mm.Expected[0] == mm.Presented {
		t.Fatalf("mismatch = %+v", mm)
	}
	// Open returns only once the tunnel has stopped, so no dial can follow.
	mu.Lock()
	n := len(reported)
	mu.Unlock()
	if n != 1 || reported[0] != mm {
		t.Errorf("OnHostKeyMismatch called %d times", n)
	}
	if s := h.Status("env-a"); s != StatusStopped {
		t.Errorf("status = %s, want stopped", s)
	}
	if got := p.acceptedCount(); got != 1 {
		t.Errorf("%d dials, want 1 (no retry after a host key mismatch)", got)
	}
	if got := log.get("env-a"); !slices.Equal(got, []Status{StatusConnecting, StatusStopped}) {
		t.Errorf("statuses = %v", got)
	}
}

func TestHubRetriesWrongClientKey(t *testing.T) {
	b := startBox(t)
	p := startProxy(t, b.target("x", "").addr())
	h, log := testHub(t, nil)
	keyPath, _ := writeKey(t)
	tg := b.target("env-a", p.addr())
	tg.KeyPath = keyPath

	err := h.Open(testContext(t), tg)
	if err == nil || isMismatch(err) {
		t.Fatalf("open with an unauthorized key: %v", err)
	}
	if s := h.Status("env-a"); s != StatusConnecting {
		t.Errorf("status = %s, want connecting", s)
	}
	testenv.Eventually(t, "a retry", func() bool { return p.acceptedCount() >= 3 })
	h.CloseEnv("env-a")
	if s := h.Status("env-a"); s != StatusStopped {
		t.Errorf("status after CloseEnv = %s", s)
	}
	if got := log.get("env-a"); !slices.Equal(got, []Status{StatusConnecting, StatusStopped}) {
		t.Errorf("statuses = %v", got)
	}
}

func TestHubReconnectsAfterPartition(t *testing.T) {
	b := startBox(t)
	p := startProxy(t, b.target("x", "").addr())
	h, log := testHub(t, func(c *Config) {
		c.KeepaliveInterval = 50 * time.Millisecond
		c.KeepaliveTimeout = 500 * time.Millisecond
	})
	ctx := testContext(t)
	if err := h.Open(ctx, b.target("env-a", p.addr())); err != nil {
		t.Fatalf("open: %v", err)
	}
	sock := b.socket(testSocket)
	w := dialSocket(t, sock)
	c := acceptOne(t, h)
	roundTrip(t, w, c, "before")
	before := c.Epoch
	if n := reconnects(t, h); n != 0 {
		t.Fatalf("openclaw_tunnel_reconnects_total = %v before any loss", n)
	}

	p.pause()
	testenv.Eventually(t, "status reconnecting", func() bool { return h.Status("env-a") == StatusReconnecting })
	if h.Client("env-a") != nil || h.Epoch("env-a") != 0 {
		t.Error("a client is offered while reconnecting")
	}
	p.unpause()
	testenv.Eventually(t, "status connected", func() bool { return h.Status("env-a") == StatusConnected })
	after := h.Epoch("env-a")
	if after <= before {
		t.Fatalf("epoch after reconnect = %d, before %d", after, before)
	}
	if n := reconnects(t, h); n != 1 {
		t.Errorf("openclaw_tunnel_reconnects_total = %v after one reconnect, want 1", n)
	}

	w2 := dialSocket(t, sock)
	c2 := acceptOne(t, h)
	if c2.EnvironmentID != "env-a" || c2.Epoch < after {
		t.Fatalf("conn after reconnect tagged %s/%d, want env-a/>=%d", c2.EnvironmentID, c2.Epoch, after)
	}
	roundTrip(t, w2, c2, "after")

	// The connection of the old epoch ended with its control connection.
	if _, err := io.ReadFull(c, make([]byte, 1)); err == nil {
		t.Error("connection of the old epoch still open")
	}
	got := log.get("env-a")
	if len(got) < 4 || !slices.Equal(got[:4], []Status{StatusConnecting, StatusConnected, StatusReconnecting, StatusConnected}) {
		t.Errorf("statuses = %v", got)
	}
}

func TestHubTwoEnvironments(t *testing.T) {
	ba, bb := startBox(t), startBox(t)
	h, _ := testHub(t, nil)
	ctx := testContext(t)
	for env, b := range map[string]box{"env-a": ba, "env-b": bb} {
		if err := h.Open(ctx, b.target(env, "")); err != nil {
			t.Fatalf("open %s: %v", env, err)
		}
	}
	wa := dialSocket(t, ba.socket(testSocket))
	ca := acceptOne(t, h)
	wb := dialSocket(t, bb.socket(testSocket))
	cb := acceptOne(t, h)
	if ca.EnvironmentID != "env-a" || cb.EnvironmentID != "env-b" || ca.Epoch != 1 || cb.Epoch != 1 {
		t.Fatalf("tags: %s/%d, %s/%d", ca.EnvironmentID, ca.Epoch, cb.EnvironmentID, cb.Epoch)
	}
	roundTrip(t, wa, ca, "to a")
	roundTrip(t, wb, cb, "to b")

	h.CloseEnv("env-a")
	if h.Status("env-a") != StatusStopped || h.Status("env-b") != StatusConnected {
		t.Fatalf("statuses after closing env-a: %s, %s", h.Status("env-a"), h.Status("env-b"))
	}
	roundTrip(t, wb, cb, "still b")
}

func TestHubOpenReplacesTunnel(t *testing.T) {
	b := startBox(t)
	h, log := testHub(t, nil)
	ctx := testContext(t)
	tg := b.target("env-a", "")
	tg.EpochBase = 41
	if err := h.Open(ctx, tg); err != nil {
		t.Fatal(err)
	}
	w := dialSocket(t, b.socket(testSocket))
	c := acceptOne(t, h)
	if c.Epoch != 42 {
		t.Fatalf("epoch = %d, want 42 (above EpochBase)", c.Epoch)
	}
	if err := h.Open(ctx, tg); err != nil {
		t.Fatal(err)
	}
	if e := h.Epoch("env-a"); e != 43 {
		t.Fatalf("epoch after replace = %d, want 43", e)
	}
	if _, err := io.ReadFull(c, make([]byte, 1)); err == nil {
		t.Error("connection of the replaced tunnel still open")
	}
	w.Close()
	w2 := dialSocket(t, b.socket(testSocket))
	c2 := acceptOne(t, h)
	if c2.Epoch != 43 {
		t.Fatalf("epoch = %d, want 43", c2.Epoch)
	}
	roundTrip(t, w2, c2, "replaced")

	h.CloseEnv("env-a")
	if err := h.Open(ctx, tg); err != nil {
		t.Fatal(err)
	}
	if e := h.Epoch("env-a"); e != 44 {
		t.Fatalf("epoch after close and reopen = %d, want 44", e)
	}
	want := []Status{StatusConnecting, StatusConnected, StatusStopped, StatusConnecting, StatusConnected,
		StatusStopped, StatusConnecting, StatusConnected}
	if got := log.get("env-a"); !slices.Equal(got, want) {
		t.Errorf("statuses = %v, want %v", got, want)
	}
}

func TestHubBacklogFull(t *testing.T) {
	b := startBox(t)
	h, _ := testHub(t, func(c *Config) { c.AcceptBacklog = 1 })
	if err := h.Open(testContext(t), b.target("env-a", "")); err != nil {
		t.Fatal(err)
	}
	sock := b.socket(testSocket)
	w1 := dialSocket(t, sock)
	testenv.Eventually(t, "first connection queued", func() bool { return len(h.queue) == 1 })
	w2 := dialSocket(t, sock)
	// The forward does not stall: the second connection is closed, not left hanging.
	_ = w2.SetReadDeadline(time.Now().Add(waitLong))
	if _, err := w2.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Fatalf("read on a connection beyond the backlog: %v, want EOF", err)
	}
	c := acceptOne(t, h)
	roundTrip(t, w1, c, "first")
	w3 := dialSocket(t, sock)
	c3 := acceptOne(t, h)
	roundTrip(t, w3, c3, "third")
}

func TestCloseEnvStopsEverything(t *testing.T) {
	b := startBox(t)
	baseline := runtime.NumGoroutine()
	h := NewMux(Config{KeepaliveInterval: 20 * time.Millisecond, BackoffMin: 10 * time.Millisecond})
	if err := h.Open(testContext(t), b.target("env-a", "")); err != nil {
		t.Fatal(err)
	}
	sock := b.socket(testSocket)
	w := dialSocket(t, sock)
	c := acceptOne(t, h)
	roundTrip(t, w, c, "x")

	h.CloseEnv("env-a")
	if s := h.Status("env-a"); s != StatusStopped || h.Client("env-a") != nil {
		t.Fatalf("after CloseEnv: status %s, client %v", s, h.Client("env-a"))
	}
	testenv.Eventually(t, "forward cancelled", func() bool {
		_, err := os.Lstat(sock)
		return errors.Is(err, fs.ErrNotExist)
	})
	if _, err := io.ReadFull(c, make([]byte, 1)); err == nil {
		t.Error("accepted connection outlived CloseEnv")
	}
	w.Close()
	c.Close()
	h.CloseEnv("env-a") // twice is harmless
	checkNoLeak(t, baseline)
	if err := h.Close(testContext(t)); err != nil {
		t.Fatal(err)
	}
	checkNoLeak(t, baseline)
}

func TestHubCloseStopsEverything(t *testing.T) {
	ba, bb := startBox(t), startBox(t)
	baseline := runtime.NumGoroutine()
	h := NewMux(Config{KeepaliveInterval: 20 * time.Millisecond, BackoffMin: 10 * time.Millisecond})
	ctx := testContext(t)
	for env, b := range map[string]box{"env-a": ba, "env-b": bb} {
		if err := h.Open(ctx, b.target(env, "")); err != nil {
			t.Fatalf("open %s: %v", env, err)
		}
	}
	// One connection accepted, one left in the backlog.
	wa := dialSocket(t, ba.socket(testSocket))
	ca := acceptOne(t, h)
	roundTrip(t, wa, ca, "a")
	wb := dialSocket(t, bb.socket(testSocket))
	testenv.Eventually(t, "connection queued", func() bool { return len(h.queue) == 1 })

	accepting := make(chan error, 1)
	go func() {
		_, err := h.Accept()
		for err == nil {
			_, err = h.Accept()
		}
		accepting <- err
	}()
	if err := h.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-accepting; !errors.Is(err, net.ErrClosed) {
		t.Errorf("Accept after Close: %v", err)
	}
	if err := h.Open(ctx, ba.target("env-a", "")); !errors.Is(err, ErrHubClosed) {
		t.Errorf("Open after Close: %v", err)
	}
	for _, env := range []string{"env-a", "env-b"} {
		if s := h.Status(env); s != StatusStopped {
			t.Errorf("%s status after Close = %s", env, s)
		}
	}
	if _, err := wb.Read(make([]byte, 1)); err == nil {
		t.Error("queued connection outlived Close")
	}
	ca.Close()
	wa.Close()
	wb.Close()
	if err := h.Close(ctx); err != nil {
		t.Fatal(err)
	}
	checkNoLeak(t, baseline)
}

// TestListenerCloseLeavesTunnelsUp: the worker endpoint closing its listener (it closes first at
// shutdown) stops that listener's Accept; the tunnels stay up until the Mux itself is closed.
func TestListenerCloseLeavesTunnelsUp(t *testing.T) {
	b := startBox(t)
	h, _ := testHub(t, nil)
	ctx := testContext(t)
	if err := h.Open(ctx, b.target("env-a", "")); err != nil {
		t.Fatal(err)
	}
	ln := h.Listener()
	accepting := make(chan error, 1)
	go func() {
		_, err := ln.Accept()
		accepting <- err
	}()
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-accepting; !errors.Is(err, ErrListenerClosed) || !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Accept of a closed listener = %v, want %v", err, ErrListenerClosed)
	}
	if s := h.Status("env-a"); !s.Up() {
		t.Fatalf("tunnel status after the listener closed = %s, want connected", s)
	}
	w := dialSocket(t, b.socket(testSocket))
	roundTrip(t, w, acceptOne(t, h), "still forwarded")
	if err := h.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if s := h.Status("env-a"); s != StatusStopped {
		t.Fatalf("tunnel status after Close = %s, want stopped", s)
	}
}

// reconnects reads openclaw_tunnel_reconnects_total.
func reconnects(t *testing.T, h *Mux) float64 {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(h.Collectors()...)
	mfs, err := reg.Gather()
	if err != nil || len(mfs) != 1 || mfs[0].GetName() != "openclaw_tunnel_reconnects_total" {
		t.Fatalf("gather: %v %v", mfs, err)
	}
	return mfs[0].GetMetric()[0].GetCounter().GetValue()
}

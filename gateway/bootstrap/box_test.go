package bootstrap

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/openclaw/cloudworkers/gateway/tunnel"
	"github.com/openclaw/cloudworkers/gateway/tunnel/tunneltest"
	"github.com/openclaw/cloudworkers/internal/testrig/testenv"
)

// TestRunHonoursContextOnSilentBox: a box that completes the handshake and never answers a
// channel open cannot hold Run (nor the teardown that calls it) past its context.
func TestRunHonoursContextOnSilentBox(t *testing.T) {
	s, ep := tunneltest.StartLoopback(t, tunneltest.NoChannels)
	tctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := tunnel.DialBox(tctx, tunnel.Target{EnvironmentID: "env_x", Host: ep.Host, Port: ep.Port, User: "u",
		KeyPath: ep.KeyPath, HostKeys: []string{ep.HostKey}, SocketPath: "s"}, 5*time.Second, tunnel.KeepaliveConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel2 := context.WithTimeout(tctx, 200*time.Millisecond)
	defer cancel2()
	errc := make(chan error, 1)
	go func() { _, err := Run(ctx, c, "true"); errc <- err }()
	select {
	case err = <-errc:
	case <-tctx.Done():
		t.Fatal("Run on a silent box did not return after its context ended")
	}
	if !errors.Is(err, context.DeadlineExceeded) || s.Opens.Load() != 1 {
		t.Fatalf("Run on a silent box: %v (opens %d), want the context's deadline", err, s.Opens.Load())
	}
	// a context already done runs nothing on the box
	if _, err := Run(ctx, c, "true"); !errors.Is(err, context.DeadlineExceeded) || s.Opens.Load() != 1 {
		t.Fatalf("Run with a done context: %v (opens %d)", err, s.Opens.Load())
	}
}

// A command whose channel closes without an exit status says whether the connection to the box
// dropped or the box's SSH server closed the channel itself.
func TestRunSaysWhyACommandEndedWithoutExitStatus(t *testing.T) {
	dial := func(t *testing.T, ep tunneltest.Endpoint) *ssh.Client {
		c, err := tunnel.DialBox(testenv.Context(t, 30*time.Second), tunnel.Target{EnvironmentID: "env_x", Host: ep.Host, Port: ep.Port, User: "u",
			KeyPath: ep.KeyPath, HostKeys: []string{ep.HostKey}, SocketPath: "s"}, 5*time.Second, tunnel.KeepaliveConfig{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	t.Run("channel closed", func(t *testing.T) {
		_, ep := tunneltest.StartLoopback(t, tunneltest.NoExitStatus)
		_, err := Run(testenv.Context(t, 30*time.Second), dial(t, ep), "true")
		if err == nil || !strings.Contains(err.Error(), "closed the command's channel without an exit status") {
			t.Fatalf("Run: %v, want the box named as closing the channel", err)
		}
	})
	t.Run("connection dropped", func(t *testing.T) {
		s, ep := tunneltest.StartLoopback(t, tunneltest.Hung)
		c := dial(t, ep)
		errc := make(chan error, 1)
		go func() { _, err := Run(testenv.Context(t, 30*time.Second), c, "sleep 100"); errc <- err }()
		testenv.Eventually(t, "the command's channel open", func() bool { return s.Opens.Load() == 1 })
		s.Close()
		if err := <-errc; err == nil || !strings.Contains(err.Error(), "connection to the box") {
			t.Fatalf("Run: %v, want the dropped connection named", err)
		}
	})
}

// The HOME a box reports is stored with its environment and shown by the API: it must be an
// absolute path of printable text, at most 1 KiB.
func TestValidHome(t *testing.T) {
	for h, want := range map[string]bool{
		"/home/worker": true, "/tmp/lb 1/box/": true, "/home/wörker": true,
		"": false, "home/worker": false, "/home/\x1b[2Jworker": false, "/home/a\tb": false,
		"/" + strings.Repeat("h", 1024): false,
	} {
		if got := validHome(h); got != want {
			t.Errorf("validHome(%q) = %v, want %v", h, got, want)
		}
	}
}

package tunnel

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"path"
	"strings"
	"sync"
	"time"

	"golang.org/x/crypto/ssh"
	"golang.org/x/sync/errgroup"

	"github.com/openclaw/cloudworkers/internal/backoff"
	"github.com/openclaw/cloudworkers/internal/clock"
	"github.com/openclaw/cloudworkers/internal/untrusted"
)

// errKeepaliveTimeout ends a connection whose keepalive went unanswered.
var errKeepaliveTimeout = errors.New("keepalive not answered")

// cancelForwardWait bounds the polite cancel-streamlocal-forward when a tunnel is stopped.
const cancelForwardWait = 2 * time.Second

// maxSetupOutput bounds how much of the socket setup command's output goes into an error.
const maxSetupOutput = 512

// tunnel is the supervised control connection of one environment.
type tunnel struct {
	hub    *Mux
	target Target
	log    *slog.Logger
	ctx    context.Context
	cancel context.CancelFunc
	prev   *tunnel // the tunnel this one replaces; stopped and awaited before the first dial

	first chan error    // the outcome of the first attempt; size 1, written once
	done  chan struct{} // closed when run returns
	err   error         // the permanent error that stopped the tunnel; read after done

	mu     sync.Mutex
	status Status
	client *ssh.Client
	epoch  uint64
}

func newTunnel(h *Mux, t Target, prev *tunnel) *tunnel {
	ctx, cancel := context.WithCancel(context.Background())
	return &tunnel{
		hub:    h,
		target: t,
		log:    h.log.With("env", t.EnvironmentID),
		ctx:    ctx,
		cancel: cancel,
		prev:   prev,
		first:  make(chan error, 1),
		done:   make(chan struct{}),
		status: StatusConnecting,
	}
}

func (tn *tunnel) stop() { tn.cancel() }

func (tn *tunnel) getStatus() Status {
	tn.mu.Lock()
	defer tn.mu.Unlock()
	return tn.status
}

func (tn *tunnel) current() (*ssh.Client, uint64) {
	tn.mu.Lock()
	defer tn.mu.Unlock()
	if tn.status != StatusConnected {
		return nil, 0
	}
	return tn.client, tn.epoch
}

// transition is the only place the status changes; it refuses moves outside statusMoves.
func (tn *tunnel) transition(next Status, client *ssh.Client, epoch uint64) {
	tn.mu.Lock()
	cur := tn.status
	if cur != next && !cur.canMoveTo(next) {
		tn.mu.Unlock()
		tn.log.Error("illegal tunnel status change refused", "from", cur, "to", next)
		return
	}
	tn.status, tn.client, tn.epoch = next, client, epoch
	tn.mu.Unlock()
	if cur != next && tn.hub.cfg.OnStatus != nil {
		tn.hub.cfg.OnStatus(tn.target.EnvironmentID, next)
	}
}

// run supervises the tunnel until it is stopped or fails for good.
func (tn *tunnel) run() {
	defer close(tn.done)
	defer tn.hub.forget(tn)
	defer tn.cancel()
	if tn.prev != nil {
		tn.prev.stop()
		<-tn.prev.done
		tn.prev = nil
	}
	if tn.hub.cfg.OnStatus != nil {
		tn.hub.cfg.OnStatus(tn.target.EnvironmentID, StatusConnecting)
	}
	cfg := tn.hub.cfg
	bo := backoff.Backoff{Min: cfg.BackoffMin, Max: cfg.BackoffMax, Clock: cfg.Clock}
	reported := false
	report := func(err error) {
		if !reported {
			reported = true
			tn.first <- err
		}
	}
	lost := false // a connection of this tunnel was lost: the next one is a reconnect
	for attempt := 0; tn.ctx.Err() == nil; attempt++ {
		if attempt > 0 && bo.Wait(tn.ctx) != nil {
			break
		}
		client, ln, err := tn.connect(tn.ctx)
		if err != nil {
			if tn.ctx.Err() != nil {
				break
			}
			if mm, ok := errors.AsType[*HostKeyMismatchError](err); ok {
				tn.log.Error("host key mismatch; tunnel stopped", "err", err)
				if cfg.OnHostKeyMismatch != nil {
					cfg.OnHostKeyMismatch(tn.target.EnvironmentID, mm)
				}
				tn.err = err
				break
			}
			tn.log.Warn("tunnel dial", "attempt", attempt+1, "err", err)
			report(err)
			continue
		}
		bo.Reset()
		epoch := tn.hub.nextEpoch(tn.target.EnvironmentID, tn.target.EpochBase)
		if lost {
			tn.hub.reconnects.Inc()
		}
		tn.transition(StatusConnected, client, epoch)
		tn.log.Info("tunnel connected", "epoch", epoch)
		report(nil)
		err = tn.serve(tn.ctx, client, ln, epoch)
		if tn.ctx.Err() != nil {
			break
		}
		tn.log.Warn("tunnel lost", "epoch", epoch, "err", err)
		lost = true
		tn.transition(StatusReconnecting, nil, 0)
	}
	tn.transition(StatusStopped, nil, 0)
}

// connect dials the box, clears the socket path and forwards it.
func (tn *tunnel) connect(ctx context.Context) (*ssh.Client, net.Listener, error) {
	t := tn.target
	client, err := Dial(ctx, t, tn.hub.cfg.DialTimeout)
	if err != nil {
		return nil, nil, err
	}
	sctx, cancel := context.WithTimeout(ctx, tn.hub.cfg.DialTimeout)
	defer cancel()
	stop := context.AfterFunc(sctx, func() { client.Close() })
	ln, err := setupForward(client, t.SocketPath)
	if !stop() {
		client.Close()
		return nil, nil, fmt.Errorf("forward %s: %w", t.SocketPath, context.Cause(sctx))
	}
	if err != nil {
		client.Close()
		return nil, nil, err
	}
	return client, ln, nil
}

// setupForward removes whatever is left at socketPath (a stale socket of an earlier connection),
// creates its directory with mode 0700 and asks the box to listen there. The directory must then be
// the box user's own (not a symlink) and is made 0700: one that another user made first (on a
// shared /tmp) could swap the socket and take the worker's credential from its connect. A relative
// socketPath (or one starting with "~/") is resolved against the box user's HOME first: sshd binds
// forwarded sockets relative to its own working directory, not HOME.
func setupForward(client *ssh.Client, socketPath string) (net.Listener, error) {
	rel := strings.TrimPrefix(socketPath, "~/")
	relative := !path.IsAbs(rel)
	var cmd strings.Builder
	if relative {
		cmd.WriteString("cd || exit 1\n")
	}
	if dir := path.Dir(rel); dir != "." && dir != "/" {
		d := untrusted.Quote(dir)
		cmd.WriteString("mkdir -p -m 0700 -- " + d + " && [ -d " + d + " ] && [ ! -L " + d + " ] && [ -O " + d + " ] && chmod 0700 -- " + d +
			" || { echo 'the socket directory is not a directory of the box user (a symlink, or another user made it)' >&2; exit 1; }\n")
	}
	cmd.WriteString("rm -f -- " + untrusted.Quote(rel))
	if relative {
		cmd.WriteString(" && pwd")
	}
	s, err := client.NewSession()
	if err != nil {
		return nil, fmt.Errorf("prepare socket %s: %w", socketPath, err)
	}
	stdout := &boundedBuffer{max: maxSetupOutput}
	stderr := &boundedBuffer{max: maxSetupOutput}
	s.Stdout, s.Stderr = stdout, stderr
	err = s.Run(cmd.String())
	s.Close()
	if err != nil {
		return nil, fmt.Errorf("prepare socket %s: %w (stderr %q)", socketPath, err, stderr.String())
	}
	abs := rel
	if relative {
		home := strings.TrimSpace(stdout.String())
		if !path.IsAbs(home) || strings.ContainsAny(home, "\x00\n") {
			return nil, fmt.Errorf("prepare socket %s: box reported home %q", socketPath, home)
		}
		abs = path.Join(home, rel)
	}
	ln, err := client.ListenUnix(abs)
	if err != nil {
		return nil, fmt.Errorf("forward %s: %w", abs, err)
	}
	return ln, nil
}

// boundedBuffer keeps the first max bytes written to it and discards the rest.
type boundedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
	max int
}

func (b *boundedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if room := b.max - b.buf.Len(); room > 0 {
		b.buf.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

func (b *boundedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return strings.ToValidUTF8(b.buf.String(), "?")
}

// serve runs one connection: it hands forwarded connections to the hub and sends keepalives until
// the connection ends or ctx is done. It returns why the connection ended.
func (tn *tunnel) serve(ctx context.Context, client *ssh.Client, ln net.Listener, epoch uint64) error {
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		<-gctx.Done()
		tn.closeConn(client, ln)
		return nil
	})
	g.Go(func() error {
		err := client.Wait()
		return fmt.Errorf("connection closed: %w", errors.Join(err, net.ErrClosed))
	})
	g.Go(func() error {
		for {
			c, err := ln.Accept()
			if err != nil {
				return fmt.Errorf("forward ended: %w", err)
			}
			tn.hub.deliver(&Conn{Conn: c, EnvironmentID: tn.target.EnvironmentID, Epoch: epoch})
		}
	})
	g.Go(func() error { return tn.keepalive(gctx, client) })
	return g.Wait()
}

// closeConn cancels the forward, so that the box removes the socket, then closes the connection.
// On a dead link the cancel is abandoned after cancelForwardWait.
func (tn *tunnel) closeConn(client *ssh.Client, ln net.Listener) {
	cancelled := make(chan struct{})
	go func() {
		defer close(cancelled)
		_ = ln.Close() // returns at the latest when client is closed below
	}()
	t := tn.hub.cfg.Clock.NewTimer(cancelForwardWait)
	select {
	case <-cancelled:
	case <-t.C():
	}
	t.Stop()
	client.Close()
	<-cancelled
}

// keepalive sends keepalive@openssh.com every KeepaliveInterval and closes the connection when a
// reply takes longer than KeepaliveTimeout. Any reply, even a failure, proves the link alive.
func (tn *tunnel) keepalive(ctx context.Context, client *ssh.Client) error {
	cfg := tn.hub.cfg
	return keepalive(ctx, cfg.Clock, client, cfg.KeepaliveInterval, cfg.KeepaliveTimeout, nil)
}

// keepalive sends keepalive@openssh.com every interval until ctx ends, and closes client when a
// reply takes longer than timeout. Any reply, even a failure, proves the link alive; so does, when
// alive is given, anything read from the peer within timeout (the wait for the reply goes on).
func keepalive(ctx context.Context, clk clock.Clock, client *ssh.Client, interval, timeout time.Duration, alive func() bool) error {
	for {
		tick := clk.NewTimer(interval)
		select {
		case <-ctx.Done():
			tick.Stop()
			return nil
		case <-tick.C():
		}
		reply := make(chan error, 1)
		go func() {
			_, _, err := client.SendRequest("keepalive@openssh.com", true, nil)
			reply <- err
		}()
		if err := awaitReply(ctx, clk, client, reply, timeout, alive); err != nil || ctx.Err() != nil {
			return err
		}
	}
}

// awaitReply waits for a keepalive's reply (see keepalive).
func awaitReply(ctx context.Context, clk clock.Clock, client *ssh.Client, reply <-chan error, timeout time.Duration, alive func() bool) error {
	for {
		deadline := clk.NewTimer(timeout)
		select {
		case err := <-reply:
			deadline.Stop()
			if err != nil {
				return fmt.Errorf("keepalive: %w", err)
			}
			return nil
		case <-deadline.C():
			if alive != nil && alive() {
				continue // the peer is sending: the reply is queued behind its data
			}
			client.Close()
			<-reply
			return fmt.Errorf("%w within %v", errKeepaliveTimeout, timeout)
		case <-ctx.Done():
			deadline.Stop()
			<-reply // answered, or failed once the connection is closed
			return nil
		}
	}
}

package local

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"sync"

	"golang.org/x/crypto/ssh"
)

// streamLocalForwardMsg is the payload of streamlocal-forward@openssh.com and its cancel.
type streamLocalForwardMsg struct{ SocketPath string }

// forwardedStreamLocalPayload opens a forwarded-streamlocal@openssh.com channel (OpenSSH PROTOCOL 2.4).
type forwardedStreamLocalPayload struct {
	SocketPath string
	Reserved   string
}

// forward is one unix socket the box listens on for a client.
type forward struct {
	path string // as the client asked for it; echoed back in every channel it opens
	abs  string
	ln   *net.UnixListener
	fi   fs.FileInfo // the socket file we created, so we never remove a successor's socket
	done chan struct{}
}

// startForward listens on the requested unix socket (mode 0600) and delivers each connection to
// the client as a forwarded-streamlocal@openssh.com channel. An existing socket at the path is
// replaced (OpenSSH's StreamLocalBindUnlink=yes); any other kind of file there is left alone and
// the request refused.
func (c *conn) startForward(payload []byte) error {
	var m streamLocalForwardMsg
	if err := ssh.Unmarshal(payload, &m); err != nil {
		return fmt.Errorf("decode streamlocal-forward: %w", err)
	}
	if m.SocketPath == "" {
		return errors.New("empty socket path")
	}
	abs := m.SocketPath
	if !filepath.IsAbs(abs) {
		abs = filepath.Join(c.cfg.Dir, abs)
	}
	if fi, err := os.Lstat(abs); err == nil && fi.Mode()&fs.ModeSocket == 0 {
		return fmt.Errorf("%s exists and is not a socket", abs)
	}

	// Bind under a private random name, restrict it, then rename it into place, so the socket is
	// never reachable at its final path with a wider mode.
	var rnd [6]byte
	_, _ = rand.Read(rnd[:])
	tmp := filepath.Join(filepath.Dir(abs), ".lbsock-"+hex.EncodeToString(rnd[:]))
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: tmp, Net: "unix"})
	if err != nil {
		return fmt.Errorf("listen %s: %w", abs, err)
	}
	ln.SetUnlinkOnClose(false)
	fail := func(err error) error {
		ln.Close()
		_ = os.Remove(tmp)
		return err
	}
	if err := os.Chmod(tmp, 0o600); err != nil {
		return fail(err)
	}
	if err := os.Rename(tmp, abs); err != nil {
		return fail(fmt.Errorf("bind %s: %w", abs, err))
	}
	fi, err := os.Lstat(abs)
	if err != nil {
		ln.Close()
		return err
	}
	f := &forward{path: m.SocketPath, abs: abs, ln: ln, fi: fi, done: make(chan struct{})}
	c.noteSocketDir(abs)

	c.mu.Lock()
	old := c.forwards[m.SocketPath]
	c.forwards[m.SocketPath] = f
	c.mu.Unlock()
	if old != nil {
		old.close()
	}
	c.wg.Go(func() { c.acceptForward(f) })
	return nil
}

// cancelForward closes the forward the client asked for and removes its socket.
func (c *conn) cancelForward(payload []byte) error {
	var m streamLocalForwardMsg
	if err := ssh.Unmarshal(payload, &m); err != nil {
		return err
	}
	c.mu.Lock()
	f := c.forwards[m.SocketPath]
	delete(c.forwards, m.SocketPath)
	c.mu.Unlock()
	if f == nil {
		return fmt.Errorf("no forward for %s", m.SocketPath)
	}
	f.close()
	return nil
}

func (c *conn) closeForwards() {
	c.mu.Lock()
	all := c.forwards
	c.forwards = map[string]*forward{}
	c.mu.Unlock()
	for _, f := range all {
		f.close()
	}
}

// close stops listening and removes the socket file if it is still ours.
func (f *forward) close() {
	_ = f.ln.Close()
	if cur, err := os.Lstat(f.abs); err == nil && os.SameFile(cur, f.fi) {
		_ = os.Remove(f.abs)
	}
}

func (c *conn) acceptForward(f *forward) {
	for {
		uc, err := f.ln.AcceptUnix()
		if err != nil {
			return
		}
		c.wg.Go(func() { c.proxyForwarded(f, uc) })
	}
}

// proxyForwarded carries one accepted unix connection over a new channel to the client.
func (c *conn) proxyForwarded(f *forward, uc *net.UnixConn) {
	defer uc.Close()
	ch, reqs, err := c.sconn.OpenChannel("forwarded-streamlocal@openssh.com",
		ssh.Marshal(forwardedStreamLocalPayload{SocketPath: f.path}))
	if err != nil {
		return
	}
	// Tear the proxy down with the SSH connection.
	stop := context.AfterFunc(c.ctx, func() { uc.Close() })
	defer stop()

	var discard sync.WaitGroup
	discard.Go(func() { ssh.DiscardRequests(reqs) }) // ends when the channel is closed
	defer discard.Wait()
	defer ch.Close()

	var up sync.WaitGroup
	up.Go(func() {
		if _, err := io.Copy(ch, uc); err != nil {
			_ = ch.Close()
			return
		}
		_ = ch.CloseWrite()
	})
	if _, err := io.Copy(uc, ch); err != nil {
		_ = uc.Close()
	} else {
		_ = uc.CloseWrite()
	}
	up.Wait()
}

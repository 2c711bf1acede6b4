package local

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/openclaw/cloudworkers/internal/atomicfile"
	"github.com/openclaw/cloudworkers/internal/dirwatch"
)

// DefaultListen is where a box listens unless told otherwise: loopback, port chosen by the kernel.
const DefaultListen = "127.0.0.1:0"

const (
	handshakeTimeout = 10 * time.Second
	// dirWatchInterval is how often a box checks that its directory still exists.
	dirWatchInterval = 500 * time.Millisecond
	serverVersion    = "SSH-2.0-OpenClaw_localbox"
)

// BoxConfig configures one box server.
type BoxConfig struct {
	// Dir is the box directory: the box user's HOME and the working directory of every command.
	Dir string
	// LeaseID names the box; it defaults to the base name of Dir.
	LeaseID string
	Labels  map[string]string
	// Listen is the TCP address to serve SSH on; DefaultListen when empty.
	Listen string
	// User is the only login name accepted; the current user's name when empty.
	User   string
	Logger *slog.Logger
	// Ready, when set, is called once the box listens and its state file is written.
	Ready func(State)
}

func (c *BoxConfig) setDefaults() error {
	if c.Dir == "" {
		return errors.New("box directory is required")
	}
	abs, err := filepath.Abs(c.Dir)
	if err != nil {
		return fmt.Errorf("box directory %s: %w", c.Dir, err)
	}
	c.Dir = abs
	if c.LeaseID == "" {
		c.LeaseID = filepath.Base(c.Dir)
	}
	if c.Listen == "" {
		c.Listen = DefaultListen
	}
	if c.User == "" {
		c.User = currentUserName()
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

// Validate reports a configuration Serve cannot run.
func (c BoxConfig) Validate() error {
	if c.Dir == "" {
		return errors.New("box directory is required")
	}
	if c.LeaseID != "" && !ValidLeaseID(c.LeaseID) {
		return fmt.Errorf("invalid lease id %q", c.LeaseID)
	}
	return nil
}

// Serve runs a box until ctx is cancelled or the box directory is removed. It creates the box
// directory, its host key and client key pair if missing, listens, and publishes its State.
func Serve(ctx context.Context, cfg BoxConfig) error {
	if err := cfg.setDefaults(); err != nil {
		return err
	}
	if err := cfg.Validate(); err != nil {
		return err
	}
	if err := prepareBoxDir(cfg.Dir); err != nil {
		return fmt.Errorf("prepare box %s: %w", cfg.Dir, err)
	}
	lock, err := acquireBoxLock(cfg.Dir, 2*time.Second)
	if err != nil {
		return err
	}
	defer lock.release()

	hostKey, err := loadOrCreateKey(hostKeyPath(cfg.Dir))
	if err != nil {
		return fmt.Errorf("host key: %w", err)
	}
	clientKey, err := ensureClientKey(cfg.Dir)
	if err != nil {
		return fmt.Errorf("client key: %w", err)
	}

	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen %s: %w", cfg.Listen, err)
	}
	defer ln.Close()
	addr := ln.Addr().(*net.TCPAddr)
	host := addr.IP.String()
	if addr.IP.IsUnspecified() {
		host = "127.0.0.1"
	}

	st := State{
		LeaseID:       cfg.LeaseID,
		PID:           os.Getpid(),
		Host:          host,
		Port:          addr.Port,
		User:          cfg.User,
		HostKey:       authorizedKeyString(hostKey.PublicKey()),
		ClientKeyPath: clientKeyPath(cfg.Dir),
		Labels:        cfg.Labels,
		StartedAt:     time.Now().UTC(),
	}
	if err := writeState(cfg.Dir, st); err != nil {
		return err
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s := &server{cfg: cfg, log: cfg.Logger, authorized: clientKey.Marshal()}
	s.sshConfig = &ssh.ServerConfig{
		PublicKeyCallback: s.checkKey,
		ServerVersion:     serverVersion,
	}
	s.sshConfig.AddHostKey(hostKey)

	var wg sync.WaitGroup
	wg.Go(func() {
		if dirwatch.Gone(ctx, s.cfg.Dir, dirWatchInterval) {
			s.log.Info("box directory removed; stopping", "dir", s.cfg.Dir)
			cancel()
		}
	})
	stopAccept := context.AfterFunc(ctx, func() { ln.Close() })
	defer stopAccept()

	s.log.Info("box serving", "lease", cfg.LeaseID, "addr", addr.String(), "dir", cfg.Dir)
	if cfg.Ready != nil {
		cfg.Ready(st)
	}
	var acceptErr error
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() == nil {
				acceptErr = fmt.Errorf("accept: %w", err)
			}
			break
		}
		wg.Go(func() { s.serveConn(ctx, c) })
	}
	cancel()
	wg.Wait()
	s.removeSocketDirs()
	s.log.Info("box stopped", "lease", cfg.LeaseID)
	return acceptErr
}

func writeState(boxDir string, st State) error {
	b, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	if err := atomicfile.Write(statePath(boxDir), b, 0o600); err != nil {
		return fmt.Errorf("write box state: %w", err)
	}
	return nil
}

// server is one running box.
type server struct {
	cfg        BoxConfig
	log        *slog.Logger
	sshConfig  *ssh.ServerConfig
	authorized []byte

	mu         sync.Mutex
	socketDirs map[string]bool // directories directly under /tmp that held a forwarded socket
}

// noteSocketDir remembers the directory of a forwarded socket when it lies directly under /tmp
// (the gateway's /tmp/ocw-<hash> for a box whose HOME is too deep for a socket path).
func (s *server) noteSocketDir(socket string) {
	dir := filepath.Dir(socket)
	if filepath.Dir(dir) != "/tmp" {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.socketDirs == nil {
		s.socketDirs = map[string]bool{}
	}
	s.socketDirs[dir] = true
}

// removeSocketDirs removes, once the box has stopped, each noted socket directory that is empty:
// a local box shares its host's /tmp, and a machine that goes away takes its /tmp with it.
func (s *server) removeSocketDirs() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for dir := range s.socketDirs {
		if err := os.Remove(dir); err == nil {
			s.log.Debug("socket directory removed", "dir", dir)
		}
	}
}

func (s *server) checkKey(meta ssh.ConnMetadata, key ssh.PublicKey) (*ssh.Permissions, error) {
	if meta.User() != s.cfg.User {
		return nil, fmt.Errorf("unknown user %q", meta.User())
	}
	if string(key.Marshal()) != string(s.authorized) {
		return nil, errors.New("unauthorized key")
	}
	return &ssh.Permissions{}, nil
}

// serveConn runs one SSH connection until it ends or the box stops.
func (s *server) serveConn(ctx context.Context, nc net.Conn) {
	_ = nc.SetDeadline(time.Now().Add(handshakeTimeout))
	sconn, chans, reqs, err := ssh.NewServerConn(nc, s.sshConfig)
	if err != nil {
		s.log.Debug("ssh handshake", "remote", nc.RemoteAddr().String(), "err", err)
		nc.Close()
		return
	}
	_ = nc.SetDeadline(time.Time{})
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(ctx, func() { sconn.Close() })
	defer stop()

	c := &conn{server: s, sconn: sconn, ctx: ctx, forwards: map[string]*forward{}}
	c.wg.Go(func() { c.handleGlobalRequests(reqs) })
	for nch := range chans {
		switch nch.ChannelType() {
		case "session":
			ch, creqs, err := nch.Accept()
			if err != nil {
				continue
			}
			c.wg.Go(func() { c.handleSession(ch, creqs) })
		default:
			_ = nch.Reject(ssh.UnknownChannelType, "unsupported channel type")
		}
	}
	// The connection is gone: close its forwards and anything proxied through it.
	cancel()
	c.closeForwards()
	c.wg.Wait()
}

// conn is one client connection and the forwards it asked for.
type conn struct {
	*server
	sconn ssh.Conn
	ctx   context.Context
	wg    sync.WaitGroup

	mu       sync.Mutex
	forwards map[string]*forward
}

func (c *conn) handleGlobalRequests(reqs <-chan *ssh.Request) {
	for req := range reqs {
		switch req.Type {
		case "streamlocal-forward@openssh.com":
			err := c.startForward(req.Payload)
			if err != nil {
				c.log.Warn("streamlocal forward refused", "err", err)
			}
			_ = req.Reply(err == nil, nil)
		case "cancel-streamlocal-forward@openssh.com":
			_ = req.Reply(c.cancelForward(req.Payload) == nil, nil)
		default:
			// OpenSSH answers unknown requests, keepalive@openssh.com included, with failure;
			// the client only needs an answer.
			if req.WantReply {
				_ = req.Reply(false, nil)
			}
		}
	}
}

// execEnv is the whole environment of a command run on the box.
func (s *server) execEnv(extra map[string]string) []string {
	env := map[string]string{
		"HOME":  s.cfg.Dir,
		"PATH":  "/usr/local/bin:/usr/bin:/bin",
		"LANG":  "C.UTF-8",
		"USER":  s.cfg.User,
		"SHELL": "/bin/sh",
	}
	for k, v := range extra {
		env[k] = v
	}
	out := make([]string, 0, len(env))
	for k, v := range env {
		out = append(out, k+"="+v)
	}
	return out
}

// acceptedEnv reports whether a client may set the variable name (OpenSSH's usual AcceptEnv).
func acceptedEnv(name string) bool {
	return name == "LANG" || strings.HasPrefix(name, "LC_")
}

type envRequest struct{ Name, Value string }
type execRequest struct{ Command string }
type exitStatusMsg struct{ Status uint32 }
type exitSignalMsg struct {
	Signal     string
	CoreDumped bool
	Error      string
	Lang       string
}
type signalRequest struct{ Signal string }

// handleSession serves one session channel: env, pty-req, shell, exec, subsystem sftp,
// window-change and signal requests.
func (c *conn) handleSession(ch ssh.Channel, reqs <-chan *ssh.Request) {
	env := map[string]string{}
	var pty *ptyRequest
	var run *process
	started := false
	for req := range reqs {
		ok := false
		// after runs once the request is answered: nothing may close the channel before the reply.
		var after func()
		switch req.Type {
		case "env":
			var m envRequest
			if ssh.Unmarshal(req.Payload, &m) == nil && acceptedEnv(m.Name) && !started {
				env[m.Name] = m.Value
				ok = true
			}
		case "pty-req":
			var m ptyRequest
			if started || pty != nil {
				break
			}
			if err := ssh.Unmarshal(req.Payload, &m); err != nil {
				c.log.Warn("pty-req refused", "err", err)
				break
			}
			if err := m.validate(); err != nil {
				c.log.Warn("pty-req refused", "err", err)
				break
			}
			pty, ok = &m, true
		case "window-change":
			var m windowChange
			if run != nil && ssh.Unmarshal(req.Payload, &m) == nil {
				if err := run.resize(m.Columns, m.Rows); err != nil {
					c.log.Warn("window-change refused", "err", err)
				} else {
					ok = true
				}
			}
		case "exec", "shell":
			var m execRequest
			shell := req.Type == "shell"
			if started || (!shell && ssh.Unmarshal(req.Payload, &m) != nil) {
				break
			}
			p, err := c.startProcess(ch, m.Command, shell, env, pty)
			if err != nil {
				c.log.Warn("exec refused", "err", err)
				break
			}
			started, ok, run = true, true, p
			after = func() { c.wg.Go(func() { p.run(ch) }) }
		case "subsystem":
			var m execRequest
			if started || ssh.Unmarshal(req.Payload, &m) != nil || m.Command != "sftp" {
				break
			}
			started, ok = true, true
			after = func() { c.wg.Go(func() { c.serveSFTP(ch) }) }
		case "signal":
			var m signalRequest
			if run != nil && ssh.Unmarshal(req.Payload, &m) == nil {
				ok = run.signal(m.Signal) == nil
			}
		default:
			// x11-req, auth-agent-req@openssh.com: refused.
		}
		if req.WantReply {
			_ = req.Reply(ok, nil)
		}
		if after != nil {
			after()
		}
	}
	// The channel is closed: a command still running was abandoned by its client.
	if run != nil {
		run.abandon()
		run.wait()
	}
	if !started {
		ch.Close()
	}
}

// Package tunneltest provides hostile SSH servers for tests of code that talks to boxes.
package tunneltest

import (
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
)

// Mode is how a SilentBox misbehaves after the handshake.
type Mode int

const (
	// NoChannels never answers a channel open (neither accepts nor rejects it); global requests
	// such as keepalives are answered, so the link looks alive.
	NoChannels Mode = iota
	// Stalled answers nothing at all after the handshake, keepalives included.
	Stalled
	// Hung accepts session channels and their exec requests, then never sends output, an exit
	// status or a close, whatever it is sent (signals, EOF, close): a command that never ends.
	Hung
	// NoExitStatus accepts session channels and their exec requests, then closes the channel
	// without an exit status (RFC 4254 allows it; OpenSSH never does it).
	NoExitStatus
)

// SilentBox is an SSH server that completes every handshake with the host key it is given (so
// that pinning passes) and accepts any client key, then misbehaves as its Mode says.
type SilentBox struct {
	Addr string
	// Opens counts channel opens received and never answered.
	Opens atomic.Int64
	// Handshakes counts completed handshakes.
	Handshakes atomic.Int64

	ln    net.Listener
	mu    sync.Mutex
	conns []net.Conn
	wg    sync.WaitGroup
}

// Start listens on addr ("127.0.0.1:0" for any port; an address just freed is retried for a
// few seconds) until the test ends.
func Start(t testing.TB, addr string, hostKey ssh.Signer, mode Mode) *SilentBox {
	t.Helper()
	var ln net.Listener
	var err error
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if ln, err = net.Listen("tcp", addr); err == nil || time.Now().After(deadline) {
			break
		}
	}
	if err != nil {
		t.Fatalf("silent box: listen %s: %v", addr, err)
	}
	s := &SilentBox{Addr: ln.Addr().String(), ln: ln}
	cfg := &ssh.ServerConfig{PublicKeyCallback: func(ssh.ConnMetadata, ssh.PublicKey) (*ssh.Permissions, error) { return nil, nil }}
	cfg.AddHostKey(hostKey)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.mu.Lock()
			s.conns = append(s.conns, c)
			s.mu.Unlock()
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				sc, chans, reqs, err := ssh.NewServerConn(c, cfg)
				if err != nil {
					return
				}
				s.Handshakes.Add(1)
				if mode == Stalled {
					_ = sc.Wait() // nothing is read: requests and opens queue unanswered
					return
				}
				go ssh.DiscardRequests(reqs)
				for nc := range chans {
					s.Opens.Add(1)
					if mode != Hung && mode != NoExitStatus {
						continue // never accepted, never rejected
					}
					ch, creqs, err := nc.Accept()
					if err != nil {
						continue
					}
					go func() {
						for r := range creqs {
							_ = r.Reply(r.Type == "exec", nil)
							if r.Type == "exec" && mode == NoExitStatus {
								_ = ch.Close()
							}
						}
					}()
					go func() { _, _ = io.Copy(io.Discard, ch) }() // stdin read, nothing ever written
				}
			}()
		}
	}()
	t.Cleanup(s.Close)
	return s
}

// Close stops the server and drops its connections.
func (s *SilentBox) Close() {
	s.ln.Close()
	s.mu.Lock()
	for _, c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
}

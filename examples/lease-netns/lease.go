package main

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"
)

// manager runs one command against a state dir while holding its lock.
type manager struct {
	dir   string
	tools tools
	lock  *fileLock
	now   func() time.Time
}

func openManager(dir string, t tools) (*manager, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	// 0711: box users must traverse the state dir to reach their homes, but not list it.
	if err := os.MkdirAll(abs, 0o711); err != nil {
		return nil, fmt.Errorf("create state dir: %w", err)
	}
	lk, err := lockFile(filepath.Join(abs, "lock"))
	if err != nil {
		return nil, err
	}
	return &manager{dir: abs, tools: t, lock: lk, now: time.Now}, nil
}

func (m *manager) close() { m.lock.unlock() }

// hostLocked runs fn while holding the host-wide lock that guards names and subnets.
func (m *manager) hostLocked(fn func() error) error {
	lk, err := lockFile(hostLockPath)
	if err != nil {
		return err
	}
	defer lk.unlock()
	return fn()
}

type warmupRequest struct {
	LeaseID     string
	TTL         time.Duration
	IdleTimeout time.Duration
	Provider    string
	Class       string
	Labels      map[string]string
	Extra       map[string][]string
}

// leaseJSON is what inspect --json prints, in Crabbox's shape.
type leaseJSON struct {
	ID          string            `json:"id"`
	State       leaseState        `json:"state"`
	Ready       bool              `json:"ready"`
	SSHHost     string            `json:"sshHost,omitempty"`
	SSHPort     int               `json:"sshPort,omitempty"`
	SSHUser     string            `json:"sshUser,omitempty"`
	SSHKey      string            `json:"sshKey,omitempty"`
	SSHHostKey  string            `json:"sshHostKey,omitempty"`
	SSHHostKeys []string          `json:"sshHostKeys,omitempty"`
	ExpiresAt   string            `json:"expiresAt,omitempty"`
	Labels      map[string]string `json:"labels"`
	Provider    string            `json:"provider,omitempty"`
	Class       string            `json:"class,omitempty"`
	// Extras for fault-injection tests: where the box lives on this host.
	Netns     string `json:"netns,omitempty"`
	HostIf    string `json:"hostInterface,omitempty"`
	Home      string `json:"home,omitempty"`
	CreatedAt string `json:"createdAt,omitempty"`
}

func (m *manager) view(ctx context.Context, l *lease) leaseJSON {
	obj := leaseJSON{ID: l.ID, State: l.State, Labels: l.Labels, Provider: l.Provider, Class: l.Class}
	if obj.Labels == nil {
		obj.Labels = map[string]string{}
	}
	if l.State == stateReleased {
		return obj
	}
	obj.SSHHost, obj.SSHPort, obj.SSHUser = l.BoxAddr, 22, l.User
	obj.SSHKey, obj.SSHHostKey, obj.SSHHostKeys = l.ClientKey, l.HostKey, []string{l.HostKey}
	obj.ExpiresAt = l.ExpiresAt.UTC().Format(time.RFC3339)
	obj.CreatedAt = l.CreatedAt.UTC().Format(time.RFC3339)
	obj.Netns, obj.HostIf, obj.Home = l.Netns, l.HostIf, l.Home
	obj.Ready = l.State == stateReady && probe(ctx, l.BoxAddr, time.Second)
	return obj
}

// probe makes one TCP connect to the box's sshd. The address is the box's own /30 inside
// 198.18.0.0/15, reached through the veth (or refused by the guard route when the link is down).
func probe(ctx context.Context, addr string, timeout time.Duration) bool {
	d := net.Dialer{Timeout: timeout}
	c, err := d.DialContext(ctx, "tcp4", net.JoinHostPort(addr, "22"))
	if err != nil {
		return false
	}
	c.Close()
	return true
}

func (m *manager) get(doc *stateDoc, id string) (*lease, error) {
	l, ok := doc.Leases[id]
	if !ok {
		return nil, fmt.Errorf("%w: %s", ErrNoSuchLease, id)
	}
	return l, nil
}

// reapExpired releases live leases whose expiry has passed. There is no daemon: every
// command reaps on entry, so an expired box lives until the next invocation.
func (m *manager) reapExpired(ctx context.Context, doc *stateDoc) error {
	now := m.now()
	var errs []error
	for _, id := range slices.Sorted(maps.Keys(doc.Leases)) {
		l := doc.Leases[id]
		if l.State == stateReady && now.After(l.ExpiresAt) {
			errs = append(errs, m.release(ctx, doc, l))
		}
	}
	return errors.Join(errs...)
}

func (m *manager) release(ctx context.Context, doc *stateDoc, l *lease) error {
	if err := m.hostLocked(func() error { return m.teardown(ctx, l) }); err != nil {
		return fmt.Errorf("release %s: %w", l.ID, err)
	}
	if err := l.transition(stateReleased); err != nil {
		return err
	}
	l.ReleasedAt, l.SSHDPid = m.now().UTC(), 0
	return m.save(doc)
}

func (m *manager) warmup(ctx context.Context, req warmupRequest) (leaseJSON, error) {
	doc, err := m.load()
	if err != nil {
		return leaseJSON{}, err
	}
	if err := m.reapExpired(ctx, doc); err != nil {
		return leaseJSON{}, err
	}
	l := doc.Leases[req.LeaseID]
	switch {
	case l != nil && l.State == stateReady:
		return m.view(ctx, l), nil // idempotent: adopt the existing box
	case l != nil && l.State == stateProvisioning:
		// A previous warmup died half way: clear what it may have created, then start over.
		if err := m.release(ctx, doc, l); err != nil {
			return leaseJSON{}, err
		}
	case l == nil:
		l = &lease{ID: req.LeaseID}
		doc.Leases[req.LeaseID] = l
	}
	short, first := names(req.LeaseID)
	for _, o := range doc.Leases {
		if o != l && o.State.Live() && o.Short == short {
			return leaseJSON{}, fmt.Errorf("warmup %s: name collision with lease %s (ocw-%s); use another lease id", req.LeaseID, o.ID, short)
		}
	}
	now := m.now().UTC()
	*l = lease{
		ID: req.LeaseID, State: l.State, Short: short,
		Netns: "ocw-" + short, HostIf: "ocwh-" + short, BoxIf: "ocwb-" + short, User: "ocw-" + short,
		Dir: filepath.Join(m.dir, "boxes", short), Provider: req.Provider, Class: req.Class,
		TTL: req.TTL, IdleTimeout: req.IdleTimeout, Labels: req.Labels, Extra: req.Extra,
		CreatedAt: now, ExpiresAt: now.Add(req.TTL),
	}
	l.Home = filepath.Join(l.Dir, "home")
	l.ClientKey = filepath.Join(l.Dir, "id_ed25519")
	if err := checkTraversable(l.Home); err != nil {
		return leaseJSON{}, err
	}

	err = m.hostLocked(func() error {
		if err := m.tools.checkFree(ctx, l); err != nil {
			return err
		}
		slot, err := m.allocate(doc, l, first)
		if err != nil {
			return err
		}
		host, box := slotAddrs(slot)
		l.Slot, l.HostAddr, l.BoxAddr = slot, host.String(), box.String()
		// Record the lease before touching the host so a crash leaves a record to clean up.
		if err := l.transition(stateProvisioning); err != nil {
			return err
		}
		if err := m.save(doc); err != nil {
			return err
		}
		if err := m.provision(ctx, l); err != nil {
			if terr := m.teardown(context.WithoutCancel(ctx), l); terr != nil {
				err = errors.Join(err, fmt.Errorf("roll back: %w", terr))
			}
			_ = l.transition(stateReleased)
			l.ReleasedAt = m.now().UTC()
			return errors.Join(fmt.Errorf("warmup %s: %w", l.ID, err), m.save(doc))
		}
		return nil
	})
	if err != nil {
		return leaseJSON{}, err
	}
	if err := l.transition(stateReady); err != nil {
		return leaseJSON{}, err
	}
	if err := m.save(doc); err != nil {
		return leaseJSON{}, err
	}
	return m.view(ctx, l), nil
}

// allocate picks the lease's /30: the first free slot probing from a hash of the lease id,
// skipping slots held by live leases here and subnets already present on host interfaces
// (leases of other state dirs, or anything else using 198.18.0.0/15).
func (m *manager) allocate(doc *stateDoc, l *lease, first int) (int, error) {
	used := map[int]bool{}
	for _, o := range doc.Leases {
		if o != l && o.State.Live() {
			used[o.Slot] = true
		}
	}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return 0, fmt.Errorf("list host addresses: %w", err)
	}
	for _, a := range addrs {
		p, err := netip.ParsePrefix(a.String())
		if err != nil || !p.Addr().Is4() || !testNet.Contains(p.Addr()) {
			continue
		}
		lo := p.Masked().Addr().As4()
		start := (int(lo[1]&1)<<16 | int(lo[2])<<8 | int(lo[3])) / 4
		n := 1
		if p.Bits() < 30 {
			n = 1 << (30 - p.Bits())
		}
		for i := 0; i < n && start+i < slots; i++ {
			used[start+i] = true
		}
	}
	for i := 0; i < slots; i++ {
		s := (first + i) % slots
		if !used[s] {
			return s, nil
		}
	}
	return 0, errors.New("198.18.0.0/15 is exhausted")
}

// lookup loads the state, reaps expired leases first when reap is set, and returns lease id.
func (m *manager) lookup(ctx context.Context, id string, reap bool) (*stateDoc, *lease, error) {
	doc, err := m.load()
	if err != nil {
		return nil, nil, err
	}
	if reap {
		if err := m.reapExpired(ctx, doc); err != nil {
			return nil, nil, err
		}
	}
	l, err := m.get(doc, id)
	return doc, l, err
}

func (m *manager) inspect(ctx context.Context, id string) (leaseJSON, error) {
	_, l, err := m.lookup(ctx, id, true)
	if err != nil {
		return leaseJSON{}, err
	}
	return m.view(ctx, l), nil
}

func (m *manager) heartbeat(ctx context.Context, id string) (leaseJSON, error) {
	doc, l, err := m.lookup(ctx, id, true)
	if err != nil {
		return leaseJSON{}, err
	}
	if l.State != stateReady {
		return leaseJSON{}, fmt.Errorf("heartbeat %s: lease is %s", id, l.State)
	}
	l.ExpiresAt = m.now().UTC().Add(l.TTL)
	if err := m.save(doc); err != nil {
		return leaseJSON{}, err
	}
	return m.view(ctx, l), nil
}

func (m *manager) list(ctx context.Context) ([]leaseJSON, error) {
	doc, err := m.load()
	if err != nil {
		return nil, err
	}
	if err := m.reapExpired(ctx, doc); err != nil {
		return nil, err
	}
	out := []leaseJSON{}
	for _, id := range slices.Sorted(maps.Keys(doc.Leases)) {
		if l := doc.Leases[id]; l.State.Live() {
			out = append(out, m.view(ctx, l))
		}
	}
	return out, nil
}

// stop releases a lease. Stopping a released lease succeeds; a never-seen id is an error.
func (m *manager) stop(ctx context.Context, id string) error {
	doc, l, err := m.lookup(ctx, id, false)
	if err != nil {
		return err
	}
	if l.State == stateReleased {
		return nil
	}
	return m.release(ctx, doc, l)
}

func (m *manager) link(ctx context.Context, id string, up bool) error {
	_, l, err := m.lookup(ctx, id, false)
	if err != nil {
		return err
	}
	if l.State != stateReady {
		return fmt.Errorf("link %s: lease is %s", id, l.State)
	}
	state := "down"
	if up {
		state = "up"
	}
	return m.tools.ip(ctx, "link", "set", l.HostIf, state)
}

// hang makes every command of a new SSH session on the box hang (ForceCommand sleep, sshd
// reloaded): the box still completes handshakes and answers keepalives, but no command, sftp
// included, ever ends. Connections already open keep their old behaviour.
func (m *manager) hang(ctx context.Context, id string) error {
	_, l, err := m.lookup(ctx, id, false)
	if err != nil {
		return err
	}
	if l.State != stateReady || l.SSHDPid <= 0 {
		return fmt.Errorf("hang %s: lease is %s", id, l.State)
	}
	cfgPath := filepath.Join(l.Dir, "sshd_config")
	b, err := os.ReadFile(cfgPath)
	if err != nil {
		return err
	}
	if !strings.Contains(string(b), "\nForceCommand ") {
		b = append(b, "ForceCommand sleep 100000\n"...)
		if err := writeFileAtomic(cfgPath, b, 0o600); err != nil {
			return err
		}
	}
	listening := func() int {
		b, _ := os.ReadFile(filepath.Join(l.Dir, "sshd.log"))
		return strings.Count(string(b), "Server listening on")
	}
	before := listening()
	if err := syscall.Kill(l.SSHDPid, syscall.SIGHUP); err != nil {
		return fmt.Errorf("hang %s: reload sshd: %w", id, err)
	}
	// sshd re-executes itself on SIGHUP and logs that it listens again.
	deadline := time.Now().Add(5 * time.Second)
	for {
		if listening() > before && probe(ctx, l.BoxAddr, time.Second) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("hang %s: sshd does not answer after reload", id)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// checkTraversable makes sure a non-root box user can reach its home: every ancestor
// must be searchable by others.
func checkTraversable(home string) error {
	for d := filepath.Dir(home); ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err == nil && fi.Mode().Perm()&0o001 == 0 {
			return fmt.Errorf("box home %s is not reachable by the box user: %s has mode %#o; "+
				"chmod o+x it or use another --state-dir", home, d, fi.Mode().Perm())
		}
		if d == filepath.Dir(d) {
			return nil
		}
	}
}

func trimOutput(b []byte) string {
	s := strings.TrimSpace(string(b))
	if len(s) > 2000 {
		s = s[len(s)-2000:]
	}
	return s
}

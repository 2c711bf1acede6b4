package main

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/openclaw/cloudworkers/internal/atomicfile"
)

const (
	defaultStateDir = "/tmp/openclaw-lease-netns"
	// hostLockPath serialises changes to host-wide names and subnets across state dirs.
	hostLockPath = "/run/openclaw-lease-netns.lock"
	defaultTTL   = time.Hour
	stateFile    = "leases.json"
)

// leaseState is a lease's lifecycle state, stored as-is.
type leaseState string

const (
	stateProvisioning leaseState = "provisioning"
	stateReady        leaseState = "ready"
	stateReleased     leaseState = "released"
)

// Live reports whether the lease may own host resources.
func (s leaseState) Live() bool { return s == stateProvisioning || s == stateReady }

// transitions is the table of legal state changes; "" is a lease never seen.
var transitions = map[leaseState][]leaseState{
	"":                {stateProvisioning},
	stateProvisioning: {stateReady, stateReleased},
	stateReady:        {stateReleased},
	stateReleased:     {stateProvisioning},
}

func (l *lease) transition(to leaseState) error {
	for _, ok := range transitions[l.State] {
		if ok == to {
			l.State = to
			return nil
		}
	}
	return fmt.Errorf("lease %s: illegal transition %q -> %q", l.ID, l.State, to)
}

// lease is one lease as stored; released leases stay as tombstones.
type lease struct {
	ID          string              `json:"id"`
	State       leaseState          `json:"state"`
	Short       string              `json:"short"`
	Slot        int                 `json:"slot"`
	Netns       string              `json:"netns"`
	HostIf      string              `json:"hostIf"`
	BoxIf       string              `json:"boxIf"`
	HostAddr    string              `json:"hostAddr"`
	BoxAddr     string              `json:"boxAddr"`
	User        string              `json:"user"`
	Dir         string              `json:"dir"`
	Home        string              `json:"home"`
	ClientKey   string              `json:"clientKey"`
	HostKey     string              `json:"hostKey"`
	SSHDPid     int                 `json:"sshdPid,omitempty"`
	Provider    string              `json:"provider,omitempty"`
	Class       string              `json:"class,omitempty"`
	TTL         time.Duration       `json:"ttl"`
	IdleTimeout time.Duration       `json:"idleTimeout,omitempty"`
	Labels      map[string]string   `json:"labels,omitempty"`
	Extra       map[string][]string `json:"extraFlags,omitempty"`
	CreatedAt   time.Time           `json:"createdAt"`
	ExpiresAt   time.Time           `json:"expiresAt"`
	ReleasedAt  time.Time           `json:"releasedAt,omitzero"`
}

type stateDoc struct {
	Leases map[string]*lease `json:"leases"`
}

// slots is the number of /30 subnets in 198.18.0.0/15.
const slots = 1 << 15

var testNet = netip.MustParsePrefix("198.18.0.0/15")

// slotAddrs returns the host (.1) and box (.2) addresses of a /30 slot.
func slotAddrs(slot int) (host, box netip.Addr) {
	b := testNet.Addr().As4()
	base := binary.BigEndian.Uint32(b[:]) + uint32(slot)*4
	binary.BigEndian.PutUint32(b[:], base+1)
	host = netip.AddrFrom4(b)
	binary.BigEndian.PutUint32(b[:], base+2)
	return host, netip.AddrFrom4(b)
}

// names derives host-visible names from the lease id: 8 hex digits keep interface names
// within IFNAMSIZ (15) and user names short.
func names(id string) (short string, firstSlot int) {
	sum := sha256.Sum256([]byte(id))
	return hex.EncodeToString(sum[:4]), int(binary.BigEndian.Uint32(sum[4:8]) % slots)
}

// fileLock is an flock(2) on a file, released by close.
type fileLock struct{ f *os.File }

func lockFile(path string) (*fileLock, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open lock %s: %w", path, err)
	}
	for {
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX)
		if !errors.Is(err, syscall.EINTR) {
			break
		}
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	return &fileLock{f: f}, nil
}

func (l *fileLock) unlock() {
	if l != nil {
		l.f.Close() // closing the descriptor releases the flock
	}
}

func (m *manager) load() (*stateDoc, error) {
	doc := &stateDoc{Leases: map[string]*lease{}}
	b, err := os.ReadFile(filepath.Join(m.dir, stateFile))
	if errors.Is(err, os.ErrNotExist) {
		return doc, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read state: %w", err)
	}
	if err := json.Unmarshal(b, doc); err != nil {
		return nil, fmt.Errorf("parse state %s: %w", filepath.Join(m.dir, stateFile), err)
	}
	if doc.Leases == nil {
		doc.Leases = map[string]*lease{}
	}
	return doc, nil
}

func (m *manager) save(doc *stateDoc) error {
	b, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return err
	}
	return writeFileAtomic(filepath.Join(m.dir, stateFile), append(b, '\n'), 0o600)
}

// writeFileAtomic writes through atomicfile.Write, naming path in its error.
func writeFileAtomic(path string, data []byte, mode os.FileMode) error {
	if err := atomicfile.Write(path, data, mode); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

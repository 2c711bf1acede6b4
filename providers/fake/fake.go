// Package fake implements an in-memory provider with call counters and overridable behaviour for tests.
package fake

import (
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/openclaw/cloudworkers/providers"
)

// HostKey is the pinned host key of every default fake lease: a well-formed ed25519 key from a fixed seed.
var HostKey = func() string {
	pub := ed25519.NewKeyFromSeed(make([]byte, ed25519.SeedSize)).Public()
	sp, err := ssh.NewPublicKey(pub)
	if err != nil {
		panic(err)
	}
	return strings.TrimSpace(string(ssh.MarshalAuthorizedKey(sp)))
}()

// Method names accepted by Calls.
const (
	MethodProvision = "provision"
	MethodInspect   = "inspect"
	MethodDestroy   = "destroy"
	MethodRenew     = "renew"
	MethodList      = "list"
)

// Provider is a fake provider. Its zero value is ready to use and keeps leases in memory;
// a non-nil Func replaces the default behaviour of its method (calls are counted either way).
// Set the Funcs before the provider is shared between goroutines.
type Provider struct {
	ProvisionFunc func(ctx context.Context, p providers.Profile, opID string, req providers.ProvisionRequest) (providers.Lease, error)
	InspectFunc   func(ctx context.Context, p providers.Profile, lease providers.Lease) (providers.LeaseStatus, error)
	DestroyFunc   func(ctx context.Context, p providers.Profile, lease providers.Lease) error
	RenewFunc     func(ctx context.Context, p providers.Profile, lease providers.Lease) error
	ListFunc      func(ctx context.Context, p providers.Profile) ([]providers.LeaseStatus, error)

	mu     sync.Mutex
	calls  map[string]int
	leases map[string]providers.Lease // live leases by lease id
}

var (
	_ providers.Provider  = (*Provider)(nil)
	_ providers.Renewer   = (*Provider)(nil)
	_ providers.Lister    = (*Provider)(nil)
	_ providers.LeaseIDer = (*Provider)(nil)
)

// New returns a fake provider with the in-memory default behaviour.
func New() *Provider { return &Provider{} }

// LeaseIDFor is the lease id the fake derives from an operation id.
func LeaseIDFor(opID string) string {
	sum := sha256.Sum256([]byte(opID))
	return "fk_" + hex.EncodeToString(sum[:6])
}

// LeaseID implements providers.LeaseIDer.
func (f *Provider) LeaseID(_ providers.Profile, opID string) string { return LeaseIDFor(opID) }

// Calls returns how many times method ("provision", "inspect", …) was called.
func (f *Provider) Calls(method string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[method]
}

// Leases returns the live leases of the default behaviour, sorted by id.
func (f *Provider) Leases() []providers.Lease {
	f.mu.Lock()
	defer f.mu.Unlock()
	ids := slices.Sorted(maps.Keys(f.leases))
	out := make([]providers.Lease, 0, len(ids))
	for _, id := range ids {
		out = append(out, clone(f.leases[id]))
	}
	return out
}

// Put adds a live lease to the default behaviour (for example an orphan the sweep should find).
func (f *Provider) Put(l providers.Lease) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.init()
	f.leases[l.ID] = clone(l)
}

func (f *Provider) init() {
	if f.calls == nil {
		f.calls = map[string]int{}
	}
	if f.leases == nil {
		f.leases = map[string]providers.Lease{}
	}
}

func (f *Provider) count(method string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.init()
	f.calls[method]++
}

// Provision creates a lease, or returns the existing one for the same operation.
func (f *Provider) Provision(ctx context.Context, p providers.Profile, opID string, req providers.ProvisionRequest) (providers.Lease, error) {
	f.count(MethodProvision)
	if f.ProvisionFunc != nil {
		return f.ProvisionFunc(ctx, p, opID, req)
	}
	if err := ctx.Err(); err != nil {
		return providers.Lease{}, err
	}
	id := req.LeaseID
	if id == "" {
		id = LeaseIDFor(opID)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if l, ok := f.leases[id]; ok {
		return clone(l), nil
	}
	l := providers.Lease{
		ID:       id,
		SSHHost:  "127.0.0.1",
		SSHPort:  22,
		SSHUser:  "fake",
		HostKeys: []string{HostKey},
		Labels: map[string]string{
			providers.LabelGateway:     req.GatewayID,
			providers.LabelEnvironment: req.EnvironmentID,
		},
	}
	if ttl := p.Lifetime.TTL.D(); ttl > 0 {
		l.ExpiresAt = time.Now().Add(ttl).UTC()
	}
	f.leases[id] = l
	return clone(l), nil
}

// Inspect reports a live lease as ready and an unknown or destroyed one as gone.
func (f *Provider) Inspect(ctx context.Context, p providers.Profile, lease providers.Lease) (providers.LeaseStatus, error) {
	f.count(MethodInspect)
	if f.InspectFunc != nil {
		return f.InspectFunc(ctx, p, lease)
	}
	if err := ctx.Err(); err != nil {
		return providers.LeaseStatus{}, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	l, ok := f.leases[lease.ID]
	if !ok {
		return providers.LeaseStatus{LeaseID: lease.ID, State: "gone", Gone: true}, nil
	}
	return status(l), nil
}

// Destroy removes the lease; destroying an unknown lease succeeds.
func (f *Provider) Destroy(ctx context.Context, p providers.Profile, lease providers.Lease) error {
	f.count(MethodDestroy)
	if f.DestroyFunc != nil {
		return f.DestroyFunc(ctx, p, lease)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.leases, lease.ID)
	return nil
}

// Renew extends a live lease by the profile's TTL.
func (f *Provider) Renew(ctx context.Context, p providers.Profile, lease providers.Lease) error {
	f.count(MethodRenew)
	if f.RenewFunc != nil {
		return f.RenewFunc(ctx, p, lease)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	l, ok := f.leases[lease.ID]
	if !ok {
		return fmt.Errorf("renew %s: %w", lease.ID, providers.ErrLeaseGone)
	}
	if ttl := p.Lifetime.TTL.D(); ttl > 0 {
		l.ExpiresAt = time.Now().Add(ttl).UTC()
		f.leases[lease.ID] = l
	}
	return nil
}

// List returns the live leases.
func (f *Provider) List(ctx context.Context, p providers.Profile) ([]providers.LeaseStatus, error) {
	f.count(MethodList)
	if f.ListFunc != nil {
		return f.ListFunc(ctx, p)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	leases := f.Leases()
	out := make([]providers.LeaseStatus, 0, len(leases))
	for _, l := range leases {
		out = append(out, status(l))
	}
	return out, nil
}

func clone(l providers.Lease) providers.Lease {
	l.Labels = maps.Clone(l.Labels)
	l.HostKeys = slices.Clone(l.HostKeys)
	l.SSHKey = slices.Clone(l.SSHKey)
	return l
}

func status(l providers.Lease) providers.LeaseStatus {
	l = clone(l)
	return providers.LeaseStatus{LeaseID: l.ID, State: "ready", Ready: true, Lease: l, Labels: l.Labels}
}

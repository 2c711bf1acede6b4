// Package providers defines the contract between the gateway and the machines it leases.
package providers

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/openclaw/cloudworkers/internal/fielderr"
)

// Labels every lease carries so the orphan sweep can recognise leases of this gateway.
const (
	LabelGateway     = "openclaw.gateway"
	LabelEnvironment = "openclaw.environment"
)

// ErrLeaseGone reports proof that a lease no longer exists at the provider.
var ErrLeaseGone = errors.New("lease gone")

// ErrUnsupported is returned by optional operations a provider does not implement.
var ErrUnsupported = errors.New("operation not supported by provider")

// Provider leases machines reachable over SSH.
//
// Provision must be idempotent per operation id: calling it again with the same
// opID adopts the lease created by the first call instead of creating another.
// Destroy must be idempotent; callers prove teardown with Inspect.
type Provider interface {
	Provision(ctx context.Context, p Profile, opID string, req ProvisionRequest) (Lease, error)
	Inspect(ctx context.Context, p Profile, lease Lease) (LeaseStatus, error)
	Destroy(ctx context.Context, p Profile, lease Lease) error
}

// Renewer is implemented by providers whose leases expire unless renewed.
type Renewer interface {
	Renew(ctx context.Context, p Profile, lease Lease) error
}

// Lister is implemented by providers that can enumerate their leases for the orphan sweep.
type Lister interface {
	List(ctx context.Context, p Profile) ([]LeaseStatus, error)
}

// Validator is implemented by providers that can check a profile's settings before it is stored.
// The returned error should be a *FieldError naming the bad field.
type Validator interface {
	ValidateSettings(settings json.RawMessage) error
}

// ProvisionRequest carries what the gateway knows when it asks for a lease.
type ProvisionRequest struct {
	EnvironmentID string
	GatewayID     string
	// LeaseID is derived by the gateway from the operation id so that a lease CLI can use it
	// as an idempotency key (or, for CLIs that choose their own ids, as the slug it adopts by).
	LeaseID string
	// Reported, when set, is called while provisioning with the lease id a lease CLI chose
	// itself (and the lease labels to keep with it), the moment it is known, so the gateway
	// records it before Provision returns.
	Reported func(leaseID string, labels map[string]string) error
}

// Lease is a machine the gateway may reach over SSH.
type Lease struct {
	ID      string `json:"id"`
	SSHHost string `json:"sshHost"`
	SSHPort int    `json:"sshPort"`
	SSHUser string `json:"sshUser"`
	// SSHKeyPath is the path of the private key that opens the box; SSHKey is the key itself
	// when a provider hands it over inline. Neither is ever returned by the API.
	SSHKeyPath string `json:"-"`
	SSHKey     []byte `json:"-"`
	// HostKeys are the pinned host public keys in authorized_keys format ("ssh-ed25519 AAAA…").
	HostKeys  []string          `json:"hostKeys"`
	ExpiresAt time.Time         `json:"expiresAt,omitzero"`
	Labels    map[string]string `json:"labels,omitempty"`
}

// Validate reports a lease the gateway must refuse to use.
func (l Lease) Validate() error {
	switch {
	case l.ID == "":
		return errors.New("lease has no id")
	case l.SSHHost == "":
		return fmt.Errorf("lease %s has no ssh host", l.ID)
	case l.SSHPort <= 0 || l.SSHPort > 65535:
		return fmt.Errorf("lease %s has invalid ssh port %d", l.ID, l.SSHPort)
	case len(l.HostKeys) == 0:
		return fmt.Errorf("lease %s has no host key: refusing to connect unpinned", l.ID)
	}
	return nil
}

// LeaseStatus is what a provider reports about one lease.
type LeaseStatus struct {
	LeaseID string `json:"leaseId"`
	// Slug is the provider's second name of the lease, when it has one (Crabbox's slug).
	Slug string `json:"slug,omitempty"`
	// State is the provider's own word for the lease state.
	State string `json:"state"`
	// Gone is true only on proof that the lease no longer exists.
	Gone  bool `json:"gone"`
	Ready bool `json:"ready"`
	// Lease is filled when the provider reports connection details.
	Lease  Lease             `json:"lease"`
	Labels map[string]string `json:"labels,omitempty"`
}

// FieldError names the field of a profile or request that is wrong (internal/fielderr's error,
// which the layers below the providers return too).
type FieldError = fielderr.Error

// Fieldf returns a *FieldError.
func Fieldf(field, format string, args ...any) error { return fielderr.Errorf(field, format, args...) }

// Field is a named value of a config section, for FirstBad.
type Field[T any] struct {
	Name  string
	Value T
}

// FirstBad returns a FieldError naming the first of fields, in order, whose value bad holds for,
// with the message msg(value); nil when none is bad. The order (unlike a map's) names the same field
// every time several are bad.
func FirstBad[T any](fields []Field[T], bad func(T) bool, msg func(T) string) error {
	for _, f := range fields {
		if bad(f.Value) {
			return &FieldError{Field: f.Name, Message: msg(f.Value)}
		}
	}
	return nil
}

// Registry maps provider names (a profile's "provider" field) to providers. It is filled
// explicitly in cmd/openclaw.
type Registry map[string]Provider

// Get returns the named provider.
func (r Registry) Get(name string) (Provider, error) {
	p, ok := r[name]
	if !ok {
		return nil, Fieldf("provider", "unknown provider %q (known: %s)", name, strings.Join(r.Names(), ", "))
	}
	return p, nil
}

// Names lists the registered provider names, sorted.
func (r Registry) Names() []string {
	names := make([]string, 0, len(r))
	for n := range r {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// ValidateProfile checks the profile's common fields and, when the provider supports it, its settings.
func (r Registry) ValidateProfile(p *Profile) error {
	return r.ValidateProfileContext(context.Background(), p)
}

// ValidateProfileContext is ValidateProfile bounded by ctx where the provider's validation runs
// something (a ContextValidator).
func (r Registry) ValidateProfileContext(ctx context.Context, p *Profile) error {
	if err := p.Validate(); err != nil {
		return err
	}
	prov, err := r.Get(p.Provider)
	if err != nil {
		return err
	}
	if v, ok := prov.(ContextValidator); ok {
		return v.ValidateSettingsContext(ctx, p.Settings)
	}
	if v, ok := prov.(Validator); ok {
		if err := v.ValidateSettings(p.Settings); err != nil {
			return err
		}
	}
	return nil
}

// ContextValidator is a Validator whose validation runs a program (a lease CLI's --version),
// bounded by the caller's context as well as its own timeout.
type ContextValidator interface {
	ValidateSettingsContext(ctx context.Context, settings json.RawMessage) error
}

// Warner is implemented by providers that attach operator warnings to their profiles.
type Warner interface {
	ProfileWarnings(p Profile) []string
}

// LeaseIDer is implemented by providers that derive the lease id from the operation id
// themselves (so it is known before the provision call).
type LeaseIDer interface {
	LeaseID(p Profile, opID string) string
}

// Package command implements a provider that drives a lease CLI (such as Crabbox) described by argv templates.
package command

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/openclaw/cloudworkers/providers"
)

// Provider runs a lease CLI. Its zero value is not usable; use New or NewCrabbox.
type Provider struct {
	// compile turns a profile's settings into a runnable configuration.
	compile func(raw json.RawMessage) (*config, error)
}

var (
	_ providers.Provider  = (*Provider)(nil)
	_ providers.Renewer   = (*Provider)(nil)
	_ providers.Lister    = (*Provider)(nil)
	_ providers.Validator = (*Provider)(nil)
	_ providers.LeaseIDer = (*Provider)(nil)
)

// New returns the generic command provider whose settings are a Settings object.
func New() *Provider {
	return &Provider{compile: parseSettings}
}

// LeaseIDFor derives the lease id of an operation: prefix + the first 12 hex digits of sha256(opID).
func LeaseIDFor(prefix, opID string) string {
	sum := sha256.Sum256([]byte(opID))
	return prefix + hex.EncodeToString(sum[:6])
}

// ValidateSettings checks a profile's settings and names the first bad field.
func (p *Provider) ValidateSettings(raw json.RawMessage) error {
	_, err := p.compile(raw)
	return err
}

// LeaseID returns the lease id Provision will use for opID, so the gateway can record it first.
func (p *Provider) LeaseID(prof providers.Profile, opID string) string {
	prefix := DefaultLeaseIDPrefix
	if c, err := p.compile(prof.Settings); err == nil {
		prefix = c.leaseIDPrefix
	}
	return LeaseIDFor(prefix, opID)
}

func (p *Provider) config(prof providers.Profile) (*config, error) {
	c, err := p.compile(prof.Settings)
	if err != nil {
		return nil, fmt.Errorf("profile %s: %w", prof.ID, err)
	}
	return c, nil
}

// vars are the placeholder values known for a profile and lease.
func (c *config) vars(prof providers.Profile, leaseID string, labels map[string]string) map[string]string {
	ttl, idle := prof.Lifetime.TTL.D(), prof.Lifetime.IdleTimeout.D()
	if ttl <= 0 {
		ttl = providers.DefaultTTL
	}
	if idle <= 0 {
		idle = providers.DefaultIdleTimeout
	}
	return map[string]string{
		phLeaseID:     leaseID,
		phEnvID:       labels[providers.LabelEnvironment],
		phGatewayID:   labels[providers.LabelGateway],
		phClass:       c.class,
		phTTL:         FormatDuration(ttl),
		phIdleTimeout: FormatDuration(idle),
	}
}

// Provision runs the provision command (its exit status is the answer) and waits until inspect
// reports the lease ready. Running it again with the same opID re-sends the same lease id, which
// the lease CLI treats as an idempotency key.
func (p *Provider) Provision(ctx context.Context, prof providers.Profile, opID string, req providers.ProvisionRequest) (providers.Lease, error) {
	c, err := p.config(prof)
	if err != nil {
		return providers.Lease{}, err
	}
	leaseID := req.LeaseID
	if leaseID == "" {
		leaseID = LeaseIDFor(c.leaseIDPrefix, opID)
	}
	vars := c.vars(prof, leaseID, map[string]string{
		providers.LabelEnvironment: req.EnvironmentID,
		providers.LabelGateway:     req.GatewayID,
	})
	vars[phOpID] = opID
	res, err := c.run(ctx, "provision", expand(c.templates["provision"], vars))
	if err != nil {
		return providers.Lease{}, err
	}
	if res.exit != 0 {
		return providers.Lease{}, res.err("provision")
	}

	deadline := time.Now().Add(c.readyTimeout)
	last := ""
	for {
		st, err := c.inspect(ctx, prof, leaseID, vars)
		if err != nil {
			return providers.Lease{}, err
		}
		if st.Gone {
			return providers.Lease{}, fmt.Errorf("lease %s is %s while waiting for it to become ready: %w", leaseID, st.State, providers.ErrLeaseGone)
		}
		if st.Ready {
			return st.Lease, nil
		}
		last = st.State
		if time.Until(deadline) < c.pollInterval {
			return providers.Lease{}, fmt.Errorf("lease %s not ready after %s (last state %q)", leaseID, c.readyTimeout, sanitize(last, maxSnippet))
		}
		t := time.NewTimer(c.pollInterval)
		select {
		case <-ctx.Done():
			t.Stop()
			return providers.Lease{}, fmt.Errorf("wait for lease %s: %w", leaseID, ctx.Err())
		case <-t.C:
		}
	}
}

// Inspect reports the lease. Gone is set only on proof: a state in goneStates, or a failing
// inspect whose output matches notFoundPattern. Any other failure is an error.
func (p *Provider) Inspect(ctx context.Context, prof providers.Profile, lease providers.Lease) (providers.LeaseStatus, error) {
	c, err := p.config(prof)
	if err != nil {
		return providers.LeaseStatus{}, err
	}
	return c.inspect(ctx, prof, lease.ID, c.vars(prof, lease.ID, lease.Labels))
}

func (c *config) inspect(ctx context.Context, prof providers.Profile, leaseID string, vars map[string]string) (providers.LeaseStatus, error) {
	if leaseID == "" {
		return providers.LeaseStatus{}, errors.New("inspect: lease has no id")
	}
	res, err := c.run(ctx, "inspect", expand(c.templates["inspect"], vars))
	if err != nil {
		return providers.LeaseStatus{}, err
	}
	if res.exit != 0 {
		if c.notFound.MatchString(res.output()) {
			return providers.LeaseStatus{LeaseID: leaseID, State: "not-found", Gone: true}, nil
		}
		return providers.LeaseStatus{}, res.err("inspect")
	}
	var obj leaseJSON
	if err := decodeJSON(res.stdout, &obj); err != nil {
		return providers.LeaseStatus{}, fmt.Errorf("lease CLI inspect printed malformed JSON (%v): %q", err, sanitize(string(res.stdout), maxSnippet))
	}
	if obj.ID != "" && obj.ID != leaseID {
		return providers.LeaseStatus{}, fmt.Errorf("lease CLI inspect of %s reported lease %q", leaseID, sanitize(obj.ID, maxSnippet))
	}
	obj.ID = leaseID
	st, err := c.status(obj)
	if err != nil {
		return providers.LeaseStatus{}, fmt.Errorf("lease CLI inspect: %w", err)
	}
	if st.Ready {
		if err := st.Lease.Validate(); err != nil {
			return providers.LeaseStatus{}, fmt.Errorf("lease CLI inspect: %w", err)
		}
	}
	return st, nil
}

// Destroy runs the destroy command. A failure whose output matches notFoundPattern means the
// lease is already gone, which is success. Callers prove teardown with Inspect.
func (p *Provider) Destroy(ctx context.Context, prof providers.Profile, lease providers.Lease) error {
	c, err := p.config(prof)
	if err != nil {
		return err
	}
	res, err := c.run(ctx, "destroy", expand(c.templates["destroy"], c.vars(prof, lease.ID, lease.Labels)))
	if err != nil {
		return err
	}
	if res.exit != 0 && !c.notFound.MatchString(res.output()) {
		return res.err("destroy")
	}
	return nil
}

// Renew runs the renew command, or returns providers.ErrUnsupported when the profile has none.
func (p *Provider) Renew(ctx context.Context, prof providers.Profile, lease providers.Lease) error {
	c, err := p.config(prof)
	if err != nil {
		return err
	}
	argv := c.templates["renew"]
	if len(argv) == 0 {
		return providers.ErrUnsupported
	}
	res, err := c.run(ctx, "renew", expand(argv, c.vars(prof, lease.ID, lease.Labels)))
	if err != nil {
		return err
	}
	if res.exit != 0 {
		if c.notFound.MatchString(res.output()) {
			return fmt.Errorf("%w: %w", res.err("renew"), providers.ErrLeaseGone)
		}
		return res.err("renew")
	}
	return nil
}

// List runs the list command, which prints a JSON array of inspect objects.
func (p *Provider) List(ctx context.Context, prof providers.Profile) ([]providers.LeaseStatus, error) {
	c, err := p.config(prof)
	if err != nil {
		return nil, err
	}
	argv := c.templates["list"]
	if len(argv) == 0 {
		return nil, providers.ErrUnsupported
	}
	res, err := c.run(ctx, "list", expand(argv, c.vars(prof, "", nil)))
	if err != nil {
		return nil, err
	}
	if res.exit != 0 {
		return nil, res.err("list")
	}
	var objs []leaseJSON
	if err := decodeJSON(res.stdout, &objs); err != nil {
		return nil, fmt.Errorf("lease CLI list printed malformed JSON (%v): %q", err, sanitize(string(res.stdout), maxSnippet))
	}
	out := make([]providers.LeaseStatus, 0, len(objs))
	for i, obj := range objs {
		if obj.ID == "" {
			return nil, fmt.Errorf("lease CLI list: entry %d has no id", i)
		}
		st, err := c.status(obj)
		if err != nil {
			return nil, fmt.Errorf("lease CLI list: entry %d: %w", i, err)
		}
		out = append(out, st)
	}
	return out, nil
}

// leaseJSON is one lease as Crabbox's `inspect --json` prints it.
type leaseJSON struct {
	ID          string            `json:"id"`
	State       string            `json:"state"`
	Ready       bool              `json:"ready"`
	SSHHost     string            `json:"sshHost"`
	SSHPort     int               `json:"sshPort"`
	SSHUser     string            `json:"sshUser"`
	SSHKey      string            `json:"sshKey"`
	SSHHostKey  string            `json:"sshHostKey"`
	SSHHostKeys []string          `json:"sshHostKeys"`
	ExpiresAt   string            `json:"expiresAt"`
	Labels      map[string]string `json:"labels"`
}

func decodeJSON(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return errors.New("trailing data after JSON value")
	}
	return nil
}

// status turns one inspect object into a LeaseStatus, validating what the CLI printed.
func (c *config) status(obj leaseJSON) (providers.LeaseStatus, error) {
	st := providers.LeaseStatus{LeaseID: obj.ID, State: obj.State, Labels: obj.Labels}
	if c.goneStates[obj.State] {
		st.Gone = true
		return st, nil
	}
	st.Ready = obj.Ready
	l := providers.Lease{
		ID:      obj.ID,
		SSHHost: obj.SSHHost,
		SSHPort: obj.SSHPort,
		SSHUser: obj.SSHUser,
		Labels:  obj.Labels,
	}
	if l.SSHPort == 0 && l.SSHHost != "" {
		l.SSHPort = 22
	}
	if obj.SSHKey != "" {
		abs, err := filepath.Abs(obj.SSHKey)
		if err != nil {
			return st, fmt.Errorf("sshKey: %w", err)
		}
		l.SSHKeyPath = abs
	}
	keys := obj.SSHHostKeys
	if obj.SSHHostKey != "" {
		keys = append([]string{obj.SSHHostKey}, keys...)
	}
	for _, k := range keys {
		k = strings.TrimSpace(k)
		if k == "" {
			continue
		}
		if _, _, _, _, err := ssh.ParseAuthorizedKey([]byte(k)); err != nil {
			return st, fmt.Errorf("lease %s: unparseable host key %q: %v", obj.ID, sanitize(k, maxSnippet), err)
		}
		if !contains(l.HostKeys, k) {
			l.HostKeys = append(l.HostKeys, k)
		}
	}
	if obj.ExpiresAt != "" {
		t, err := time.Parse(time.RFC3339, obj.ExpiresAt)
		if err != nil {
			return st, fmt.Errorf("lease %s: expiresAt %q is not RFC 3339", obj.ID, sanitize(obj.ExpiresAt, maxSnippet))
		}
		l.ExpiresAt = t
	}
	st.Lease = l
	return st, nil
}

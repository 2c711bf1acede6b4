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
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/openclaw/cloudworkers/providers"
)

// Provider runs a lease CLI. Its zero value is not usable; use New or NewCrabbox.
type Provider struct {
	cfg Config
	// compile turns a profile's settings into a runnable configuration.
	compile func(raw json.RawMessage) (*config, error)
	// validate runs after compile when a profile is created (the Crabbox version check).
	validate func(ctx context.Context, c *config) error
}

// Config configures a command provider.
type Config struct {
	// WorkRoot is the gateway-owned directory under which each profile's lease CLI runs, in
	// WorkRoot/<profile id> (<data-dir>/providers/<profile>); never the gateway's own working
	// directory, since CLIs such as Crabbox read config from theirs and bind claims to it.
	WorkRoot string
}

var (
	_ providers.Provider  = (*Provider)(nil)
	_ providers.Renewer   = (*Provider)(nil)
	_ providers.Lister    = (*Provider)(nil)
	_ providers.Validator = (*Provider)(nil)
	_ providers.LeaseIDer = (*Provider)(nil)
)

// New returns the generic command provider whose settings are a Settings object.
func New(cfg Config) *Provider {
	return &Provider{cfg: cfg, compile: parseSettings}
}

// LeaseIDFor derives the lease id of an operation: prefix + the first 12 hex digits of sha256(opID).
func LeaseIDFor(prefix, opID string) string {
	sum := sha256.Sum256([]byte(opID))
	return prefix + hex.EncodeToString(sum[:6])
}

// ValidateSettings checks a profile's settings and names the first bad field.
func (p *Provider) ValidateSettings(raw json.RawMessage) error {
	return p.ValidateSettingsContext(context.Background(), raw)
}

// ValidateSettingsContext is ValidateSettings whose program runs (a Crabbox binary's --version)
// end with ctx as well as at the profile's timeout.
func (p *Provider) ValidateSettingsContext(ctx context.Context, raw json.RawMessage) error {
	c, err := p.compile(raw)
	if err != nil || p.validate == nil {
		return err
	}
	c.workDir = p.cfg.WorkRoot
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	return p.validate(ctx, c)
}

// LeaseID returns the lease id Provision will use for opID, so the gateway can record it first.
// For a Crabbox profile with idempotentLeaseId false it is the slug Provision passes instead.
func (p *Provider) LeaseID(prof providers.Profile, opID string) string {
	c, err := p.compile(prof.Settings)
	if err != nil {
		return LeaseIDFor(DefaultLeaseIDPrefix, opID)
	}
	return c.leaseRef(opID)
}

// leaseRef is what the gateway records before it calls the CLI: the lease id it will ask for,
// or the slug when the CLI chooses the id.
func (c *config) leaseRef(opID string) string {
	if c.crabbox != nil && c.crabbox.slugMode {
		return crabboxSlug(opID)
	}
	return LeaseIDFor(c.leaseIDPrefix, opID)
}

func (p *Provider) config(prof providers.Profile) (*config, error) {
	c, err := p.compile(prof.Settings)
	if err != nil {
		return nil, fmt.Errorf("profile %s: %w", prof.ID, err)
	}
	if p.cfg.WorkRoot != "" {
		c.workDir = filepath.Join(p.cfg.WorkRoot, prof.ID)
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

// ident is the name per-lease commands address a lease by: its slug when this gateway chose one
// (a Crabbox slug resolves through the CLI's claim, so it is "not found" once the claim is gone,
// where a static lease id still inspects as leased), its id otherwise.
func (c *config) ident(lease providers.Lease) string {
	if c.crabbox != nil && c.crabbox.slugMode {
		if s := lease.Labels[LabelSlug]; s != "" {
			return s
		}
	}
	return lease.ID
}

// LabelSlug is the lease label under which the Crabbox preset keeps the slug it leased by.
const LabelSlug = "openclaw.slug"

// Provision runs the provision command (its exit status is the answer) and waits until inspect
// reports the lease ready. Running it again with the same opID re-sends the same lease id, which
// the lease CLI treats as an idempotency key. A Crabbox profile whose provider refuses fixed lease
// ids (idempotentLeaseId false) passes a slug derived from opID instead: the id the CLI chose is
// reported through req.Reported the moment its "leased <id>" line is printed, and a repeated call
// adopts the lease listed under that slug instead of leasing a second one.
func (p *Provider) Provision(ctx context.Context, prof providers.Profile, opID string, req providers.ProvisionRequest) (providers.Lease, error) {
	c, err := p.config(prof)
	if err != nil {
		return providers.Lease{}, err
	}
	ref := c.leaseRef(opID)
	if req.LeaseID != "" && (c.crabbox == nil || !c.crabbox.slugMode) {
		ref = req.LeaseID
	}
	vars := c.vars(prof, ref, map[string]string{
		providers.LabelEnvironment: req.EnvironmentID,
		providers.LabelGateway:     req.GatewayID,
	})
	vars[phOpID] = opID
	want := wantLease{id: ref}
	if c.crabbox != nil && c.crabbox.slugMode {
		want = wantLease{slug: ref}
		vars[phSlug], vars[phLeaseID] = ref, ""
		if id, found, err := c.findBySlug(ctx, prof, ref); err != nil {
			return providers.Lease{}, err
		} else if found {
			if err := report(req, id, ref); err != nil {
				return providers.Lease{}, err
			}
			return c.waitReady(ctx, prof, ref, want)
		}
	}
	var leased, badLine string
	var reportErr error
	onLine := func(line string) {
		if c.crabbox == nil || leased != "" || badLine != "" {
			return
		}
		id, ok := parseLeasedLine(line)
		switch {
		case !ok:
			return
		case id == "":
			badLine = line
		default:
			leased = id
			if c.crabbox.slugMode {
				reportErr = report(req, id, ref)
			}
		}
	}
	argv, err := expand(c.templates["provision"], vars)
	if err != nil {
		return providers.Lease{}, err
	}
	res, err := c.runLines(ctx, "provision", argv, onLine)
	if err != nil {
		return providers.Lease{}, err
	}
	if res.exit != 0 {
		if c.crabbox != nil {
			return providers.Lease{}, c.crabbox.provisionError(res)
		}
		return providers.Lease{}, res.err("provision")
	}
	switch {
	case reportErr != nil:
		return providers.Lease{}, fmt.Errorf("record lease %s: %w", leased, reportErr)
	case badLine != "":
		return providers.Lease{}, fmt.Errorf("lease CLI provision printed an unusable lease id: %q", sanitize(badLine, maxSnippet))
	case c.crabbox != nil && leased == "":
		return providers.Lease{}, fmt.Errorf("lease CLI provision exited 0 without its \"leased <id>\" line")
	case c.crabbox != nil && !c.crabbox.slugMode && leased != ref:
		return providers.Lease{}, fmt.Errorf("lease CLI provision leased %s, not the requested lease id %s", sanitize(leased, maxSnippet), ref)
	}
	return c.waitReady(ctx, prof, ref, want)
}

// report hands the id the CLI chose to the gateway, with the slug it was leased by.
func report(req providers.ProvisionRequest, id, slug string) error {
	if req.Reported == nil {
		return nil
	}
	if !providers.ValidArg(id) {
		return fmt.Errorf("lease CLI reported an unusable lease id %q", sanitize(id, maxSnippet))
	}
	return req.Reported(id, map[string]string{LabelSlug: slug})
}

// wantLease is the identity an inspect must report: the id we asked for, or our slug.
type wantLease struct{ id, slug string }

// waitReady inspects ident until the lease is ready, gone, or readyTimeout passes.
func (c *config) waitReady(ctx context.Context, prof providers.Profile, ident string, want wantLease) (providers.Lease, error) {
	deadline := time.Now().Add(c.readyTimeout)
	vars := c.vars(prof, ident, nil)
	for {
		st, err := c.inspect(ctx, ident, want, vars)
		if err != nil {
			return providers.Lease{}, err
		}
		if st.Gone {
			return providers.Lease{}, fmt.Errorf("lease %s is %s while waiting for it to become ready: %w", ident, st.State, providers.ErrLeaseGone)
		}
		if st.Ready {
			return st.Lease, nil
		}
		if time.Until(deadline) < c.pollInterval {
			return providers.Lease{}, fmt.Errorf("lease %s not ready after %s (last state %q)", ident, c.readyTimeout, sanitize(st.State, maxSnippet))
		}
		t := time.NewTimer(c.pollInterval)
		select {
		case <-ctx.Done():
			t.Stop()
			return providers.Lease{}, fmt.Errorf("wait for lease %s: %w", ident, ctx.Err())
		case <-t.C:
		}
	}
}

// findBySlug looks for a live lease listed under slug (a lease leased before a restart).
func (c *config) findBySlug(ctx context.Context, prof providers.Profile, slug string) (string, bool, error) {
	list, err := c.list(ctx, prof)
	if err != nil {
		return "", false, fmt.Errorf("look for lease %s before leasing: %w", slug, err)
	}
	for _, st := range list {
		if st.Slug == slug && !st.Gone {
			return st.LeaseID, true, nil
		}
	}
	return "", false, nil
}

// Inspect reports the lease. Gone is set only on proof: a state in goneStates, or a failing
// inspect whose output matches notFoundPattern. Any other failure is an error.
func (p *Provider) Inspect(ctx context.Context, prof providers.Profile, lease providers.Lease) (providers.LeaseStatus, error) {
	c, err := p.config(prof)
	if err != nil {
		return providers.LeaseStatus{}, err
	}
	ident := c.ident(lease)
	want := wantLease{id: lease.ID}
	if ident != lease.ID {
		want = wantLease{slug: ident}
	} else if c.crabbox != nil && c.crabbox.slugMode && isCrabboxSlug(lease.ID) {
		want = wantLease{slug: lease.ID} // recorded before the CLI reported its id
	}
	return c.inspect(ctx, ident, want, c.vars(prof, ident, lease.Labels))
}

func (c *config) inspect(ctx context.Context, ident string, want wantLease, vars map[string]string) (providers.LeaseStatus, error) {
	if ident == "" {
		return providers.LeaseStatus{}, errors.New("inspect: lease has no id")
	}
	argv, err := expand(c.templates["inspect"], vars)
	if err != nil {
		return providers.LeaseStatus{}, err
	}
	res, err := c.run(ctx, "inspect", argv)
	if err != nil {
		return providers.LeaseStatus{}, err
	}
	if res.exit != 0 {
		if c.notFound.MatchString(res.output()) {
			return providers.LeaseStatus{LeaseID: ident, State: "not-found", Gone: true}, nil
		}
		return providers.LeaseStatus{}, res.err("inspect")
	}
	var obj leaseJSON
	if err := decodeJSON(res.stdout, &obj); err != nil {
		return providers.LeaseStatus{}, fmt.Errorf("lease CLI inspect printed malformed JSON (%v): %q", err, sanitize(string(res.stdout), maxSnippet))
	}
	id, slug, err := obj.identity()
	if err != nil {
		return providers.LeaseStatus{}, fmt.Errorf("lease CLI inspect of %s: %w", ident, err)
	}
	switch {
	case want.slug != "" && slug != want.slug:
		return providers.LeaseStatus{}, fmt.Errorf("lease CLI inspect of %s reported slug %q, not ours", ident, sanitize(slug, maxSnippet))
	case want.slug != "" && id == "":
		return providers.LeaseStatus{}, fmt.Errorf("lease CLI inspect of %s reported no lease id", ident)
	case want.id != "" && id != "" && id != want.id:
		return providers.LeaseStatus{}, fmt.Errorf("lease CLI inspect of %s reported lease %q", ident, sanitize(id, maxSnippet))
	case id == "":
		id = want.id
	}
	st, err := c.status(obj, id, slug)
	if err != nil {
		return providers.LeaseStatus{}, fmt.Errorf("lease CLI inspect: %w", err)
	}
	if want.slug != "" {
		st.Lease.Labels = withLabel(st.Lease.Labels, LabelSlug, want.slug)
	}
	if st.Ready {
		if err := st.Lease.Validate(); err != nil {
			if len(st.Lease.HostKeys) == 0 && c.crabbox != nil {
				err = fmt.Errorf("%w; Crabbox reports sshHostKey only for coordinator-backed hetzner, gcp, aws and azure leases: pin this box's host keys in settings.hostKeys", err)
			}
			return providers.LeaseStatus{}, fmt.Errorf("lease CLI inspect: %w", err)
		}
	}
	return st, nil
}

func withLabel(labels map[string]string, k, v string) map[string]string {
	out := make(map[string]string, len(labels)+1)
	for lk, lv := range labels {
		out[lk] = lv
	}
	out[k] = v
	return out
}

// Destroy runs the destroy command. A failure whose output matches notFoundPattern means the
// lease is already gone, which is success. Callers prove teardown with Inspect.
func (p *Provider) Destroy(ctx context.Context, prof providers.Profile, lease providers.Lease) error {
	c, err := p.config(prof)
	if err != nil {
		return err
	}
	ident := c.ident(lease)
	argv, err := expand(c.templates["destroy"], c.vars(prof, ident, lease.Labels))
	if err != nil {
		return err
	}
	res, err := c.run(ctx, "destroy", argv)
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
	argv, err = expand(argv, c.vars(prof, c.ident(lease), lease.Labels))
	if err != nil {
		return err
	}
	res, err := c.run(ctx, "renew", argv)
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

// List runs the list command, which prints a JSON array of inspect objects (or, as Crabbox's
// direct providers do, of raw server objects whose lease id and slug are labels).
func (p *Provider) List(ctx context.Context, prof providers.Profile) ([]providers.LeaseStatus, error) {
	c, err := p.config(prof)
	if err != nil {
		return nil, err
	}
	return c.list(ctx, prof)
}

func (c *config) list(ctx context.Context, prof providers.Profile) ([]providers.LeaseStatus, error) {
	argv := c.templates["list"]
	if len(argv) == 0 {
		return nil, providers.ErrUnsupported
	}
	argv, err := expand(argv, c.vars(prof, "", nil))
	if err != nil {
		return nil, err
	}
	res, err := c.run(ctx, "list", argv)
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
		id, slug, err := obj.identity()
		if err != nil {
			return nil, fmt.Errorf("lease CLI list: entry %d: %w", i, err)
		}
		if id == "" {
			return nil, fmt.Errorf("lease CLI list: entry %d has no id", i)
		}
		st, err := c.status(obj, id, slug)
		if err != nil {
			return nil, fmt.Errorf("lease CLI list: entry %d: %w", i, err)
		}
		out = append(out, st)
	}
	return out, nil
}

// leaseJSON is one lease as a lease CLI prints it: Crabbox's `inspect --json` object (StatusView in
// openclaw/crabbox internal/cli/status.go), a coordinator lease of its `list --json`
// (CoordinatorLease in internal/cli/coordinator.go), or a direct provider's raw server object
// (Server in internal/cli/hcloud.go: numeric "id", "status", lease id and slug under "labels").
type leaseJSON struct {
	ID          json.RawMessage   `json:"id"`
	Slug        string            `json:"slug"`
	CloudID     string            `json:"CloudID"`
	State       string            `json:"state"`
	Status      string            `json:"status"`
	Ready       bool              `json:"ready"`
	SSHHost     string            `json:"sshHost"`
	Host        string            `json:"host"`
	SSHPort     port              `json:"sshPort"`
	SSHUser     string            `json:"sshUser"`
	SSHKey      string            `json:"sshKey"`
	SSHHostKey  string            `json:"sshHostKey"`
	SSHHostKeys []string          `json:"sshHostKeys"`
	ExpiresAt   string            `json:"expiresAt"`
	Labels      map[string]string `json:"labels"`
}

// port is an SSH port printed as a JSON number or, as Crabbox prints it, a string.
type port int

func (p *port) UnmarshalJSON(b []byte) error {
	s := strings.TrimSpace(string(b))
	if s == "null" || s == `""` {
		*p = 0
		return nil
	}
	if uq, err := strconv.Unquote(s); err == nil {
		s = strings.TrimSpace(uq)
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 || n > 65535 {
		return fmt.Errorf("sshPort %q is not a port number", sanitize(string(b), 32))
	}
	*p = port(n)
	return nil
}

// identity returns the lease id and slug of an object: a string "id" is the lease id; a numeric
// one is a provider server id, and the lease id is its "lease" label (or CloudID).
func (o leaseJSON) identity() (id, slug string, err error) {
	raw := bytes.TrimSpace(o.ID)
	switch {
	case len(raw) == 0 || string(raw) == "null":
	case raw[0] == '"':
		if err := json.Unmarshal(raw, &id); err != nil {
			return "", "", fmt.Errorf("id: %v", err)
		}
	case raw[0] == '-' || (raw[0] >= '0' && raw[0] <= '9'):
		id = o.Labels["lease"]
		if id == "" {
			id = o.CloudID
		}
	default:
		return "", "", fmt.Errorf("id is neither a string nor a number: %q", sanitize(string(raw), maxSnippet))
	}
	slug = o.Slug
	if slug == "" {
		slug = o.Labels["slug"]
	}
	return id, slug, nil
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
func (c *config) status(obj leaseJSON, id, slug string) (providers.LeaseStatus, error) {
	state := obj.State
	if state == "" {
		state = obj.Labels["state"]
	}
	if state == "" {
		state = obj.Status
	}
	st := providers.LeaseStatus{LeaseID: id, Slug: slug, State: state, Labels: obj.Labels}
	if c.goneStates[state] {
		st.Gone = true
		return st, nil
	}
	st.Ready = obj.Ready
	l := providers.Lease{
		ID:      id,
		SSHHost: obj.SSHHost,
		SSHPort: int(obj.SSHPort),
		SSHUser: obj.SSHUser,
		Labels:  obj.Labels,
	}
	if l.SSHHost == "" {
		l.SSHHost = obj.Host
	}
	if l.SSHPort == 0 && l.SSHHost != "" {
		l.SSHPort = 22
	}
	if obj.SSHKey != "" {
		abs, err := filepath.Abs(filepath.Join(c.workDir, obj.SSHKey))
		if filepath.IsAbs(obj.SSHKey) {
			abs, err = obj.SSHKey, nil
		}
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
			return st, fmt.Errorf("lease %s: unparseable host key %q: %v", id, sanitize(k, maxSnippet), err)
		}
		if !slices.Contains(l.HostKeys, k) {
			l.HostKeys = append(l.HostKeys, k)
		}
	}
	if c.crabbox != nil && len(c.crabbox.hostKeys) > 0 {
		for _, k := range l.HostKeys {
			if !c.crabbox.pinned(k) {
				return st, fmt.Errorf("lease %s: the host key the lease CLI reports is not among settings.hostKeys", id)
			}
		}
		l.HostKeys = append([]string(nil), c.crabbox.hostKeys...)
	}
	if obj.ExpiresAt != "" {
		t, err := time.Parse(time.RFC3339, obj.ExpiresAt)
		if err != nil {
			return st, fmt.Errorf("lease %s: expiresAt %q is not RFC 3339", id, sanitize(obj.ExpiresAt, maxSnippet))
		}
		l.ExpiresAt = t
	}
	st.Lease = l
	return st, nil
}

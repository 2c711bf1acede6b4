// Package static implements a provider that hands out a fixed list of SSH hosts, one claim per host, for development.
package static

import (
	"bytes"
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"

	"golang.org/x/crypto/ssh"

	"github.com/openclaw/cloudworkers/internal/clock"
	"github.com/openclaw/cloudworkers/providers"
)

// Warning is shown with every static profile.
const Warning = "static hosts are for development only: a worker on a shared host can read unrelated host data"

// Lease states reported by Inspect and List.
const (
	StateClaimed     = "claimed"
	StateReleased    = "released"
	StateHostRemoved = "host-removed"
)

// Host is one machine of a static profile.
type Host struct {
	Host string `json:"host"`
	// Port defaults to 22.
	Port    int    `json:"port,omitempty"`
	User    string `json:"user"`
	KeyPath string `json:"keyPath"`
	// HostKey is the pinned host public key in authorized_keys format.
	HostKey string `json:"hostKey"`
}

// addr is the host's identity for claims.
func (h Host) addr() string { return net.JoinHostPort(h.Host, strconv.Itoa(h.Port)) }

// Settings is the profile settings shape of the static provider.
type Settings struct {
	Hosts []Host `json:"hosts"`
}

// DB is what the provider needs of the gateway's database (gateway/store.DB has it): reads and
// transactions over its static_claims table. An interface, so that a provider, on a lower floor
// than the gateway, does not import the gateway's store.
type DB interface {
	Reader() *sql.DB
	InTx(ctx context.Context, fn func(*sql.Tx) error) error
}

// timeFormat is how the gateway's database writes times (gateway/store.TimeFormat).
const timeFormat = "2006-01-02T15:04:05.000Z07:00"

// Provider claims hosts of static profiles durably in the gateway database.
type Provider struct {
	db DB
	// Clock dates the claims (the real clock when nil).
	Clock clock.Clock
}

var (
	_ providers.Provider  = (*Provider)(nil)
	_ providers.Lister    = (*Provider)(nil)
	_ providers.Validator = (*Provider)(nil)
	_ providers.Warner    = (*Provider)(nil)
	_ providers.LeaseIDer = (*Provider)(nil)
)

// New returns a static provider that keeps its claims in db.
func New(db DB) *Provider { return &Provider{db: db} }

// LeaseIDFor derives the lease id of an operation: "st_" + the first 12 hex digits of sha256(opID).
func LeaseIDFor(opID string) string {
	sum := sha256.Sum256([]byte(opID))
	return "st_" + hex.EncodeToString(sum[:6])
}

// LeaseID implements providers.LeaseIDer.
func (p *Provider) LeaseID(_ providers.Profile, opID string) string { return LeaseIDFor(opID) }

// ProfileWarnings implements providers.Warner.
func (p *Provider) ProfileWarnings(providers.Profile) []string { return []string{Warning} }

// ValidateSettings checks the host list and names the first bad field.
func (p *Provider) ValidateSettings(raw json.RawMessage) error {
	_, err := parseSettings(raw)
	return err
}

func parseSettings(raw json.RawMessage) ([]Host, error) {
	if len(bytes.TrimSpace(raw)) == 0 {
		raw = json.RawMessage("{}")
	}
	var s Settings
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&s); err != nil {
		if name, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
			return nil, providers.Fieldf("settings."+strings.Trim(name, `"`), "unknown field")
		}
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && te.Field != "" {
			return nil, providers.Fieldf("settings."+te.Field, "must be %s, not %s", te.Type, te.Value)
		}
		return nil, providers.Fieldf("settings", "%v", err)
	}
	if len(s.Hosts) == 0 {
		return nil, providers.Fieldf("settings.hosts", "at least one host is required")
	}
	seen := map[string]int{}
	for i := range s.Hosts {
		h := &s.Hosts[i]
		f := func(name string) string { return fmt.Sprintf("settings.hosts[%d].%s", i, name) }
		if h.Port == 0 {
			h.Port = 22
		}
		switch {
		case strings.TrimSpace(h.Host) == "":
			return nil, providers.Fieldf(f("host"), "is required")
		case strings.ContainsAny(h.Host, " \t\r\n/@"):
			return nil, providers.Fieldf(f("host"), "%q is not a host name or address", h.Host)
		case h.Port < 1 || h.Port > 65535:
			return nil, providers.Fieldf(f("port"), "must be between 1 and 65535, got %d", h.Port)
		case strings.TrimSpace(h.User) == "":
			return nil, providers.Fieldf(f("user"), "is required")
		case strings.TrimSpace(h.KeyPath) == "":
			return nil, providers.Fieldf(f("keyPath"), "is required (the private key that opens the host)")
		case strings.TrimSpace(h.HostKey) == "":
			return nil, providers.Fieldf(f("hostKey"), "is required: the gateway never connects unpinned")
		}
		if _, _, _, rest, err := ssh.ParseAuthorizedKey([]byte(h.HostKey)); err != nil || len(bytes.TrimSpace(rest)) > 0 {
			return nil, providers.Fieldf(f("hostKey"), "must be one public key in authorized_keys format (\"ssh-ed25519 AAAA…\")")
		}
		h.HostKey = strings.TrimSpace(h.HostKey)
		if j, dup := seen[h.addr()]; dup {
			return nil, providers.Fieldf(f("host"), "%s is already hosts[%d]", h.addr(), j)
		}
		seen[h.addr()] = i
	}
	return s.Hosts, nil
}

// claim is one row of static_claims.
type claim struct {
	leaseID, addr, envID, gatewayID string
}

func (c claim) labels() map[string]string {
	return map[string]string{providers.LabelGateway: c.gatewayID, providers.LabelEnvironment: c.envID}
}

func lease(c claim, h Host) providers.Lease {
	return providers.Lease{
		ID:         c.leaseID,
		SSHHost:    h.Host,
		SSHPort:    h.Port,
		SSHUser:    h.User,
		SSHKeyPath: h.KeyPath,
		HostKeys:   []string{h.HostKey},
		Labels:     c.labels(),
	}
}

func find(hosts []Host, addr string) (Host, bool) {
	for _, h := range hosts {
		if h.addr() == addr {
			return h, true
		}
	}
	return Host{}, false
}

func settings(p providers.Profile) ([]Host, error) {
	hosts, err := parseSettings(p.Settings)
	if err != nil {
		return nil, fmt.Errorf("profile %s: %w", p.ID, err)
	}
	return hosts, nil
}

// Provision claims a free host of the profile. The same opID returns the same host.
func (p *Provider) Provision(ctx context.Context, prof providers.Profile, opID string, req providers.ProvisionRequest) (providers.Lease, error) {
	hosts, err := settings(prof)
	if err != nil {
		return providers.Lease{}, err
	}
	leaseID := req.LeaseID
	if leaseID == "" {
		leaseID = LeaseIDFor(opID)
	}
	var c claim
	err = p.db.InTx(ctx, func(tx *sql.Tx) error {
		err := tx.QueryRowContext(ctx, `SELECT lease_id, host_addr, environment_id, gateway_id
			FROM static_claims WHERE operation_id = ?`, opID).Scan(&c.leaseID, &c.addr, &c.envID, &c.gatewayID)
		if err == nil {
			return nil
		}
		if !errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("read claim of operation %s: %w", opID, err)
		}
		rows, err := tx.QueryContext(ctx, `SELECT host_addr FROM static_claims WHERE profile_id = ?`, prof.ID)
		if err != nil {
			return fmt.Errorf("read claims of profile %s: %w", prof.ID, err)
		}
		taken := map[string]bool{}
		for rows.Next() {
			var a string
			if err := rows.Scan(&a); err != nil {
				rows.Close()
				return err
			}
			taken[a] = true
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		for i, h := range hosts {
			if taken[h.addr()] {
				continue
			}
			c = claim{leaseID: leaseID, addr: h.addr(), envID: req.EnvironmentID, gatewayID: req.GatewayID}
			_, err := tx.ExecContext(ctx, `INSERT INTO static_claims
				(profile_id, host_index, host_addr, lease_id, operation_id, environment_id, gateway_id, claimed_at)
				VALUES (?,?,?,?,?,?,?,?)`, prof.ID, i, c.addr, c.leaseID, opID, c.envID, c.gatewayID, clock.Or(p.Clock).Now().UTC().Format(timeFormat))
			if err != nil {
				return fmt.Errorf("claim %s: %w", c.addr, err)
			}
			return nil
		}
		return fmt.Errorf("no free host in profile %s (%d hosts, all claimed)", prof.ID, len(hosts))
	})
	if err != nil {
		return providers.Lease{}, err
	}
	h, ok := find(hosts, c.addr)
	if !ok {
		return providers.Lease{}, fmt.Errorf("lease %s holds host %s, which is no longer in profile %s", c.leaseID, c.addr, prof.ID)
	}
	return lease(c, h), nil
}

// Inspect reports a claimed lease as ready and a released one as gone.
func (p *Provider) Inspect(ctx context.Context, prof providers.Profile, l providers.Lease) (providers.LeaseStatus, error) {
	c := claim{leaseID: l.ID}
	err := p.db.Reader().QueryRowContext(ctx, `SELECT host_addr, environment_id, gateway_id FROM static_claims WHERE lease_id = ?`,
		l.ID).Scan(&c.addr, &c.envID, &c.gatewayID)
	if errors.Is(err, sql.ErrNoRows) {
		return providers.LeaseStatus{LeaseID: l.ID, State: StateReleased, Gone: true}, nil
	}
	if err != nil {
		return providers.LeaseStatus{}, fmt.Errorf("inspect static lease %s: %w", l.ID, err)
	}
	return p.status(prof, c), nil
}

func (p *Provider) status(prof providers.Profile, c claim) providers.LeaseStatus {
	st := providers.LeaseStatus{LeaseID: c.leaseID, State: StateHostRemoved, Labels: c.labels()}
	hosts, err := parseSettings(prof.Settings)
	if err != nil {
		return st
	}
	if h, ok := find(hosts, c.addr); ok {
		st.State, st.Ready, st.Lease = StateClaimed, true, lease(c, h)
	}
	return st
}

// Destroy releases the lease's claim. Releasing a released lease succeeds.
func (p *Provider) Destroy(ctx context.Context, _ providers.Profile, l providers.Lease) error {
	return p.db.InTx(ctx, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `DELETE FROM static_claims WHERE lease_id = ?`, l.ID); err != nil {
			return fmt.Errorf("release static lease %s: %w", l.ID, err)
		}
		return nil
	})
}

// List returns the profile's claimed hosts.
func (p *Provider) List(ctx context.Context, prof providers.Profile) ([]providers.LeaseStatus, error) {
	rows, err := p.db.Reader().QueryContext(ctx, `SELECT lease_id, host_addr, environment_id, gateway_id
		FROM static_claims WHERE profile_id = ? ORDER BY host_index, lease_id`, prof.ID)
	if err != nil {
		return nil, fmt.Errorf("list static claims of %s: %w", prof.ID, err)
	}
	defer rows.Close()
	out := []providers.LeaseStatus{}
	for rows.Next() {
		var c claim
		if err := rows.Scan(&c.leaseID, &c.addr, &c.envID, &c.gatewayID); err != nil {
			return nil, err
		}
		out = append(out, p.status(prof, c))
	}
	return out, rows.Err()
}

package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"
)

// claim is a local lease claim (leaseClaim, internal/cli/claim.go): Crabbox keeps one file per
// lease id under its state dir's claims/, bound to the checkout (repo root) it ran in.
type claim struct {
	LeaseID            string            `json:"leaseId"`
	Slug               string            `json:"slug"`
	Provider           string            `json:"provider"`
	RepoRoot           string            `json:"repoRoot"`
	StaticHost         string            `json:"staticHost"`
	StaticPort         string            `json:"staticPort"`
	StaticUser         string            `json:"staticUser"`
	IdleTimeoutSeconds int               `json:"idleTimeoutSeconds"`
	TTLSeconds         int               `json:"ttlSeconds"`
	ClaimedAt          string            `json:"claimedAt"`
	LastUsedAt         string            `json:"lastUsedAt"`
	Labels             map[string]string `json:"labels"`
}

func (c *cli) claimPath(leaseID string) string {
	return filepath.Join(c.dir, "claims", leaseID+".json")
}

func (c *cli) saveClaim(cl *claim) error { return saveJSON(c.claimPath(cl.LeaseID), cl) }

// findClaim is resolveLeaseClaim: a claim by lease id, else by slug.
func (c *cli) findClaim(ident string) (*claim, bool) {
	if ident == "" {
		return nil, false
	}
	entries, _ := os.ReadDir(filepath.Join(c.dir, "claims"))
	slug := normalizeSlug(ident)
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(c.dir, "claims", e.Name()))
		if err != nil {
			continue
		}
		var cl claim
		if json.Unmarshal(b, &cl) == nil && cl.LeaseID != "" && (cl.LeaseID == ident || (slug != "" && normalizeSlug(cl.Slug) == slug)) {
			return &cl, true
		}
	}
	return nil, false
}

// staticTarget is the configured static host (staticLease, internal/cli/static.go; env names from
// internal/cli/config.go).
type staticTarget struct {
	host, port, user, key string
	leaseID, slug         string
}

func configuredStatic() (staticTarget, error) {
	t := staticTarget{host: os.Getenv("CRABBOX_STATIC_HOST"), port: envOr("CRABBOX_STATIC_PORT", "22"),
		user: envOr("CRABBOX_STATIC_USER", "crabbox"), key: os.Getenv("CRABBOX_SSH_KEY")}
	if t.host == "" {
		return t, exit(2, "provider=ssh requires static.host or CRABBOX_STATIC_HOST")
	}
	t.leaseID = "static_" + normalizeSlug(t.host)
	t.slug = normalizeSlug(t.host)
	return t, nil
}

// staticLease is a resolved static lease: from its claim, or the configured host unclaimed.
type staticLease struct {
	staticTarget
	claim *claim
	state string
}

// resolveStatic is staticLeaseBackend.Resolve (internal/providers/ssh/backend.go): a claim by id
// or slug, else the configured host under its id, name, slug or host, else "not found" (exit 4).
func (c *cli) resolveStatic(ident string) (*staticLease, error) {
	t, err := configuredStatic()
	if err != nil {
		return nil, err
	}
	if cl, ok := c.findClaim(ident); ok && cl.Provider == "ssh" && cl.StaticHost == t.host {
		t.slug = cl.Slug
		return &staticLease{staticTarget: t, claim: cl, state: cl.Labels["state"]}, nil
	}
	if cl, ok := c.findClaim(t.leaseID); ok && cl.StaticHost == t.host && (ident == "" || ident == t.leaseID || ident == t.host) {
		t.slug = cl.Slug
		return &staticLease{staticTarget: t, claim: cl, state: cl.Labels["state"]}, nil
	}
	if ident == "" || ident == t.leaseID || ident == t.slug || ident == t.host || ident == "crabbox-"+t.slug {
		return &staticLease{staticTarget: t, state: "leased"}, nil // directLeaseLabels: state "leased"
	}
	return nil, exit(4, "static lease not found: %s", ident)
}

func (l *staticLease) labels() map[string]string {
	lb := map[string]string{"crabbox": "true", "created_by": "crabbox", "keep": "true", "lease": l.leaseID, "slug": l.slug,
		"provider": "ssh", "target": "linux", "server_type": "ssh", "state": l.state}
	if l.claim != nil {
		for k, v := range l.claim.Labels {
			lb[k] = v
		}
		lb["lease"], lb["slug"] = l.leaseID, l.slug
	}
	return lb
}

func (l *staticLease) expiresAt() string {
	if l.claim == nil {
		return ""
	}
	created, _ := time.Parse(time.RFC3339, l.claim.ClaimedAt)
	touched, _ := time.Parse(time.RFC3339, l.claim.LastUsedAt)
	return labelTime(expires(created, touched, time.Duration(l.claim.TTLSeconds)*time.Second, time.Duration(l.claim.IdleTimeoutSeconds)*time.Second))
}

// view: no sshHostKey (only a coordinator lease carries one), sshPort a string.
func (l *staticLease) view() statusView {
	return statusView{ID: l.leaseID, Slug: l.slug, Provider: "ssh", TargetOS: "linux", State: l.state, ServerID: l.leaseID,
		ServerType: "ssh", Host: l.host, Network: "public", SSHHost: l.host, SSHUser: l.user, SSHPort: l.port, SSHKey: l.key,
		ExpiresAt: l.expiresAt(), Labels: l.labels(), HasHost: true,
		Ready: !terminal(l.state) && l.state != "provisioning" && reachable(l.host, l.port)}
}

func (l *staticLease) server() server {
	s := server{CloudID: l.leaseID, Provider: "ssh", Name: "crabbox-" + l.slug, Status: "active", Labels: l.labels()}
	s.PublicNet.IPv4.IP = l.host
	s.ServerType.Name = "ssh"
	return s
}

// warmupStatic is staticLeaseBackend.Acquire: a requested slug names the claim, the lease id stays
// static_<host>; the claim binds the lease to the checkout the CLI runs in.
func (c *cli) warmupStatic(slug string, idle, ttl time.Duration) error {
	t, err := configuredStatic()
	if err != nil {
		return err
	}
	if slug != "" {
		t.slug = slug
	}
	wd, _ := os.Getwd()
	if cl, ok := c.findClaim(t.leaseID); ok && cl.RepoRoot != wd {
		return exit(2, "lease %s is claimed by repo %s; use --reclaim to move it", t.leaseID, cl.RepoRoot)
	}
	fmt.Fprintf(c.errw, "using static target lease=%s slug=%s target=linux windows_mode=normal host=%s keep=true\n", t.leaseID, t.slug, t.host)
	if !reachable(t.host, t.port) {
		return exit(1, "timed out waiting for SSH on %s:%s", t.host, t.port)
	}
	now := time.Now().UTC()
	cl := &claim{LeaseID: t.leaseID, Slug: t.slug, Provider: "ssh", RepoRoot: wd, StaticHost: t.host, StaticPort: t.port, StaticUser: t.user,
		IdleTimeoutSeconds: int(idle / time.Second), TTLSeconds: int(ttl / time.Second), ClaimedAt: labelTime(now), LastUsedAt: labelTime(now),
		Labels: map[string]string{"state": "ready", "idle_timeout_secs": strconv.Itoa(int(idle / time.Second))}}
	if err := c.saveClaim(cl); err != nil {
		return err
	}
	hold()
	l := &staticLease{staticTarget: t, claim: cl, state: "ready"}
	fmt.Fprintf(c.out, "leased %s slug=%s provider=ssh server=%s type=ssh ip=%s idle_timeout=%s expires=%s\n", t.leaseID, t.slug, t.leaseID, t.host, idle, l.expiresAt())
	fmt.Fprintf(c.out, "ready ssh=%s@%s:%s network=public workroot=/work/crabbox\n", t.user, t.host, t.port)
	fmt.Fprintf(c.out, "warmup complete total=%s\n", time.Millisecond)
	return nil
}

package command

// The Crabbox preset follows the Crabbox CLI as its source defines it (openclaw/crabbox, read at the
// 0.46.1 development head):
//
//   - warmup's flags: registerLeaseCreateFlags in internal/cli/lease_flags.go plus --lease-id,
//     --keep, --reclaim, --actions-runner, --timing-json in warmupWithLeaseObserver
//     (internal/cli/run.go). There is no --label. --lease-id must match cbx_<12 hex>
//     (canonicalLeaseIDPattern, internal/cli/slug.go) and is refused with exit 2, "provider=%s does
//     not support fixed idempotent lease IDs", by every backend without SupportsRequestedLeaseID
//     (true for coordinator-backed leases, internal/cli/provider_coordinator.go; aws, machine0;
//     external with capabilities.idempotentLeaseId). --slug is normalized to [a-z0-9-], at most 41.
//   - warmup prints "leased <id> slug=<slug> provider=…" on stdout once the lease is acquired and
//     claimed, then "ready ssh=…" and "warmup complete …" (internal/cli/run.go).
//   - inspect --json prints StatusView (internal/cli/status.go): "id", "slug", "state", "sshHost",
//     "sshHostKey" (omitempty: set only from a coordinator lease's host key), "sshUser", "sshPort"
//     as a string, "sshKey", "expiresAt" (RFC 3339, the idle deadline capped by the TTL:
//     directLeaseExpiresAtFrom in internal/cli/provider_labels.go), "ready".
//   - list --json prints coordinator leases (CoordinatorLease, internal/cli/coordinator.go: string
//     "id", "slug", "state") or a direct provider's raw servers (Server, internal/cli/hcloud.go:
//     "CloudID", "Provider", numeric "id", "name", "status", "labels" with "lease", "slug", "state").
//   - Terminal states: statusTerminalState in internal/cli/status.go.
//   - A static (provider ssh) lease id is "static_" + the normalized host (staticLease,
//     internal/cli/static.go); stop removes only the local claim (ReleaseLease,
//     internal/providers/ssh/backend.go), after which inspect of the id still exits 0 as "leased" and
//     heartbeat exits 4 "…is not claimed for provider=ssh; refusing heartbeat"
//     (internal/cli/heartbeat.go), while inspect of the slug exits 4 "static lease not found: <slug>".
//   - An unknown coordinator lease fails with "coordinator GET /v1/leases/<id>: http 404:
//     {"error":"not_found"}" (decodeCoordinatorResponse, internal/cli/coordinator.go).
//   - Exit codes: 2 usage and refusals, 4 claim and identity refusals, 5 terminal state while
//     waiting, 1 anything else (cmd/crabbox/main.go, internal/cli/errors.go).
//   - --version prints the version alone ("0.46.0", or "dev" for a source build: kong.VersionFlag in
//     internal/cli/cli_kong.go, resolveVersionForBuild in internal/cli/version.go).
//   - Crabbox reads .crabbox.yaml from its working directory and binds claims to the git checkout it
//     runs in (findRepo, internal/cli/repo.go): every command runs in <data-dir>/providers/<profile>.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"regexp"
	"strconv"
	"strings"

	"golang.org/x/crypto/ssh"

	"github.com/openclaw/cloudworkers/providers"
)

// CrabboxSettings is the profile settings shape of the Crabbox preset.
type CrabboxSettings struct {
	// Binary is the crabbox executable (default "crabbox", looked up in PATH).
	Binary string `json:"binary,omitempty"`
	// Provider and Class choose the machine; omitted flags use Crabbox's own defaults. Crabbox's
	// ssh (static) provider has no classes.
	Provider string `json:"provider,omitempty"`
	Class    string `json:"class,omitempty"`
	// TTL and IdleTimeout default to the profile's lifetime.
	TTL         string `json:"ttl,omitempty"`
	IdleTimeout string `json:"idleTimeout,omitempty"`
	// IdempotentLeaseID (default true) passes the gateway's lease id as --lease-id. Set it to false
	// for Crabbox providers that refuse fixed lease ids (ssh and the other direct providers): the
	// gateway then passes a slug it derived and adopts the lease by that slug after a restart.
	IdempotentLeaseID *bool `json:"idempotentLeaseId,omitempty"`
	// HostKeys pins the box's host keys ("ssh-ed25519 AAAA…") for leases whose inspect gives no
	// sshHostKey. When set they are the pin: a key Crabbox reports must be one of them.
	HostKeys []string `json:"hostKeys,omitempty"`

	Timeout      string            `json:"timeout,omitempty"`
	ReadyTimeout string            `json:"readyTimeout,omitempty"`
	PollInterval string            `json:"pollInterval,omitempty"`
	Env          map[string]string `json:"env,omitempty"`
}

// CrabboxLeaseIDPrefix prefixes lease ids of the Crabbox preset: with 12 hex digits they match the
// only form Crabbox accepts for --lease-id.
const CrabboxLeaseIDPrefix = "cbx_"

// MinCrabboxVersion is the oldest Crabbox release the preset speaks to.
const MinCrabboxVersion = "0.41.1"

// crabboxNotFound matches Crabbox's words for a lease (or claim) that is not there.
const crabboxNotFound = `(?i)not found|not_found|http 404|no such lease|unknown lease|is not claimed`

// crabboxConfig is what the preset adds to a compiled configuration.
type crabboxConfig struct {
	binary   string
	slugMode bool
	hostKeys []string
}

func (cc *crabboxConfig) pinned(k string) bool {
	pk, _, _, _, err := ssh.ParseAuthorizedKey([]byte(k))
	if err != nil {
		return false
	}
	for _, h := range cc.hostKeys {
		if hk, _, _, _, err := ssh.ParseAuthorizedKey([]byte(h)); err == nil && string(hk.Marshal()) == string(pk.Marshal()) {
			return true
		}
	}
	return false
}

// NewCrabbox returns the command provider preset for the Crabbox lease CLI.
func NewCrabbox(cfg Config) *Provider {
	return &Provider{cfg: cfg, compile: parseCrabbox, validate: checkCrabboxVersion}
}

func parseCrabbox(raw json.RawMessage) (*config, error) {
	var cs CrabboxSettings
	if err := decodeStrict(raw, &cs); err != nil {
		return nil, err
	}
	s, err := cs.Settings()
	if err != nil {
		return nil, err
	}
	c, err := s.compile()
	if err != nil {
		return nil, err
	}
	cc := &crabboxConfig{binary: s.Provision[0], slugMode: cs.IdempotentLeaseID != nil && !*cs.IdempotentLeaseID}
	for i, k := range cs.HostKeys {
		k = strings.TrimSpace(k)
		if _, _, _, _, err := ssh.ParseAuthorizedKey([]byte(k)); err != nil {
			return nil, providers.Fieldf(fmt.Sprintf("settings.hostKeys[%d]", i), "not a public key in authorized_keys form (\"ssh-ed25519 AAAA…\"): %v", err)
		}
		cc.hostKeys = append(cc.hostKeys, k)
	}
	c.crabbox = cc
	return c, nil
}

// staticProviders are Crabbox's names of its ssh provider (internal/providers/ssh/provider.go).
var staticProviders = map[string]bool{"ssh": true, "static": true, "static-ssh": true}

// Settings expands the preset into generic command settings.
func (cs CrabboxSettings) Settings() (Settings, error) {
	bin := cs.Binary
	if bin == "" {
		bin = "crabbox"
	}
	for _, f := range []struct{ field, v string }{
		{"settings.binary", bin}, {"settings.provider", cs.Provider}, {"settings.class", cs.Class},
	} {
		if strings.HasPrefix(f.v, "-") || strings.ContainsAny(f.v, "{}\x00") || (f.v != "" && strings.TrimSpace(f.v) == "") {
			return Settings{}, providers.Fieldf(f.field, "invalid value %q", f.v)
		}
	}
	if cs.Class != "" && staticProviders[cs.Provider] {
		return Settings{}, providers.Fieldf("settings.class", "Crabbox's %s provider has no machine classes (it ignores --class)", cs.Provider)
	}
	ttl, idle := "{ttl}", "{idleTimeout}"
	if cs.TTL != "" {
		d, err := parseDur("settings.ttl", cs.TTL, 0)
		if err != nil {
			return Settings{}, err
		}
		ttl = FormatDuration(d)
	}
	if cs.IdleTimeout != "" {
		d, err := parseDur("settings.idleTimeout", cs.IdleTimeout, 0)
		if err != nil {
			return Settings{}, err
		}
		idle = FormatDuration(d)
	}
	cmd := func(name string, args ...string) []string {
		argv := []string{bin, name}
		if cs.Provider != "" {
			argv = append(argv, "--provider", cs.Provider)
		}
		return append(argv, args...)
	}
	warmup := cmd("warmup")
	if cs.Class != "" {
		warmup = append(warmup, "--class", "{class}")
	}
	warmup = append(warmup, "--ttl", ttl, "--idle-timeout", idle)
	if cs.IdempotentLeaseID != nil && !*cs.IdempotentLeaseID {
		warmup = append(warmup, "--slug", "{slug}")
	} else {
		warmup = append(warmup, "--lease-id", "{leaseId}")
	}
	return Settings{
		Provision:       warmup,
		Inspect:         cmd("inspect", "--id", "{leaseId}", "--json"),
		Renew:           cmd("heartbeat", "--id", "{leaseId}"),
		Destroy:         cmd("stop", "{leaseId}"),
		List:            cmd("list", "--json"),
		Timeout:         cs.Timeout,
		ReadyTimeout:    cs.ReadyTimeout,
		PollInterval:    cs.PollInterval,
		NotFoundPattern: crabboxNotFound,
		LeaseIDPrefix:   CrabboxLeaseIDPrefix,
		Class:           cs.Class,
		Env:             cs.Env,
	}, nil
}

// crabboxSlugRE is the form of the slugs the preset derives.
var crabboxSlugRE = regexp.MustCompile(`^ocl-[0-9a-f]{12}$`)

// crabboxSlug derives the slug of an operation (itself derived from the gateway and environment
// ids): a valid Crabbox slug that normalization leaves unchanged.
func crabboxSlug(opID string) string {
	return "ocl-" + LeaseIDFor("", opID)
}

func isCrabboxSlug(s string) bool { return crabboxSlugRE.MatchString(s) }

// parseLeasedLine recognises warmup's `leased <id> slug=<slug> …` line. ok reports such a line;
// id is empty when it carries no usable id.
func parseLeasedLine(line string) (id string, ok bool) {
	rest, found := strings.CutPrefix(strings.TrimRight(line, "\r"), "leased ")
	if !found {
		return "", false
	}
	f := strings.Fields(rest)
	if len(f) == 0 || !providers.ValidArg(f[0]) {
		return "", true
	}
	return f[0], true
}

// provisionError explains a failed warmup with the line Crabbox printed last (its own message;
// a flag error comes after the whole usage text) and, for a refused --lease-id, the setting to use.
func (cc *crabboxConfig) provisionError(res result) error {
	msg := lastLine(string(res.stderr))
	if msg == "" {
		msg = lastLine(string(res.stdout))
	}
	e := &CLIError{Command: "provision", ExitCode: res.exit, Message: sanitize(msg, maxMessage)}
	switch {
	case strings.Contains(msg, "does not support fixed idempotent lease IDs"):
		return fmt.Errorf("%w: this Crabbox provider chooses its own lease ids; set settings.idempotentLeaseId: false in the profile", e)
	case strings.Contains(msg, "flag provided but not defined"):
		return fmt.Errorf("%w: this crabbox does not know a flag the preset passes (OpenClaw requires Crabbox %s or newer)", e, MinCrabboxVersion)
	}
	return e
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}

// CheckVersion runs `crabbox --version` for a Crabbox profile's settings and says what is wrong
// when the binary is missing, prints no version, or is older than MinCrabboxVersion.
func (p *Provider) CheckVersion(ctx context.Context, raw json.RawMessage) (string, error) {
	c, err := p.compile(raw)
	if err != nil {
		return "", err
	}
	if c.crabbox == nil {
		return "", errors.New("not a Crabbox profile")
	}
	c.workDir = p.cfg.WorkRoot
	return crabboxVersion(ctx, c)
}

func checkCrabboxVersion(ctx context.Context, c *config) error {
	_, err := crabboxVersion(ctx, c)
	return err
}

var versionRE = regexp.MustCompile(`^v?(\d+)\.(\d+)\.(\d+)(-[0-9A-Za-z.-]+)?$`)

func crabboxVersion(ctx context.Context, c *config) (string, error) {
	bin := c.crabbox.binary
	if _, err := exec.LookPath(bin); err != nil {
		return "", providers.Fieldf("settings.binary", "crabbox not found (%q): install Crabbox %s or newer, or name its path in settings.binary", bin, MinCrabboxVersion)
	}
	res, err := c.run(ctx, "version", []string{bin, "--version"})
	if err != nil {
		return "", providers.Fieldf("settings.binary", "%s --version: %v", bin, err)
	}
	out := strings.TrimSpace(string(res.stdout))
	if res.exit != 0 || out == "" {
		return "", providers.Fieldf("settings.binary", "%s --version exited %d without a version (%q): OpenClaw requires Crabbox %s or newer", bin, res.exit, sanitize(res.output(), maxSnippet), MinCrabboxVersion)
	}
	v := strings.Fields(out)[0]
	if v == "dev" {
		return v, nil // a source build of Crabbox: it cannot be compared, and is taken as current
	}
	m := versionRE.FindStringSubmatch(v)
	if m == nil {
		return "", providers.Fieldf("settings.binary", "%s --version printed %q, not a version: OpenClaw requires Crabbox %s or newer", bin, sanitize(out, maxSnippet), MinCrabboxVersion)
	}
	if older(m[1:4], m[4] != "", strings.Split(MinCrabboxVersion, ".")) {
		return "", providers.Fieldf("settings.binary", "crabbox %s is older than %s, the version OpenClaw requires: upgrade Crabbox", v, MinCrabboxVersion)
	}
	return v, nil
}

// older reports whether version (with a pre-release suffix when pre) sorts before min.
func older(version []string, pre bool, min []string) bool {
	for i := range 3 {
		a, _ := strconv.Atoi(version[i])
		b, _ := strconv.Atoi(min[i])
		if a != b {
			return a < b
		}
	}
	return pre // 0.41.1-rc.1 comes before 0.41.1
}

package providers

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"time"
	"unicode"

	"go.yaml.in/yaml/v3"
)

// Profile describes how to lease machines of one kind and how to treat them.
type Profile struct {
	ID       string `json:"id" yaml:"id"`
	Provider string `json:"provider" yaml:"provider"`
	// Settings are provider-specific; each provider decodes and validates its own.
	Settings        json.RawMessage `json:"settings,omitempty" yaml:"-"`
	Lifetime        Lifetime        `json:"lifetime" yaml:"lifetime"`
	Sync            SyncRules       `json:"sync" yaml:"sync"`
	MaxEnvironments int             `json:"maxEnvironments" yaml:"maxEnvironments"`
	// Price is what one of the profile's machines costs while leased (the spend ledger and
	// budgets: docs/operations.md, "Spend and budgets"). Zero: free.
	Price Price `json:"price,omitzero" yaml:"price"`
	// Pool keeps prepared machines of the profile ready for dispatches (docs/workers.md,
	// "Prepared pool").
	Pool Pool `json:"pool,omitzero" yaml:"pool"`
	// Hygiene chooses, per box hygiene check, whether a failure stops bootstrap ("enforce",
	// the default) or is only reported ("warn"). Checks: sshAgent, dockerSocket, cleanEnv, metadataRoute.
	Hygiene map[string]string `json:"hygiene,omitempty" yaml:"hygiene"`
	// Publish is how `openclaw session publish` may push a session's branch and open its pull
	// request (docs/dispatch.md).
	Publish PublishPolicy `json:"publish,omitzero" yaml:"publish"`
	// Warnings are shown to the operator (for example for development-only providers). Not stored.
	Warnings []string `json:"warnings,omitempty" yaml:"-"`
	// Setup is run on every new box after bootstrap and sync, before the worker takes the session.
	Setup *Setup `json:"setup,omitempty" yaml:"setup"`
	// Fallback names the profiles tried, in order, when this profile's lease CLI reports a
	// capacity-type failure (one matched by CapacityPattern).
	Fallback []string `json:"fallback,omitempty" yaml:"fallback"`
	// CapacityPattern is the regular expression a provisioning error must match to fall back
	// (default DefaultCapacityPattern). It is matched against the whole error, "lease CLI
	// provision exited 3: capacity exhausted", so an exit code can be matched too ("exited 75\b").
	CapacityPattern string `json:"capacityPattern,omitempty" yaml:"capacityPattern"`
	// Checkpoint is the cadence of a dispatched session's checkpoints.
	Checkpoint Checkpoint `json:"checkpoint,omitzero" yaml:"checkpoint"`
	// Git is the box repository's settings: the identity the worker's commits carry (the
	// gateway's git.author when empty).
	Git GitPolicy `json:"git,omitzero" yaml:"git"`
}

// GitPolicy is a profile's settings of the box repository.
type GitPolicy struct {
	Author GitAuthor `json:"author,omitzero" yaml:"author"`
}

// GitAuthor is the name and email of commits; both or neither.
type GitAuthor struct {
	Name  string `json:"name,omitempty" yaml:"name"`
	Email string `json:"email,omitempty" yaml:"email"`
}

// Validate checks an identity git accepts as it is, naming field in the error.
func (a GitAuthor) Validate(field string) error {
	if (a.Name == "") != (a.Email == "") {
		return Fieldf(field, "needs both name and email, got name %.100q and email %.100q", a.Name, a.Email)
	}
	for _, f := range []struct{ name, v string }{{"name", a.Name}, {"email", a.Email}} {
		if len(f.v) > 256 || strings.ContainsAny(f.v, "<>") || strings.IndexFunc(f.v, unicode.IsControl) >= 0 {
			return Fieldf(field+"."+f.name, "must be at most 256 characters without '<', '>' or control characters, got %.100q", f.v)
		}
	}
	if a.Email != "" && !strings.Contains(a.Email, "@") {
		return Fieldf(field+".email", "must be an email address, got %.100q", a.Email)
	}
	return nil
}

// Setup is a profile's setup phase: steps run on the box with a clean environment and no gateway
// credentials, each under its own timeout, before the agent runs.
type Setup struct {
	Steps []SetupStep `json:"steps" yaml:"steps"`
	// CacheKey names what the steps install; a warm box whose setup succeeded with the same key
	// skips it. Default: a hash of the steps.
	CacheKey string `json:"cacheKey,omitempty" yaml:"cacheKey"`
	// CloseNetwork is an argv run on the gateway after setup (for example the lease CLI's command
	// that drops the box's egress); {leaseId} and {envId} are expanded. The gateway does not
	// enforce egress itself.
	CloseNetwork []string `json:"closeNetwork,omitempty" yaml:"closeNetwork"`
}

// SetupStep is one shell command of a setup phase.
type SetupStep struct {
	Name string `json:"name" yaml:"name"`
	Run  string `json:"run" yaml:"run"`
	// Timeout bounds the step (default DefaultSetupStepTimeout, at most MaxSetupStepTimeout).
	Timeout Duration `json:"timeout,omitempty" yaml:"timeout"`
}

// Checkpoint is a profile's checkpoint cadence: after every worker turn ("turn", the default) or
// after a turn once the last checkpoint is older than a duration ("10m"); Keep is how many of a
// session's newest checkpoints are kept (0: the gateway's sync.checkpointKeep).
type Checkpoint struct {
	Every string `json:"every,omitempty" yaml:"every"`
	Keep  int    `json:"keep,omitempty" yaml:"keep"`
}

// Interval is the checkpoint interval: 0 for "turn" (after every turn).
func (c Checkpoint) Interval() time.Duration {
	if c.Every == "" || c.Every == CheckpointEveryTurn {
		return 0
	}
	d, _ := time.ParseDuration(c.Every)
	return d
}

// Limits and defaults of the setup phase, fallback and checkpoint policy.
const (
	DefaultSetupStepTimeout = 10 * time.Minute
	MaxSetupStepTimeout     = 6 * time.Hour
	MaxSetupSteps           = 32
	MaxSetupRunBytes        = 64 << 10
	MaxFallbacks            = 8
	MaxCheckpointKeep       = 1000
	MinCheckpointEvery      = time.Minute
	CheckpointEveryTurn     = "turn"
	DefaultCapacityPattern  = `(?i)capacity|quota|insufficient|exhausted|no available`
)

var setupStepNamePattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9 _.:-]{0,63}$`)

// SetupCacheKey is the cache key of the profile's setup: its cacheKey, or a hash of its steps and
// closeNetwork; "" when the profile has no setup.
func (p Profile) SetupCacheKey() string {
	s := p.Setup
	if s == nil || (len(s.Steps) == 0 && len(s.CloseNetwork) == 0) {
		return ""
	}
	if s.CacheKey != "" {
		return s.CacheKey
	}
	b, _ := json.Marshal(struct {
		Steps        []SetupStep
		CloseNetwork []string
	}{s.Steps, s.CloseNetwork})
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:12])
}

// IsCapacityError reports whether a provisioning error is capacity-type by the profile's pattern.
func (p Profile) IsCapacityError(err error) bool {
	if err == nil {
		return false
	}
	pat := p.CapacityPattern
	if pat == "" {
		pat = DefaultCapacityPattern
	}
	re, rerr := regexp.Compile(pat)
	return rerr == nil && re.MatchString(err.Error())
}

func (p *Profile) validatePolicy() error {
	if s := p.Setup; s != nil {
		if len(s.Steps) > MaxSetupSteps {
			return Fieldf("setup.steps", "at most %d steps, got %d", MaxSetupSteps, len(s.Steps))
		}
		seen := map[string]bool{}
		for i, st := range s.Steps {
			f := fmt.Sprintf("setup.steps[%d]", i)
			switch {
			case !setupStepNamePattern.MatchString(st.Name):
				return Fieldf(f+".name", "%q must be 1-64 letters, digits, spaces or _.:- (starting with a letter or digit)", st.Name)
			case seen[st.Name]:
				return Fieldf(f+".name", "%q is used by an earlier step", st.Name)
			case strings.TrimSpace(st.Run) == "":
				return Fieldf(f+".run", "is required")
			case len(st.Run) > MaxSetupRunBytes:
				return Fieldf(f+".run", "must be at most %d bytes, got %d", MaxSetupRunBytes, len(st.Run))
			case strings.ContainsRune(st.Run, 0):
				return Fieldf(f+".run", "must not contain NUL bytes")
			case st.Timeout < 0 || st.Timeout.D() > MaxSetupStepTimeout:
				return Fieldf(f+".timeout", "must be from 1s to %s (0: the default, %s), got %s", MaxSetupStepTimeout, DefaultSetupStepTimeout, st.Timeout)
			case st.Timeout > 0 && st.Timeout.D() < time.Second:
				return Fieldf(f+".timeout", "must be at least 1s, got %s", st.Timeout)
			}
			seen[st.Name] = true
		}
		if len(s.CacheKey) > 128 || strings.ContainsFunc(s.CacheKey, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
			return Fieldf("setup.cacheKey", "must be at most 128 printable characters")
		}
		for i, a := range s.CloseNetwork {
			if a == "" || strings.ContainsRune(a, 0) {
				return Fieldf(fmt.Sprintf("setup.closeNetwork[%d]", i), "must be a non-empty argument without NUL bytes")
			}
		}
	}
	if len(p.Fallback) > MaxFallbacks {
		return Fieldf("fallback", "at most %d profiles, got %d", MaxFallbacks, len(p.Fallback))
	}
	for i, f := range p.Fallback {
		switch {
		case !profileIDPattern.MatchString(f):
			return Fieldf(fmt.Sprintf("fallback[%d]", i), "%q is not a profile id", f)
		case f == p.ID:
			return Fieldf(fmt.Sprintf("fallback[%d]", i), "a profile cannot fall back to itself")
		case slices.Contains(p.Fallback[:i], f):
			return Fieldf(fmt.Sprintf("fallback[%d]", i), "%q is listed twice", f)
		}
	}
	if p.CapacityPattern != "" {
		if len(p.CapacityPattern) > 1024 {
			return Fieldf("capacityPattern", "must be at most 1024 bytes")
		}
		if _, err := regexp.Compile(p.CapacityPattern); err != nil {
			return Fieldf("capacityPattern", "%v", err)
		}
	}
	if e := p.Checkpoint.Every; e != "" && e != CheckpointEveryTurn {
		d, err := time.ParseDuration(e)
		if err != nil || d < MinCheckpointEvery {
			return Fieldf("checkpoint.every", "must be %q or a duration of at least %s (e.g. \"10m\"), got %q", CheckpointEveryTurn, MinCheckpointEvery, e)
		}
	}
	if k := p.Checkpoint.Keep; k < 0 || k > MaxCheckpointKeep {
		return Fieldf("checkpoint.keep", "must be from 1 to %d (0: the gateway's default), got %d", MaxCheckpointKeep, k)
	}
	return nil
}

// Lifetime is the profile's policy for how long machines live.
type Lifetime struct {
	IdleTimeout Duration `json:"idleTimeout" yaml:"idleTimeout"`
	TTL         Duration `json:"ttl" yaml:"ttl"`
}

// UnmarshalJSON decodes the policy, naming the field of a bad duration.
func (l *Lifetime) UnmarshalJSON(b []byte) error {
	var raw struct {
		IdleTimeout json.RawMessage `json:"idleTimeout"`
		TTL         json.RawMessage `json:"ttl"`
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&raw); err != nil {
		return Fieldf("lifetime", "%v", err)
	}
	for _, f := range []struct {
		name string
		raw  json.RawMessage
		dst  *Duration
	}{{"lifetime.idleTimeout", raw.IdleTimeout, &l.IdleTimeout}, {"lifetime.ttl", raw.TTL, &l.TTL}} {
		if len(f.raw) == 0 || string(f.raw) == "null" {
			continue
		}
		if err := f.dst.UnmarshalJSON(f.raw); err != nil {
			return Fieldf(f.name, "%v", err)
		}
	}
	return nil
}

// DefaultPushRefAllowlist is where a publish may push when a profile names nothing: the
// sessions' own branches.
var DefaultPushRefAllowlist = []string{"refs/heads/openclaw/*"}

// PublishPolicy bounds what a publish pushes. Patterns are full ref names in which '*' matches
// any run of characters, '/' included.
type PublishPolicy struct {
	// Credential names the gateway-held forge credential (`openclaw credential set NAME --git-token`).
	Credential string `json:"credential,omitempty" yaml:"credential"`
	// PushRefAllowlist: every destination ref of a push must match one (default
	// DefaultPushRefAllowlist), else the whole push is refused before any ref is updated.
	PushRefAllowlist []string `json:"pushRefAllowlist,omitempty" yaml:"pushRefAllowlist"`
	// ForcePushAllowlist: the destination refs a push may force (none by default).
	ForcePushAllowlist []string `json:"forcePushAllowlist,omitempty" yaml:"forcePushAllowlist"`
	// GitHubAPIURL is the REST API base of the forge for --pr (default https://api.github.com/;
	// GitHub Enterprise: https://HOST/api/v3/).
	GitHubAPIURL string `json:"githubApiUrl,omitempty" yaml:"githubApiUrl"`
	// BaseBranch is the branch a pull request targets (default: the repository's default branch).
	BaseBranch string `json:"baseBranch,omitempty" yaml:"baseBranch"`
}

// Allowlist returns PushRefAllowlist or the default.
func (p PublishPolicy) Allowlist() []string {
	if len(p.PushRefAllowlist) == 0 {
		return DefaultPushRefAllowlist
	}
	return p.PushRefAllowlist
}

// RefMatch reports whether ref matches pattern ('*' matches any run of characters).
func RefMatch(pattern, ref string) bool {
	parts := strings.Split(pattern, "*")
	if len(parts) == 1 {
		return pattern == ref
	}
	if !strings.HasPrefix(ref, parts[0]) {
		return false
	}
	rest := ref[len(parts[0]):]
	for i, part := range parts[1:] {
		if i == len(parts)-2 {
			return strings.HasSuffix(rest, part) && len(rest) >= len(part)
		}
		j := strings.Index(rest, part)
		if j < 0 {
			return false
		}
		rest = rest[j+len(part):]
	}
	return true
}

func (p PublishPolicy) validate() error {
	for _, list := range []struct {
		name string
		pats []string
	}{{"publish.pushRefAllowlist", p.PushRefAllowlist}, {"publish.forcePushAllowlist", p.ForcePushAllowlist}} {
		for i, pat := range list.pats {
			if !strings.HasPrefix(pat, "refs/") || strings.ContainsAny(pat, " ~^:?[\\\x00") || strings.Contains(pat, "..") {
				return Fieldf(fmt.Sprintf("%s[%d]", list.name, i), "%q must be a full ref name (refs/…) where '*' matches any run of characters", pat)
			}
		}
	}
	if p.GitHubAPIURL != "" {
		u, err := url.Parse(p.GitHubAPIURL)
		if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
			return Fieldf("publish.githubApiUrl", "%q must be an http(s) URL", p.GitHubAPIURL)
		}
	}
	if p.BaseBranch != "" && (strings.HasPrefix(p.BaseBranch, "refs/") || strings.ContainsAny(p.BaseBranch, " ~^:?*[\\")) {
		return Fieldf("publish.baseBranch", "%q must be a branch name (main, not refs/heads/main)", p.BaseBranch)
	}
	return nil
}

// SyncRules are gitignore-style include and exclude patterns applied to workspace sync.
type SyncRules struct {
	Include []string `json:"include,omitempty" yaml:"include"`
	Exclude []string `json:"exclude,omitempty" yaml:"exclude"`
	// MaxDeleteShare is the share of the workspace's files (0 < x ≤ 1) a pull-back may delete
	// without --force; zero means 0.5.
	MaxDeleteShare float64 `json:"maxDeleteShare,omitempty" yaml:"maxDeleteShare"`
	// MaxInboundBytes bounds the file content one pull-back may bring from a box, MaxInboundEntries
	// its entries (files, directories, symlinks, deletions: also those of the box's manifest) and
	// MaxInboundFileBytes one file; zero means the gateway's defaults (4 GiB, 200,000, 1 GiB:
	// stream.DefaultLimits). Raise them for a workspace larger than that.
	MaxInboundBytes     int64 `json:"maxInboundBytes,omitempty" yaml:"maxInboundBytes"`
	MaxInboundEntries   int   `json:"maxInboundEntries,omitempty" yaml:"maxInboundEntries"`
	MaxInboundFileBytes int64 `json:"maxInboundFileBytes,omitempty" yaml:"maxInboundFileBytes"`
}

// Ceilings of a profile's inbound sync quotas: what one pull-back may ask the gateway to stage
// and decode, however a profile is written.
const (
	MaxInboundBytesCeiling   = 1 << 40 // 1 TiB
	MaxInboundEntriesCeiling = 10_000_000
)

// Defaults for profile lifetime policy: generous, since days-long work is first class.
const (
	DefaultIdleTimeout     = 30 * time.Minute
	DefaultTTL             = 24 * time.Hour
	DefaultMaxEnvironments = 4
)

// Box hygiene checks run before a worker starts, and their policies.
const (
	HygieneSSHAgent      = "sshAgent"
	HygieneDockerSocket  = "dockerSocket"
	HygieneCleanEnv      = "cleanEnv"
	HygieneMetadataRoute = "metadataRoute"
	HygieneEnforce       = "enforce"
	HygieneWarn          = "warn"
)

// HygieneChecks lists the check names in the order they run.
var HygieneChecks = []string{HygieneSSHAgent, HygieneDockerSocket, HygieneCleanEnv, HygieneMetadataRoute}

// HygienePolicy returns "enforce" or "warn" for a check.
func (p Profile) HygienePolicy(check string) string {
	if p.Hygiene[check] == HygieneWarn {
		return HygieneWarn
	}
	return HygieneEnforce
}

var profileIDPattern = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,62}$`)

// SetDefaults fills unset policy fields.
func (p *Profile) SetDefaults() {
	if p.Lifetime.IdleTimeout == 0 {
		p.Lifetime.IdleTimeout = Duration(DefaultIdleTimeout)
	}
	if p.Lifetime.TTL == 0 {
		p.Lifetime.TTL = Duration(DefaultTTL)
	}
	if p.MaxEnvironments == 0 {
		p.MaxEnvironments = DefaultMaxEnvironments
	}
	if len(p.Settings) == 0 {
		p.Settings = json.RawMessage("{}")
	}
}

// Validate checks the provider-independent fields and names the first bad one.
// Pool is a profile's prepared pool: machines leased, bootstrapped and with their worker admitted
// before any session asks, so that a dispatch only claims one and syncs its workspace.
type Pool struct {
	// MinReady is how many unassigned ready machines the gateway keeps (it leases more as
	// dispatches claim them); MaxReady how many idle ones it keeps from their idle timeout
	// (default MinReady).
	MinReady int `json:"minReady,omitempty" yaml:"minReady"`
	MaxReady int `json:"maxReady,omitempty" yaml:"maxReady"`
}

// Keep is how many unassigned machines the pool keeps from their idle timeout.
func (p Pool) Keep() int { return max(p.MinReady, p.MaxReady) }

// Price is a machine's price in US dollars.
type Price struct {
	// PerHour is charged for every second of a lease, from its request to the proof of its
	// teardown.
	PerHour float64 `json:"perHour,omitempty" yaml:"perHour"`
	// MinimumMinutes is the least a lease is billed for (a provider's minimum billing); a lease
	// is reserved against the budgets at that much before it is made.
	MinimumMinutes float64 `json:"minimumMinutes,omitempty" yaml:"minimumMinutes"`
}

func (p *Profile) Validate() error {
	switch pl := p.Pool; {
	case pl.MinReady < 0 || pl.MinReady > 100:
		return Fieldf("pool.minReady", "must be from 0 to 100, got %d", pl.MinReady)
	case pl.MaxReady < 0 || pl.MaxReady > 100:
		return Fieldf("pool.maxReady", "must be from 0 to 100, got %d", pl.MaxReady)
	case pl.MaxReady > 0 && pl.MaxReady < pl.MinReady:
		return Fieldf("pool.maxReady", "must be at least pool.minReady (%d), got %d", pl.MinReady, pl.MaxReady)
	}
	if !(p.Price.PerHour >= 0 && p.Price.PerHour <= 1e4) {
		return Fieldf("price.perHour", "must be a number of US dollars per hour from 0 to 10000, got %v", p.Price.PerHour)
	}
	if !(p.Price.MinimumMinutes >= 0 && p.Price.MinimumMinutes <= 60*24*31) {
		return Fieldf("price.minimumMinutes", "must be from 0 to a month of minutes, got %v", p.Price.MinimumMinutes)
	}
	switch {
	case p.ID == "":
		return Fieldf("id", "is required")
	case !profileIDPattern.MatchString(p.ID):
		return Fieldf("id", "%q must be lowercase letters, digits, '-' or '_' (at most 63)", p.ID)
	case p.Provider == "":
		return Fieldf("provider", "is required")
	case p.Lifetime.IdleTimeout < 0:
		return Fieldf("lifetime.idleTimeout", "must not be negative")
	case p.Lifetime.TTL < 0:
		return Fieldf("lifetime.ttl", "must not be negative")
	case p.MaxEnvironments < 0 || p.MaxEnvironments > 1000:
		return Fieldf("maxEnvironments", "must be between 1 and 1000, got %d", p.MaxEnvironments)
	}
	if !(p.Sync.MaxDeleteShare >= 0 && p.Sync.MaxDeleteShare <= 1) { // NaN too
		return Fieldf("sync.maxDeleteShare", "must be a share between 0 and 1 (0: the default, 0.5), got %v", p.Sync.MaxDeleteShare)
	}
	switch s := p.Sync; {
	case s.MaxInboundBytes < 0 || s.MaxInboundBytes > MaxInboundBytesCeiling:
		return Fieldf("sync.maxInboundBytes", "must be from 1 to %d bytes (0: the default, 4 GiB), got %d", int64(MaxInboundBytesCeiling), s.MaxInboundBytes)
	case s.MaxInboundEntries < 0 || s.MaxInboundEntries > MaxInboundEntriesCeiling:
		return Fieldf("sync.maxInboundEntries", "must be from 1 to %d (0: the default, 200000), got %d", MaxInboundEntriesCeiling, s.MaxInboundEntries)
	case s.MaxInboundFileBytes < 0 || s.MaxInboundFileBytes > MaxInboundBytesCeiling:
		return Fieldf("sync.maxInboundFileBytes", "must be from 1 to %d bytes (0: the default, 1 GiB), got %d", int64(MaxInboundBytesCeiling), s.MaxInboundFileBytes)
	case s.MaxInboundBytes > 0 && s.MaxInboundFileBytes > s.MaxInboundBytes:
		return Fieldf("sync.maxInboundFileBytes", "must not exceed sync.maxInboundBytes (%d), got %d", s.MaxInboundBytes, s.MaxInboundFileBytes)
	}
	for i, pat := range p.Sync.Include {
		if pat == "" {
			return Fieldf(fmt.Sprintf("sync.include[%d]", i), "must not be empty")
		}
	}
	for i, pat := range p.Sync.Exclude {
		if pat == "" {
			return Fieldf(fmt.Sprintf("sync.exclude[%d]", i), "must not be empty")
		}
	}
	for k, v := range p.Hygiene {
		if !slices.Contains(HygieneChecks, k) {
			return Fieldf("hygiene."+k, "unknown check (known: %s)", strings.Join(HygieneChecks, ", "))
		}
		if v != HygieneEnforce && v != HygieneWarn {
			return Fieldf("hygiene."+k, "must be %q or %q, got %q", HygieneEnforce, HygieneWarn, v)
		}
	}
	if len(p.Settings) > 0 && !json.Valid(p.Settings) {
		return Fieldf("settings", "is not valid JSON")
	}
	if err := p.Publish.validate(); err != nil {
		return err
	}
	if err := p.Git.Author.Validate("git.author"); err != nil {
		return err
	}
	return p.validatePolicy()
}

// UnmarshalYAML decodes a profile, converting its free-form settings to JSON.
func (p *Profile) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.MappingNode {
		for i := 0; i+1 < len(n.Content); i += 2 {
			switch k := n.Content[i].Value; k {
			case "id", "provider", "settings", "lifetime", "sync", "maxEnvironments", "hygiene", "setup", "fallback", "capacityPattern", "checkpoint", "publish", "git", "price", "pool":
			default:
				return Fieldf(k, "unknown field (line %d)", n.Content[i].Line)
			}
		}
	}
	type plain Profile
	var raw struct {
		plain    `yaml:",inline"`
		Settings yaml.Node `yaml:"settings"`
	}
	if err := n.Decode(&raw); err != nil {
		return err
	}
	*p = Profile(raw.plain)
	if raw.Settings.Kind != 0 {
		var v any
		if err := raw.Settings.Decode(&v); err != nil {
			return Fieldf("settings", "%v", err)
		}
		b, err := json.Marshal(v)
		if err != nil {
			return Fieldf("settings", "%v", err)
		}
		p.Settings = b
	}
	return nil
}

// Duration is a time.Duration written as a Go duration string ("30m", "24h").
type Duration time.Duration

// D returns the value as a time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

func (d Duration) String() string { return time.Duration(d).String() }

// MarshalJSON writes the duration as a string.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(d.String()) }

// UnmarshalJSON accepts a duration string or a number of nanoseconds.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		var n int64
		if err2 := json.Unmarshal(b, &n); err2 != nil {
			return fmt.Errorf("duration must be a string like \"30m\"")
		}
		*d = Duration(n)
		return nil
	}
	return d.parse(s)
}

// UnmarshalYAML accepts a duration string.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	var s string
	if err := n.Decode(&s); err != nil {
		return err
	}
	if err := d.parse(s); err != nil {
		return fmt.Errorf("line %d: %w", n.Line, err)
	}
	return nil
}

// MarshalYAML writes the duration as a string.
func (d Duration) MarshalYAML() (any, error) { return d.String(), nil }

func (d *Duration) parse(s string) error {
	if s == "" {
		*d = 0
		return nil
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("invalid duration %q (use e.g. 30m, 24h)", s)
	}
	*d = Duration(v)
	return nil
}

// ValidProfileID reports whether id is a well-formed profile id.
func ValidProfileID(id string) bool { return profileIDPattern.MatchString(id) }

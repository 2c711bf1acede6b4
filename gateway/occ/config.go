package occ

import (
	"fmt"
	"net"
	"net/url"
	"regexp"
	"slices"
	"sort"
	"time"

	"github.com/openclaw/cloudworkers/providers"
)

// Config is the gateway's occ section: which worker profile serves each OCC namespace.
type Config struct {
	// DefaultProfile serves a namespace not listed in Namespaces (default "local").
	DefaultProfile string `yaml:"defaultProfile"`
	// Namespaces maps an OCC namespace name to its profiles.
	Namespaces map[string]NamespaceConfig `yaml:"namespaces"`
	// MaxRequestBytes bounds one request body under /occ/v1/ (0: 1 MiB).
	MaxRequestBytes int64 `yaml:"maxRequestBytes"`
	// EndpointURL is the private wss:// (or, for a loopback host, ws://) base URL by which OCC
	// reaches this gateway; getGatewayEndpoint answers null without it.
	EndpointURL string `yaml:"endpointURL"`
	// CapacityPattern is a regular expression matched against a failed provisioning's error:
	// a match means the provider had no capacity (pendingReason WORKLOAD_UNSCHEDULABLE, and the
	// next prepareRevision tries a new lease) instead of a runtime failure.
	CapacityPattern string `yaml:"capacityPattern"`
	// TeardownTimeout bounds how long stopRevision and retireRevision wait for the provider's
	// proof of teardown before answering a retryable TEARDOWN_PENDING (0: 90s; teardown goes on).
	TeardownTimeout providers.Duration `yaml:"teardownTimeout"`
	// ProviderCheckTimeout bounds ensureNamespace's provider check, the lease CLI's list (0: 30s).
	ProviderCheckTimeout providers.Duration `yaml:"providerCheckTimeout"`
	// RouteTimeout bounds how long activateRevision and stopRevision wait for the agent's session
	// to move onto (or off) the revision's environment before answering 503 ROUTE_PENDING; the
	// move goes on and the repeated call waits again (0: 2m).
	RouteTimeout providers.Duration `yaml:"routeTimeout"`
}

// Defaults of the occ timeouts.
const (
	DefaultTeardownTimeout      = 90 * time.Second
	DefaultProviderCheckTimeout = 30 * time.Second
	DefaultRouteTimeout         = 2 * time.Minute
)

// DefaultCapacityPattern recognises the usual "no capacity" answers of lease CLIs and clouds.
const DefaultCapacityPattern = `(?i)capacity|quota|insufficient|exhausted|out of stock|no (machines|hosts|instances|servers) available`

// NamespaceConfig is one namespace's profiles: Profile by default, and a revision's
// configuration.profileId may pick another only from AllowedProfiles.
type NamespaceConfig struct {
	Profile         string   `yaml:"profile"`
	AllowedProfiles []string `yaml:"allowedProfiles"`
}

// DefaultProfile is the profile of a namespace not listed in the config.
const DefaultProfile = "local"

// MaxRequestBytesLimit is the largest occ.maxRequestBytes accepted.
const MaxRequestBytesLimit = 64 << 20

var namespaceNameRe = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

// SetDefaults fills unset fields.
func (c *Config) SetDefaults() {
	if c.DefaultProfile == "" {
		c.DefaultProfile = DefaultProfile
	}
	if c.MaxRequestBytes == 0 {
		c.MaxRequestBytes = DefaultMaxRequestBytes
	}
	if c.CapacityPattern == "" {
		c.CapacityPattern = DefaultCapacityPattern
	}
	if c.TeardownTimeout == 0 {
		c.TeardownTimeout = providers.Duration(DefaultTeardownTimeout)
	}
	if c.RouteTimeout == 0 {
		c.RouteTimeout = providers.Duration(DefaultRouteTimeout)
	}
	if c.ProviderCheckTimeout == 0 {
		c.ProviderCheckTimeout = providers.Duration(DefaultProviderCheckTimeout)
	}
}

// Validate names the first bad field (as occ.…).
func (c *Config) Validate() error {
	if c.DefaultProfile != "" && !providers.ValidProfileID(c.DefaultProfile) {
		return providers.Fieldf("occ.defaultProfile", "must be a profile id (lowercase letters, digits, '-' or '_'), got %q", c.DefaultProfile)
	}
	if c.MaxRequestBytes < 0 || c.MaxRequestBytes > MaxRequestBytesLimit {
		return providers.Fieldf("occ.maxRequestBytes", "must be from 1 to %d (0: the default, %d), got %d", MaxRequestBytesLimit, DefaultMaxRequestBytes, c.MaxRequestBytes)
	}
	if c.TeardownTimeout < 0 {
		return providers.Fieldf("occ.teardownTimeout", "must not be negative (0: the default, %s)", DefaultTeardownTimeout)
	}
	if c.RouteTimeout < 0 {
		return providers.Fieldf("occ.routeTimeout", "must not be negative (0: the default, %s)", DefaultRouteTimeout)
	}
	if c.ProviderCheckTimeout < 0 {
		return providers.Fieldf("occ.providerCheckTimeout", "must not be negative (0: the default, %s)", DefaultProviderCheckTimeout)
	}
	if _, err := regexp.Compile(c.CapacityPattern); err != nil {
		return providers.Fieldf("occ.capacityPattern", "must be a regular expression: %v", err)
	}
	if c.EndpointURL != "" {
		if err := checkEndpointURL(c.EndpointURL); err != nil {
			return providers.Fieldf("occ.endpointURL", "%v", err)
		}
	}
	names := make([]string, 0, len(c.Namespaces))
	for n := range c.Namespaces {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		ns := c.Namespaces[n]
		field := fmt.Sprintf("occ.namespaces.%s", n)
		if !namespaceNameRe.MatchString(n) {
			return providers.Fieldf(field, "namespace name must be letters, digits, '.', '_' or '-' (at most 128), got %q", n)
		}
		if !providers.ValidProfileID(ns.Profile) {
			return providers.Fieldf(field+".profile", "must be a profile id (lowercase letters, digits, '-' or '_'), got %q", ns.Profile)
		}
		for i, p := range ns.AllowedProfiles {
			if !providers.ValidProfileID(p) {
				return providers.Fieldf(fmt.Sprintf("%s.allowedProfiles[%d]", field, i), "must be a profile id (lowercase letters, digits, '-' or '_'), got %q", p)
			}
			if slices.Contains(ns.AllowedProfiles[:i], p) {
				return providers.Fieldf(fmt.Sprintf("%s.allowedProfiles[%d]", field, i), "repeats %q", p)
			}
		}
	}
	return nil
}

// profileFor returns the profile a revision of namespace name runs on: requested (a revision's
// configuration.profileId) when allowed, else the namespace's profile. The second result is
// false when requested is not allowed.
func (c *Config) profileFor(name, requested string) (string, bool) {
	ns, listed := c.Namespaces[name]
	def := c.DefaultProfile
	if listed {
		def = ns.Profile
	}
	if requested == "" || requested == def {
		return def, true
	}
	if listed && slices.Contains(ns.AllowedProfiles, requested) {
		return requested, true
	}
	return "", false
}

// checkEndpointURL requires wss://host[:port][/path], or ws:// for a loopback host.
func checkEndpointURL(s string) error {
	u, err := url.Parse(s)
	if err != nil || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return fmt.Errorf("must be wss://host[:port][/path], got %q", s)
	}
	switch u.Scheme {
	case "wss":
		return nil
	case "ws":
		h := u.Hostname()
		if ip := net.ParseIP(h); h == "localhost" || (ip != nil && ip.IsLoopback()) {
			return nil
		}
		return fmt.Errorf("ws:// is accepted only for a loopback host (use wss://), got %q", s)
	}
	return fmt.Errorf("must be wss://host[:port][/path], got %q", s)
}

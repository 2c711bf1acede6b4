package command

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/openclaw/cloudworkers/providers"
)

// Settings is the profile settings shape of the command provider.
type Settings struct {
	// Argv templates. Placeholders like {leaseId} are substituted inside each argument;
	// nothing is ever evaluated by a shell.
	Provision []string `json:"provision"`
	Inspect   []string `json:"inspect"`
	Destroy   []string `json:"destroy"`
	Renew     []string `json:"renew,omitempty"`
	List      []string `json:"list,omitempty"`

	// Timeout bounds each command (default 5m).
	Timeout string `json:"timeout,omitempty"`
	// ReadyTimeout bounds the wait for a provisioned lease to report ready (default 10m).
	ReadyTimeout string `json:"readyTimeout,omitempty"`
	// PollInterval is the pause between inspect calls while waiting (default 2s).
	PollInterval string `json:"pollInterval,omitempty"`

	// GoneStates are inspect states that prove a lease no longer exists.
	GoneStates []string `json:"goneStates,omitempty"`
	// NotFoundPattern matches the output of a failing inspect or destroy that proves the lease is gone.
	NotFoundPattern string `json:"notFoundPattern,omitempty"`
	// LeaseIDPrefix prefixes lease ids derived from operation ids (default "ocl_").
	LeaseIDPrefix string `json:"leaseIdPrefix,omitempty"`
	// Class is substituted for {class}.
	Class string `json:"class,omitempty"`
	// Env is added to the small clean environment every command gets.
	Env map[string]string `json:"env,omitempty"`
}

// Defaults of the command provider settings.
const (
	DefaultTimeout         = 5 * time.Minute
	DefaultReadyTimeout    = 10 * time.Minute
	DefaultPollInterval    = 2 * time.Second
	DefaultNotFoundPattern = `(?i)not found|no such lease|unknown lease`
	DefaultLeaseIDPrefix   = "ocl_"
)

// DefaultGoneStates are the inspect states that prove a lease is gone unless settings say otherwise:
// ours plus every terminal state of Crabbox (statusTerminalState in openclaw/crabbox
// internal/cli/status.go).
var DefaultGoneStates = []string{"gone", "deleted", "deleting", "expired", "failed", "missing", "released",
	"stopped", "stopped_with_code", "terminated"}

// Placeholders known in argv templates.
const (
	phOpID        = "opId"
	phEnvID       = "envId"
	phGatewayID   = "gatewayId"
	phLeaseID     = "leaseId"
	phClass       = "class"
	phTTL         = "ttl"
	phIdleTimeout = "idleTimeout"
	phSlug        = "slug"
)

var allPlaceholders = []string{phOpID, phEnvID, phGatewayID, phLeaseID, phSlug, phClass, phTTL, phIdleTimeout}

// available lists the placeholders each command may use: an inspect or destroy does not know the
// operation id, and list knows no lease at all.
var available = map[string][]string{
	"provision": allPlaceholders,
	"inspect":   {phEnvID, phGatewayID, phLeaseID, phClass, phTTL, phIdleTimeout},
	"destroy":   {phEnvID, phGatewayID, phLeaseID, phClass, phTTL, phIdleTimeout},
	"renew":     {phEnvID, phGatewayID, phLeaseID, phClass, phTTL, phIdleTimeout},
	"list":      {phClass, phTTL, phIdleTimeout},
}

var placeholderRE = regexp.MustCompile(`\{([A-Za-z][A-Za-z0-9_]*)\}`)

var (
	leaseIDPrefixRE = regexp.MustCompile(`^[A-Za-z0-9_.-]{0,32}$`)
	envNameRE       = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
)

// config is validated settings ready to run.
type config struct {
	templates     map[string][]string
	timeout       time.Duration
	readyTimeout  time.Duration
	pollInterval  time.Duration
	goneStates    map[string]bool
	notFound      *regexp.Regexp
	leaseIDPrefix string
	class         string
	env           map[string]string

	// Set by the Crabbox preset (crabbox.go); zero for the generic provider.
	crabbox *crabboxConfig
	// workDir is where every command runs: a directory the gateway owns, never its own cwd.
	workDir string
}

// decodeStrict decodes settings JSON into v, refusing unknown fields and naming them.
func decodeStrict(raw json.RawMessage, v any) error {
	if len(bytes.TrimSpace(raw)) == 0 {
		raw = json.RawMessage("{}")
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		msg := err.Error()
		if name, ok := strings.CutPrefix(msg, "json: unknown field "); ok {
			return providers.Fieldf("settings."+strings.Trim(name, `"`), "unknown field")
		}
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && te.Field != "" {
			return providers.Fieldf("settings."+te.Field, "must be %s, not %s", te.Type, te.Value)
		}
		return providers.Fieldf("settings", "%v", err)
	}
	if dec.More() {
		return providers.Fieldf("settings", "trailing data after the settings object")
	}
	return nil
}

func parseSettings(raw json.RawMessage) (*config, error) {
	var s Settings
	if err := decodeStrict(raw, &s); err != nil {
		return nil, err
	}
	return s.compile()
}

// compile validates s and returns the runnable configuration, naming the first bad field.
func (s Settings) compile() (*config, error) {
	c := &config{templates: map[string][]string{}}
	for _, t := range []struct {
		name     string
		argv     []string
		required bool
	}{
		{"provision", s.Provision, true},
		{"inspect", s.Inspect, true},
		{"destroy", s.Destroy, true},
		{"renew", s.Renew, false},
		{"list", s.List, false},
	} {
		if err := checkTemplate(t.name, t.argv, t.required); err != nil {
			return nil, err
		}
		if len(t.argv) > 0 {
			c.templates[t.name] = t.argv
		}
	}
	var err error
	if c.timeout, err = parseDur("settings.timeout", s.Timeout, DefaultTimeout); err != nil {
		return nil, err
	}
	if c.readyTimeout, err = parseDur("settings.readyTimeout", s.ReadyTimeout, DefaultReadyTimeout); err != nil {
		return nil, err
	}
	if c.pollInterval, err = parseDur("settings.pollInterval", s.PollInterval, DefaultPollInterval); err != nil {
		return nil, err
	}
	gone := s.GoneStates
	if gone == nil {
		gone = DefaultGoneStates
	}
	c.goneStates = map[string]bool{}
	for i, st := range gone {
		if strings.TrimSpace(st) == "" {
			return nil, providers.Fieldf(fmt.Sprintf("settings.goneStates[%d]", i), "must not be empty")
		}
		c.goneStates[st] = true
	}
	pat := s.NotFoundPattern
	if pat == "" {
		pat = DefaultNotFoundPattern
	}
	if c.notFound, err = regexp.Compile(pat); err != nil {
		return nil, providers.Fieldf("settings.notFoundPattern", "%v", err)
	}
	if c.notFound.MatchString("") {
		return nil, providers.Fieldf("settings.notFoundPattern", "must not match empty output")
	}
	c.leaseIDPrefix = s.LeaseIDPrefix
	if c.leaseIDPrefix == "" {
		c.leaseIDPrefix = DefaultLeaseIDPrefix
	}
	if !leaseIDPrefixRE.MatchString(c.leaseIDPrefix) {
		return nil, providers.Fieldf("settings.leaseIdPrefix", "must be at most 32 letters, digits, '_', '-' or '.'")
	}
	if s.Class != "" {
		if err := providers.CheckMachineClass(s.Class); err != nil {
			return nil, providers.Fieldf("settings.class", "%s", err.(*providers.FieldError).Message)
		}
	}
	c.class = s.Class
	c.env = map[string]string{}
	keys := make([]string, 0, len(s.Env))
	for k := range s.Env {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if !envNameRE.MatchString(k) {
			return nil, providers.Fieldf("settings.env."+k, "is not a valid environment variable name")
		}
		if strings.ContainsRune(s.Env[k], 0) {
			return nil, providers.Fieldf("settings.env."+k, "must not contain NUL")
		}
		c.env[k] = s.Env[k]
	}
	return c, nil
}

func checkTemplate(name string, argv []string, required bool) error {
	field := "settings." + name
	if len(argv) == 0 {
		if required {
			return providers.Fieldf(field, "is required (an argv array such as [\"./bin/lease\", %q, \"{leaseId}\"])", name)
		}
		return nil
	}
	if strings.TrimSpace(argv[0]) == "" {
		return providers.Fieldf(field+"[0]", "must name the program to run")
	}
	allowed := available[name]
	for i, arg := range argv {
		f := fmt.Sprintf("%s[%d]", field, i)
		if strings.ContainsRune(arg, 0) {
			return providers.Fieldf(f, "must not contain NUL")
		}
		for _, m := range placeholderRE.FindAllStringSubmatch(arg, -1) {
			switch {
			case !slices.Contains(allPlaceholders, m[1]):
				return providers.Fieldf(f, "unknown placeholder %s (known: {%s})", m[0], strings.Join(allPlaceholders, "}, {"))
			case !slices.Contains(allowed, m[1]):
				return providers.Fieldf(f, "placeholder %s is not available in %s", m[0], name)
			}
		}
	}
	return nil
}

func parseDur(field, s string, def time.Duration) (time.Duration, error) {
	if s == "" {
		return def, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, providers.Fieldf(field, "invalid duration %q (use e.g. 30s, 5m)", s)
	}
	if d <= 0 {
		return 0, providers.Fieldf(field, "must be positive")
	}
	return d, nil
}

// expand substitutes placeholders in argv. Unknown placeholders were refused by validation. Every
// value is checked by the providers package's checker for its kind first (a machine class by
// CheckMachineClass, every other value by CheckArg), so no value can add an argument, read as an
// option or carry shell syntax into a template that runs a shell: the argv keeps the template's
// shape or the command does not run. An empty value (a placeholder the command does not know
// yet) substitutes as empty.
func expand(argv []string, vars map[string]string) ([]string, error) {
	for _, name := range allPlaceholders {
		v := vars[name]
		if v == "" || !usesPlaceholder(argv, name) {
			continue
		}
		var err error
		if name == phClass {
			err = providers.CheckMachineClass(v)
		} else {
			err = providers.CheckArg(name, v)
		}
		if err != nil {
			return nil, fmt.Errorf("lease CLI argument {%s} refused: %w", name, err)
		}
	}
	out := make([]string, len(argv))
	for i, arg := range argv {
		out[i] = placeholderRE.ReplaceAllStringFunc(arg, func(m string) string {
			if v, ok := vars[m[1:len(m)-1]]; ok {
				return v
			}
			return m
		})
	}
	return out, nil
}

// usesPlaceholder reports whether an argument of argv names {name}.
func usesPlaceholder(argv []string, name string) bool {
	for _, arg := range argv {
		if strings.Contains(arg, "{"+name+"}") {
			return true
		}
	}
	return false
}

// FormatDuration writes d the way lease CLIs such as Crabbox read it: "24h", "30m", "1h30m".
func FormatDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

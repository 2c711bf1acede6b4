package command

import (
	"encoding/json"
	"strings"

	"github.com/openclaw/cloudworkers/providers"
)

// CrabboxSettings is the profile settings shape of the Crabbox preset.
type CrabboxSettings struct {
	// Binary is the crabbox executable (default "crabbox", looked up in PATH).
	Binary string `json:"binary,omitempty"`
	// Provider and Class choose the machine; omitted flags use Crabbox's own defaults.
	Provider string `json:"provider,omitempty"`
	Class    string `json:"class,omitempty"`
	// TTL and IdleTimeout default to the profile's lifetime.
	TTL         string `json:"ttl,omitempty"`
	IdleTimeout string `json:"idleTimeout,omitempty"`

	Timeout      string            `json:"timeout,omitempty"`
	ReadyTimeout string            `json:"readyTimeout,omitempty"`
	PollInterval string            `json:"pollInterval,omitempty"`
	Env          map[string]string `json:"env,omitempty"`
}

// CrabboxLeaseIDPrefix prefixes lease ids of the Crabbox preset.
const CrabboxLeaseIDPrefix = "cbx_"

// NewCrabbox returns the command provider preset for the Crabbox lease CLI.
func NewCrabbox() *Provider {
	return &Provider{compile: parseCrabbox}
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
	return s.compile()
}

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
	warmup := []string{bin, "warmup"}
	if cs.Provider != "" {
		warmup = append(warmup, "--provider", cs.Provider)
	}
	if cs.Class != "" {
		warmup = append(warmup, "--class", "{class}")
	}
	warmup = append(warmup,
		"--ttl", ttl,
		"--idle-timeout", idle,
		"--lease-id", "{leaseId}",
		"--label", providers.LabelGateway+"={gatewayId}",
		"--label", providers.LabelEnvironment+"={envId}",
	)
	return Settings{
		Provision:     warmup,
		Inspect:       []string{bin, "inspect", "--id", "{leaseId}", "--json"},
		Renew:         []string{bin, "heartbeat", "--id", "{leaseId}"},
		Destroy:       []string{bin, "stop", "{leaseId}"},
		List:          []string{bin, "list", "--json"},
		Timeout:       cs.Timeout,
		ReadyTimeout:  cs.ReadyTimeout,
		PollInterval:  cs.PollInterval,
		LeaseIDPrefix: CrabboxLeaseIDPrefix,
		Class:         cs.Class,
		Env:           cs.Env,
	}, nil
}

package agents

import (
	"fmt"
	"time"

	"github.com/openclaw/cloudworkers/providers"
)

// Defaults and bounds of Config.
const (
	DefaultMaxSpawnDepth = 1
	// MaxSpawnDepthLimit is the most agents.maxSpawnDepth may be.
	MaxSpawnDepthLimit = 5
	DefaultRunTimeout  = 30 * time.Minute
	// MaxRunTimeout bounds agents.runTimeout and a spawn's runTimeoutSeconds.
	MaxRunTimeout = 24 * time.Hour
	// DefaultRetryAfter is the retryAfterMs hint of a spawn refused by a limit.
	DefaultRetryAfter = 15 * time.Second
)

// Config is the agents section of the gateway config.
type Config struct {
	// DefaultProfile is the worker profile of a spawn that names none; "" means a spawn must name
	// one.
	DefaultProfile string `yaml:"defaultProfile"`
	// MaxSpawnDepth bounds recursion: a session nobody spawned is at depth 0, its children at 1, and
	// a spawn that would make a child deeper than this is refused (default 1: children, which run
	// on workers, cannot spawn; at most 5).
	MaxSpawnDepth int `yaml:"maxSpawnDepth"`
	// RunTimeout bounds a child's turn that sets no runTimeoutSeconds (default 30m, at most 24h).
	RunTimeout providers.Duration `yaml:"runTimeout"`
}

// SetDefaults fills the zero fields.
func (c *Config) SetDefaults() {
	if c.MaxSpawnDepth == 0 {
		c.MaxSpawnDepth = DefaultMaxSpawnDepth
	}
	if c.RunTimeout == 0 {
		c.RunTimeout = providers.Duration(DefaultRunTimeout)
	}
}

// Validate names the field that cannot work (as a *providers.FieldError).
func (c Config) Validate() error {
	switch {
	case c.MaxSpawnDepth < 1 || c.MaxSpawnDepth > MaxSpawnDepthLimit:
		return providers.Fieldf("agents.maxSpawnDepth", "must be 1..%d, got %d", MaxSpawnDepthLimit, c.MaxSpawnDepth)
	case c.RunTimeout.D() < time.Second || c.RunTimeout.D() > MaxRunTimeout:
		return providers.Fieldf("agents.runTimeout", "must be 1s..%s, got %s", MaxRunTimeout, c.RunTimeout.D())
	}
	return nil
}

func (c Config) String() string {
	return fmt.Sprintf("defaultProfile=%q maxSpawnDepth=%d runTimeout=%s", c.DefaultProfile, c.MaxSpawnDepth, c.RunTimeout.D())
}

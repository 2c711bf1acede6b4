// Package boxaccess gives the operator a shell, commands and the worker's log on an
// environment's box, through the gateway's pinned SSH trust, with the box treated as hostile.
package boxaccess

import (
	"fmt"
	"time"

	"github.com/openclaw/cloudworkers/providers"
)

// Defaults of Config.
const (
	DefaultMaxFrameBytes          = 32 << 10
	DefaultOutputBytesPerSecond   = 8 << 20
	DefaultSessionsPerEnvironment = 4
	DefaultLogTailBytes           = 1 << 20
	DefaultMaxExtend              = 7 * 24 * time.Hour
	DefaultStdinStall             = 5 * time.Minute
	// MaxTailLines bounds the --tail of env logs.
	MaxTailLines = 10000
)

// Config bounds what an operator's box access may hold (the gateway config's boxAccess:
// section; zero means the default).
type Config struct {
	// MaxFrameBytes bounds one WebSocket frame of box output (and of operator input).
	MaxFrameBytes int `yaml:"maxFrameBytes"`
	// OutputBytesPerSecond bounds the box output one exec, shell or log follow relays.
	OutputBytesPerSecond int `yaml:"outputBytesPerSecond"`
	// SessionsPerEnvironment bounds the execs, shells and log reads open on one environment.
	SessionsPerEnvironment int `yaml:"sessionsPerEnvironment"`
	// LogTailBytes bounds what `env logs` without -f returns.
	LogTailBytes int `yaml:"logTailBytes"`
	// MaxExtend bounds the --ttl of `env extend`.
	MaxExtend providers.Duration `yaml:"maxExtend"`
	// StdinStall ends an exec or shell whose box has taken none of the operator's queued input
	// (2 MiB beyond the SSH window) this long: a box that never reads its stdin cannot hold the
	// session, and an operator who leaves meanwhile is noticed.
	StdinStall providers.Duration `yaml:"stdinStall"`
}

// SetDefaults fills zero fields.
func (c *Config) SetDefaults() {
	if c.MaxFrameBytes == 0 {
		c.MaxFrameBytes = DefaultMaxFrameBytes
	}
	if c.OutputBytesPerSecond == 0 {
		c.OutputBytesPerSecond = DefaultOutputBytesPerSecond
	}
	if c.SessionsPerEnvironment == 0 {
		c.SessionsPerEnvironment = DefaultSessionsPerEnvironment
	}
	if c.LogTailBytes == 0 {
		c.LogTailBytes = DefaultLogTailBytes
	}
	if c.MaxExtend == 0 {
		c.MaxExtend = providers.Duration(DefaultMaxExtend)
	}
	if c.StdinStall == 0 {
		c.StdinStall = providers.Duration(DefaultStdinStall)
	}
}

// Validate names the first bad field.
func (c Config) Validate() error {
	switch {
	case c.MaxFrameBytes != 0 && (c.MaxFrameBytes < 1024 || c.MaxFrameBytes > 1<<20):
		return providers.Fieldf("boxAccess.maxFrameBytes", "must be from 1024 to 1048576 (0: the default, %d), got %d", DefaultMaxFrameBytes, c.MaxFrameBytes)
	case c.OutputBytesPerSecond < 0 || (c.OutputBytesPerSecond != 0 && c.OutputBytesPerSecond < c.frame()):
		return providers.Fieldf("boxAccess.outputBytesPerSecond", "must be at least maxFrameBytes (%d) (0: the default, %d), got %d", c.frame(), DefaultOutputBytesPerSecond, c.OutputBytesPerSecond)
	case c.SessionsPerEnvironment < 0:
		return providers.Fieldf("boxAccess.sessionsPerEnvironment", "must be at least 1 (0: the default, %d), got %d", DefaultSessionsPerEnvironment, c.SessionsPerEnvironment)
	case c.LogTailBytes < 0:
		return providers.Fieldf("boxAccess.logTailBytes", "must be at least 1 (0: the default, %d), got %d", DefaultLogTailBytes, c.LogTailBytes)
	case c.MaxExtend < 0:
		return providers.Fieldf("boxAccess.maxExtend", "must not be negative (0: the default, %s), got %s", DefaultMaxExtend, c.MaxExtend)
	case c.StdinStall < 0:
		return providers.Fieldf("boxAccess.stdinStall", "must not be negative (0: the default, %s), got %s", DefaultStdinStall, c.StdinStall.D())
	}
	return nil
}

func (c Config) frame() int {
	if c.MaxFrameBytes == 0 {
		return DefaultMaxFrameBytes
	}
	return c.MaxFrameBytes
}

// ValidTerm reports whether a terminal name (TERM) may be passed to a box.
func ValidTerm(t string) bool {
	if t == "" || len(t) > 64 {
		return false
	}
	for _, r := range t {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.' || r == '+') {
			return false
		}
	}
	return true
}

// Exit status of a command as the CLI passes it through.
func (e Exit) String() string {
	switch {
	case e.Error != "":
		return e.Error
	case e.Signal != "":
		return fmt.Sprintf("killed by signal %s", e.Signal)
	default:
		return fmt.Sprintf("exit status %d", e.Code)
	}
}

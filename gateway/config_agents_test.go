package gateway

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/openclaw/cloudworkers/providers"
)

// The agents section is read from the YAML file and checked with the rest: a bad field is named.
func TestConfigAgents(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		yaml, field string
	}{
		{"agents:\n  defaultProfile: crabbox\n  maxSpawnDepth: 5\n  runTimeout: 1h\n", ""},
		{"agents:\n  maxSpawnDepth: 6\n", "agents.maxSpawnDepth"},
		{"agents:\n  maxSpawnDepth: -1\n", "agents.maxSpawnDepth"},
		{"agents:\n  runTimeout: 25h\n", "agents.runTimeout"},
	} {
		file := filepath.Join(dir, "gateway.yaml")
		if err := os.WriteFile(file, []byte(tc.yaml), 0o600); err != nil {
			t.Fatal(err)
		}
		var c Config
		if err := LoadConfigFile(file, &c); err != nil {
			t.Fatalf("%q: %v", tc.yaml, err)
		}
		c.SetDefaults()
		err := c.Validate()
		var fe *providers.FieldError
		switch {
		case tc.field == "" && err != nil:
			t.Errorf("%q: %v", tc.yaml, err)
		case tc.field != "" && (!errors.As(err, &fe) || fe.Field != tc.field):
			t.Errorf("%q: error %v, want one naming %s", tc.yaml, err, tc.field)
		}
	}
}

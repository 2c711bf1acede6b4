package gateway

import "testing"

// The agents section is read from the YAML file and checked with the rest: a bad field is named.
func TestConfigAgents(t *testing.T) {
	checkConfigs(t, []configCase{
		{"agents:\n  defaultProfile: crabbox\n  maxSpawnDepth: 5\n  runTimeout: 1h\n", ""},
		{"agents:\n  maxSpawnDepth: 6\n", "agents.maxSpawnDepth"},
		{"agents:\n  maxSpawnDepth: -1\n", "agents.maxSpawnDepth"},
		{"agents:\n  runTimeout: 25h\n", "agents.runTimeout"},
	})
}

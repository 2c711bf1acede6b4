package gateway

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/openclaw/cloudworkers/gateway/hub"
	"github.com/openclaw/cloudworkers/providers"
)

// configCase is a gateway.yaml and the field its Validate error must name ("" for a valid one).
type configCase struct{ yaml, field string }

// loadConfig reads yaml as a gateway.yaml file.
func loadConfig(t *testing.T, yaml string) Config {
	t.Helper()
	file := filepath.Join(t.TempDir(), "gateway.yaml")
	if err := os.WriteFile(file, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	var c Config
	if err := LoadConfigFile(file, &c); err != nil {
		t.Fatalf("%q: %v", yaml, err)
	}
	return c
}

// checkConfigs loads each case's YAML, sets the defaults and validates it, and checks the field
// named by the error.
func checkConfigs(t *testing.T, cases []configCase) {
	t.Helper()
	for _, tc := range cases {
		c := loadConfig(t, tc.yaml)
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

func TestConfigSyncCompression(t *testing.T) {
	dir := t.TempDir()
	checkConfigs(t, []configCase{
		{"sync:\n  compression: none\n", ""},
		{"sync:\n  compression: zstd\n", ""},
		{"logLevel: info\n", ""},
		{"sync:\n  compression: gzip\n", "sync.compression"},
		{"sync:\n  channels: 4\n", ""},
		{"sync:\n  channels: 99\n", "sync.channels"},
		{"sync:\n  checkpointKeep: 5\n", ""},
		{"sync:\n  checkpointKeep: -1\n", "sync.checkpointKeep"},
		{"sync:\n  reserveFreeBytes: 10737418240\n  reserveFreePercent: 10\n", ""},
		{"sync:\n  reserveFreeBytes: -1\n", "sync.reserveFreeBytes"},
		{"sync:\n  reserveFreePercent: 100\n", "sync.reserveFreePercent"},
		{"sync:\n  reserveFreePercent: .nan\n", "sync.reserveFreePercent"},
		{"sync:\n  snapshotAuthor: {name: Build Bot, email: bot@example.com}\n", ""},
		{"sync:\n  maxAllowedSecrets: 5\n", ""},
		{"sync:\n  maxAllowedSecrets: -1\n", "sync.maxAllowedSecrets"},
		{"sync:\n  snapshotAuthor: {name: \"Bot <x>\", email: bot@example.com}\n", "sync.snapshotAuthor"},
		{"git:\n  author: {name: Build Bot, email: bot@example.com}\n", ""},
		{"git:\n  author: {email: bot@example.com}\n", "git.author"},
		{"git:\n  author: {name: \"Bot\\u0007\", email: bot@example.com}\n", "git.author.name"},
		{"capacity:\n  maxWorkers: 200\n  maxInflightInference: 64\n  maxInflightInferencePerEnvironment: 4\n  maxRelayBytesPerSecondPerEnvironment: 1048576\n", ""},
		{"capacity:\n  maxWorkers: -1\n", "capacity.maxWorkers"},
		{"capacity:\n  maxInflightInference: -2\n", "capacity.maxInflightInference"},
		{"capacity:\n  maxInflightInference: 4\n  maxInflightInferencePerEnvironment: 8\n", "capacity.maxInflightInferencePerEnvironment"},
		{"capacity:\n  maxRelayBytesPerSecondPerEnvironment: -1\n", "capacity.maxRelayBytesPerSecondPerEnvironment"},
		{"occ:\n  defaultProfile: local\n  endpointURL: wss://gw.internal:7420\n  namespaces:\n    team-a: {profile: hetzner, allowedProfiles: [hetzner-big]}\n", ""},
		{"occ:\n  namespaces:\n    team-a: {profile: hetzner, allowedProfiles: [ok, \"Bad One\"]}\n", "occ.namespaces.team-a.allowedProfiles[1]"},
		{"occ:\n  namespaces:\n    team-a: {allowedProfiles: [x]}\n", "occ.namespaces.team-a.profile"},
		{"occ:\n  endpointURL: ws://gw.example.com/\n", "occ.endpointURL"},
		{"occ:\n  maxRequestBytes: -1\n", "occ.maxRequestBytes"},
		{"occ:\n  teardownTimeout: -1s\n", "occ.teardownTimeout"},
		{"occ:\n  providerCheckTimeout: -1s\n", "occ.providerCheckTimeout"},
		{"occ:\n  capacityPattern: \"(\"\n", "occ.capacityPattern"},
	})
	var c Config
	if err := os.WriteFile(filepath.Join(dir, "bad.yaml"), []byte("sync:\n  compresion: none\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := LoadConfigFile(filepath.Join(dir, "bad.yaml"), &c); err == nil {
		t.Error("a misspelt sync field was accepted")
	}
}

// With several bad fields in a section, the first in the section's order is named, every time
// (the checks once ran over a map).
func TestConfigNamesTheFirstBadFieldInOrder(t *testing.T) {
	for range 20 {
		checkConfigs(t, []configCase{
			{"worker:\n  limits:\n    callsPerConnection: -1\n    bytesPerEnvironment: -1\n    refusalAuditWindow: -1s\n", "worker.limits.callsPerConnection"},
			{"box:\n  commandTimeout: -1s\n  syncTimeout: -1s\n  reconcileTimeout: -1s\n", "box.commandTimeout"},
			{"placement: {drainTimeout: -2s}\n", "placement.drainTimeout"},
			{"retention:\n  audit: 1s\n  inferenceCalls: 1s\n", "retention.audit"},
		})
	}
}

// worker.writeTimeout is refused outside 1s–10m, and the other worker deadlines when negative (a
// negative relaunchGrace would make each worker supervisor spin), naming the field.
func TestConfigWorkerWriteTimeoutIsBounded(t *testing.T) {
	checkConfigs(t, []configCase{
		{"worker:\n  writeTimeout: 1s\n", ""},
		{"worker:\n  writeTimeout: 10m\n", ""},
		{"worker:\n  writeTimeout: 0s\n", ""},
		{"worker:\n  writeTimeout: 999ms\n", "worker.writeTimeout"},
		{"worker:\n  writeTimeout: -10s\n", "worker.writeTimeout"},
		{"worker:\n  writeTimeout: 10m1s\n", "worker.writeTimeout"},
		{"worker:\n  heartbeatTimeout: -1s\n", "worker.heartbeatTimeout"},
		{"worker:\n  admitTimeout: -1s\n", "worker.admitTimeout"},
		{"worker:\n  relaunchGrace: -1s\n", "worker.relaunchGrace"},
		{"worker:\n  limits: {creditStall: -1s}\n", "worker.limits.creditStall"},
		{"worker:\n  limits: {creditStall: 2m}\n", ""},
	})
}

// What gateway.yaml says of the worker deadlines reaches the hub's configuration; unset, the
// hub's defaults apply.
func TestConfigWorkerDeadlinesReachTheHub(t *testing.T) {
	for _, tc := range []struct {
		yaml             string
		heartbeat, write time.Duration
	}{
		{"worker:\n  heartbeatTimeout: 45s\n  writeTimeout: 3m\n", 45 * time.Second, 3 * time.Minute},
		{"logLevel: info\n", 0, 0},
	} {
		c := loadConfig(t, tc.yaml)
		var hc hub.Config
		c.configureHub(&hc)
		if hc.HeartbeatTimeout != tc.heartbeat || hc.WriteTimeout != tc.write {
			t.Errorf("%q: hub heartbeat %s, write %s; want %s, %s", tc.yaml, hc.HeartbeatTimeout, hc.WriteTimeout, tc.heartbeat, tc.write)
		}
	}
}

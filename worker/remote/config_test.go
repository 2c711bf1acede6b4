package remote

import "testing"

func TestConfigValidate(t *testing.T) {
	cfg := Config{SocketPath: "/x", EnvironmentID: "e", Credential: "c"}
	if err := cfg.Validate(); err == nil {
		t.Fatal("Validate accepted a config without bundle hash")
	}
	cfg.BundleHash = "h"
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
}

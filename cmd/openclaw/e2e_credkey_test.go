package main_test

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// doctorKeyStep runs doctor against g (on a profile that does not exist, so the chain stops after
// the gateway's own checks) and returns its "key" step.
func doctorKeyStep(t *testing.T, g *gw) map[string]any {
	t.Helper()
	out, _ := exec.Command(openclawBin, "doctor", "-o", "json", "--profile", "no-such-profile", "--gateway", g.addr, "--data-dir", g.dataDir).Output()
	var steps []map[string]any
	if err := json.Unmarshal(out, &steps); err != nil {
		t.Fatalf("doctor output %q: %v", out, err)
	}
	for _, s := range steps {
		if s["name"] == "key" {
			return s
		}
	}
	t.Fatalf("no key step in %v", steps)
	return nil
}

// TestCredentialsKeyFileOutsideDataDir: a gateway with credentials.keyFile outside its data dir
// stores a credential sealed with that key, and its data dir holds no key (a copy of it has
// ciphertext only); doctor warns about the key beside the database in the default layout and not
// in this one. A relative or unreadable keyFile stops the gateway at start, naming the key.
func TestCredentialsKeyFileOutsideDataDir(t *testing.T) {
	root := t.TempDir()
	keyPath := filepath.Join(root, "secrets", "credentials.key")
	out := startGateway(t, filepath.Join(root, "data"), "credentials: {keyFile: "+keyPath+"}\n")
	if err := out.client.SetCredential(out.ctx(), "anthropic", "sk-kept-outside"); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(keyPath); err != nil || fi.Mode().Perm() != 0o600 || fi.Size() != 32 {
		t.Fatalf("key file %s: %v %v", keyPath, fi, err)
	}
	entries, err := os.ReadDir(out.dataDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if strings.Contains(e.Name(), ".key") {
			t.Errorf("data dir holds %s", e.Name())
		}
	}
	if s := doctorKeyStep(t, out); s["ok"] != true || s["warning"] == true {
		t.Errorf("doctor with the key outside the data dir: %v", s)
	}

	def := startGateway(t, filepath.Join(root, "data-default"), "")
	if err := def.client.SetCredential(def.ctx(), "anthropic", "sk-beside"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(def.dataDir, "credentials.key")); err != nil {
		t.Fatalf("default layout: %v", err)
	}
	if s := doctorKeyStep(t, def); s["ok"] != true || s["warning"] != true || !strings.Contains(s["fix"].(string), "credentials.keyFile") {
		t.Errorf("doctor with the key beside the database: %v", s)
	}

	for _, c := range []struct{ name, keyFile string }{
		{"relative", "secrets/credentials.key"},
		{"unreadable", root}, // a directory
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			cfg := filepath.Join(dir, "config.yaml")
			if err := os.WriteFile(cfg, []byte("credentials: {keyFile: "+c.keyFile+"}\nworkspaces: {roots: ["+os.TempDir()+"]}\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			out, err := exec.Command(openclawBin, "gateway", "--data-dir", filepath.Join(dir, "data"), "--listen", freeAddr(t), "--config", cfg).CombinedOutput()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || !strings.Contains(string(out), "credentials.keyFile") {
				t.Fatalf("gateway with keyFile %q: %v\n%s", c.keyFile, err, out)
			}
		})
	}
}

package openclaw

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeProfiles keeps profiles as the gateway's store would, refusing a class with a space as its
// validation would.
type fakeProfiles struct {
	mu    sync.Mutex
	m     map[string]CloudProfile
	calls int
	// entered and gate, when set, hold an apply until the test lets it go
	entered, gate chan struct{}
}

func (f *fakeProfiles) list(context.Context) ([]CloudProfile, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []CloudProfile
	for _, p := range f.m {
		out = append(out, p)
	}
	return out, nil
}

func (f *fakeProfiles) apply(_ context.Context, ch ProfileChanges) error {
	if f.gate != nil {
		f.entered <- struct{}{}
		<-f.gate
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	for _, p := range ch.Put {
		if strings.Contains(p.Class, " ") {
			return errors.New("settings.class: must be a machine class name")
		}
	}
	for _, id := range ch.Delete {
		delete(f.m, id)
	}
	for _, p := range ch.Put {
		f.m[p.ID] = p
	}
	return nil
}

func configRig(t *testing.T) (*rig, *tclient, *fakeProfiles) {
	fp := &fakeProfiles{m: map[string]CloudProfile{"local": {ID: "local", Provider: "local"},
		"cbx": {ID: "cbx", Provider: "crabbox", Backend: "hetzner", Class: "cx22", TTL: "8h", IdleTimeout: "45m"}}}
	r := newRig(t, func(c *Config) { c.CloudProfiles, c.ApplyProfiles = fp.list, fp.apply })
	return r, adminClient(t, r), fp
}

func configHash(t *testing.T, c *tclient) (string, map[string]any) {
	t.Helper()
	m := call(c, "g", "config.get", map[string]any{})
	if m["ok"] != true {
		t.Fatalf("config.get: %v", m)
	}
	p := m["payload"].(map[string]any)
	return p["hash"].(string), p["config"].(map[string]any)["cloudWorkers"].(map[string]any)["profiles"].(map[string]any)
}

// config.get shows our profiles as OpenClaw's cloudWorkers.profiles; config.patch from the Cloud
// workers page creates, edits and removes them through the gateway's validation.
func TestConfigPatchEditsProfiles(t *testing.T) {
	_, c, fp := configRig(t)
	hash, profs := configHash(t, c)
	cbx := profs["cbx"].(map[string]any)
	if cbx["provider"] != "crabbox" || cbx["settings"].(map[string]any)["class"] != "cx22" || profs["local"].(map[string]any)["provider"] != "local" {
		t.Fatalf("config.get profiles %v", profs)
	}
	// what the page sends to add a profile (its form's every field)
	add := `{"cloudWorkers":{"profiles":{"new":{"provider":"crabbox","install":"bundle","readyWorkers":null,"suspendAfter":null,
		"settings":{"provider":"aws","target":null,"class":"c7a.large","ttl":"8h","idleTimeout":"45m","setup":null,"setupEnv":null,"warmImage":null,"desktop":null,"binary":null}}}}}`
	m := call(c, "a", "config.patch", map[string]any{"raw": add, "baseHash": hash})
	if m["ok"] != true {
		t.Fatalf("add: %v", m)
	}
	if got := fp.m["new"]; got.Provider != "crabbox" || got.Backend != "aws" || got.Class != "c7a.large" || got.TTL != "8h" {
		t.Fatalf("the new profile %+v", got)
	}
	newHash := m["payload"].(map[string]any)["hash"].(string)
	if newHash == hash {
		t.Fatal("the hash did not change with the profiles")
	}
	// a merge patch of one field keeps the others
	m = call(c, "e", "config.patch", map[string]any{"raw": `{"cloudWorkers":{"profiles":{"cbx":{"settings":{"class":"cx32"}}}}}`, "baseHash": newHash})
	if m["ok"] != true || fp.m["cbx"].Class != "cx32" || fp.m["cbx"].Backend != "hetzner" || fp.m["cbx"].IdleTimeout != "45m" {
		t.Fatalf("edit: %v, profile %+v", m, fp.m["cbx"])
	}
	hash, _ = configHash(t, c)
	m = call(c, "d", "config.patch", map[string]any{"raw": `{"cloudWorkers":{"profiles":{"new":null}}}`, "baseHash": hash})
	if _, ok := fp.m["new"]; m["ok"] != true || ok {
		t.Fatalf("delete: %v, profiles %v", m, fp.m)
	}
}

// Every refusal names what was wrong and changes nothing.
func TestConfigPatchRefusals(t *testing.T) {
	r, c, fp := configRig(t)
	hash, _ := configHash(t, c)
	prof := func(body string) string { return `{"cloudWorkers":{"profiles":{"p":` + body + `}}}` }
	for _, tc := range []struct {
		raw, base, msg string
	}{
		{prof(`{"settings":{"class":"x"}}`), "", "base hash required"},
		{prof(`{"settings":{"class":"x"}}`), "sha256:stale", "config changed since last load"},
		{`{"ui":{"prefs":{"theme":"dark"}}}`, hash, "ui is not kept by this gateway"},
		{`{"cloudWorkers":{"preparedPool":{"maxTotal":2}}}`, hash, "no prepared pool"},
		{`{"cloudWorkers":{"projectProfiles":{"/repo":"p"}}}`, hash, "no repository defaults"},
		{`[1,2]`, hash, "must be a JSON object"},
		{prof(`{"settings":{"class":"x","desktop":true}}`), hash, "settings.desktop: not offered"},
		{prof(`{"readyWorkers":3,"settings":{"class":"x"}}`), hash, "readyWorkers: this gateway keeps no prepared pool"},
		{prof(`{"suspendAfter":"10m","settings":{"class":"x"}}`), hash, "suspendAfter"},
		{prof(`{"settings":{"class":"x","target":"macos"}}`), hash, "settings.target: this gateway's workers run linux"},
		{prof(`{"settings":{"class":"x","setup":"make deps"}}`), hash, "settings.setup"},
		{prof(`{"settings":{"class":"x","sneaky":1}}`), hash, "settings.sneaky: not kept"},
		{prof(`{"settings":{"class":7}}`), hash, "settings.class: must be a string"},
		{prof(`{"oops":1}`), hash, "unknown field"},
		{prof(`{"settings":{"class":"x; id"}}`), hash, "settings.class: must be a machine class name"},
		{`{"cloudWorkers":{"profiles":{"absent":null}}}`, hash, "no such profile"},
	} {
		m := call(c, "x", "config.patch", map[string]any{"raw": tc.raw, "baseHash": tc.base})
		if code, msg, _ := errCode(m); m["ok"] != false || code != CodeInvalidRequest || !strings.Contains(msg, tc.msg) {
			t.Errorf("config.patch %s (base %q): %v, want %q", tc.raw, tc.base, m, tc.msg)
		}
	}
	if _, ok := fp.m["p"]; ok || len(fp.m) != 2 {
		t.Errorf("refused patches changed the profiles: %v", fp.m)
	}
	if fp.calls != 1 {
		t.Errorf("the store was asked %d times, want once (only the patch that reached validation)", fp.calls)
	}
	// without operator.admin: FORBIDDEN; config.get needs only read
	w := dial(t, r)
	if m := w.connect(connectBody(testToken)); m["ok"] != true {
		t.Fatal(m)
	}
	if code, _, _ := errCode(call(w, "w", "config.patch", map[string]any{"raw": prof(`{"settings":{"class":"x"}}`), "baseHash": hash})); code != CodeForbidden {
		t.Errorf("config.patch with read+write scopes was not refused")
	}
	if m := call(w, "g", "config.get", map[string]any{}); m["ok"] != true {
		t.Errorf("config.get with read scope: %v", m)
	}
}

// Two patches made from the same config.get cannot both apply: the second is checked against the
// state the first left, and refused as stale, not applied over it.
func TestConfigPatchesApplyOneAtATime(t *testing.T) {
	r, c, fp := configRig(t)
	c2 := adminClient(t, r)
	hash, _ := configHash(t, c)
	fp.entered, fp.gate = make(chan struct{}, 2), make(chan struct{})
	var release sync.Once
	open := func() { release.Do(func() { close(fp.gate) }) }
	defer open() // a failing test must not leave an apply held, or the server cannot stop
	c.write(map[string]any{"type": "req", "id": "p1", "method": "config.patch", "params": map[string]any{
		"raw": `{"cloudWorkers":{"profiles":{"cbx":{"settings":{"class":"cx32"}}}}}`, "baseHash": hash}})
	<-fp.entered // the first patch has passed its check and is applying
	c2.write(map[string]any{"type": "req", "id": "p2", "method": "config.patch", "params": map[string]any{
		"raw": `{"cloudWorkers":{"profiles":{"cbx":null}}}`, "baseHash": hash}})
	select {
	case <-fp.entered:
		t.Fatal("a second config.patch reached apply while the first was applying")
	case <-time.After(200 * time.Millisecond):
	}
	open()
	if m := c.res("p1"); m["ok"] != true {
		t.Fatalf("first patch: %v", m)
	}
	m := c2.res("p2")
	if _, msg, _ := errCode(m); m["ok"] == true || !strings.Contains(msg, "config changed since last load") {
		t.Fatalf("second patch from the same base: %v, want refused as stale", m)
	}
	fp.mu.Lock()
	defer fp.mu.Unlock()
	if got, ok := fp.m["cbx"]; !ok || got.Class != "cx32" {
		t.Fatalf("profile cbx after both patches: %+v (present %v), want the first patch's class", got, ok)
	}
}

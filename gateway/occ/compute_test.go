package occ

import (
	"encoding/json"
	"strings"
	"testing"
)

// The revision state table, written out independently of revTransitions.
func TestRevisionTransitions(t *testing.T) {
	all := []RevState{RevPreparing, RevReady, RevFailed, RevStopped, RevRetired}
	allowed := map[[2]RevState]bool{
		{RevPreparing, RevReady}: true, {RevPreparing, RevFailed}: true, {RevPreparing, RevStopped}: true, {RevPreparing, RevRetired}: true,
		{RevReady, RevPreparing}: true, {RevReady, RevStopped}: true, {RevReady, RevRetired}: true,
		{RevFailed, RevStopped}: true, {RevFailed, RevRetired}: true,
		{RevStopped, RevPreparing}: true, {RevStopped, RevRetired}: true,
	}
	for _, from := range all {
		for _, to := range all {
			if got := canMove(from, to); got != allowed[[2]RevState{from, to}] {
				t.Errorf("canMove(%s, %s) = %v", from, to, got)
			}
		}
	}
	if !RevRetired.Terminal() || RevStopped.Terminal() {
		t.Error("only retired is terminal")
	}
}

func TestSafeReason(t *testing.T) {
	cases := map[string]string{
		"plain words: ok/fine@x-y_z.":  "plain words: ok/fine@x-y_z.",
		"ctl\x1b[0m and <tags> & $(x)": "ctl  0m and  tags      x",
		"über":                         "ber",
		strings.Repeat("a", 400):       strings.Repeat("a", 256),
	}
	for in, want := range cases {
		if got := SafeReason(in); got != want {
			t.Errorf("SafeReason(%q) = %q; want %q", in, got, want)
		}
	}
}

func TestTailLines(t *testing.T) {
	cases := []struct {
		raw          string
		n, limit     int
		want         []string
		wantTruncate bool
	}{
		{"a\nb\nc\n", 10, 100, []string{"a", "b", "c"}, false},
		{"a\nb\nc\n", 2, 100, []string{"b", "c"}, true},
		{"aaaa\nbbb\ncc\n", 10, 7, []string{"cc"}, true}, // a line at the cut is dropped whole
		{"", 10, 100, []string{}, false},
		{"abcdef", 10, 3, []string{}, true},
		{"bad \xff utf8\n", 10, 100, []string{"bad \uFFFD utf8"}, false},
	}
	for _, c := range cases {
		got, tr := tailLines([]byte(c.raw), c.n, c.limit)
		if strings.Join(got, "|") != strings.Join(c.want, "|") || tr != c.wantTruncate || len(strings.Join(got, "\n")) > c.limit {
			t.Errorf("tailLines(%q, %d, %d) = %q %v; want %q %v", c.raw, c.n, c.limit, got, tr, c.want, c.wantTruncate)
		}
	}
}

func TestProfileFor(t *testing.T) {
	c := Config{Namespaces: map[string]NamespaceConfig{"team-a": {Profile: "p1", AllowedProfiles: []string{"p2"}}}}
	c.SetDefaults()
	cases := []struct {
		ns, requested, want string
		ok                  bool
	}{
		{"team-a", "", "p1", true},
		{"team-a", "p1", "p1", true},
		{"team-a", "p2", "p2", true},
		{"team-a", "p3", "", false},
		{"other", "", "local", true},
		{"other", "p2", "", false}, // an unlisted namespace may not pick
	}
	for _, tc := range cases {
		got, ok := c.profileFor(tc.ns, tc.requested)
		if got != tc.want || ok != tc.ok {
			t.Errorf("profileFor(%s, %q) = %q %v; want %q %v", tc.ns, tc.requested, got, ok, tc.want, tc.ok)
		}
	}
}

func TestParseRevisionConfig(t *testing.T) {
	cases := []struct {
		raw, field string
	}{
		{`{"profileId":"p","machineClass":"big","model":"anthropic/x","other":{"a":1}}`, ""},
		{`null`, ""},
		{`[1]`, "revision.configuration:"},
		{`{"profileId":"P Q"}`, "revision.configuration.profileId"},
		{`{"machineClass":"a;b"}`, "revision.configuration.machineClass"},
		{`{"model":"a\nb"}`, "revision.configuration.model"},
		{`{"requiresStoppedPredecessors":"yes"}`, "revision.configuration.requiresStoppedPredecessors"},
	}
	for _, c := range cases {
		_, err := parseRevisionConfig("revision.configuration", json.RawMessage(c.raw))
		if c.field == "" {
			if err != nil {
				t.Errorf("%s: %v", c.raw, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), c.field) {
			t.Errorf("%s: %v; want an error naming %s", c.raw, err, c.field)
		}
	}
}

func TestCapacityPattern(t *testing.T) {
	c, err := NewCompute(ComputeDeps{})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"provision: lease CLI provision exited 3: capacity exhausted in zone z1", "InsufficientInstanceCapacity", "quota exceeded"} {
		if !c.isCapacity(s) {
			t.Errorf("%q is not recognised as no capacity", s)
		}
	}
	for _, s := range []string{"provision: lease CLI provision exited 1: permission denied", "bootstrap: ssh: handshake failed"} {
		if c.isCapacity(s) {
			t.Errorf("%q is taken for no capacity", s)
		}
	}
}

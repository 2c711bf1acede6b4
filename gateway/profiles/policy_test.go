package profiles_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/openclaw/cloudworkers/providers"
	"github.com/openclaw/cloudworkers/providers/fake"
)

const policyExample = `profiles:
  - id: gpu
    provider: fake
    setup:
      steps:
        - {name: toolchain, run: "apt-get install -y build-essential", timeout: 20m}
        - {name: deps, run: "npm ci"}
      cacheKey: node20-v1
      closeNetwork: [lease-cli, egress, --drop, "{leaseId}"]
    fallback: [gpu-b, gpu-c]
    capacityPattern: "(?i)no capacity|exited 75\\b"
    checkpoint: {every: 10m, keep: 5}
    git: {author: {name: Build Bot, email: bot@example.com}}
`

// A profile's setup, fallback, capacity pattern and checkpoint cadence survive the store.
func TestPolicyRoundTrips(t *testing.T) {
	got := putAndGet(t, newStore(t, providers.Registry{"fake": fake.New()}), parseFirst(t, policyExample))
	if got.Setup == nil || len(got.Setup.Steps) != 2 || got.Setup.Steps[0].Timeout.String() != "20m0s" ||
		got.Setup.Steps[1].Run != "npm ci" || got.Setup.CacheKey != "node20-v1" || strings.Join(got.Setup.CloseNetwork, " ") != "lease-cli egress --drop {leaseId}" {
		t.Fatalf("setup read back as %+v", got.Setup)
	}
	if strings.Join(got.Fallback, ",") != "gpu-b,gpu-c" || got.CapacityPattern != `(?i)no capacity|exited 75\b` ||
		got.Checkpoint.Interval().String() != "10m0s" || got.Checkpoint.Keep != 5 {
		t.Fatalf("policy read back as fallback %v pattern %q checkpoint %+v", got.Fallback, got.CapacityPattern, got.Checkpoint)
	}
	if got.Git.Author != (providers.GitAuthor{Name: "Build Bot", Email: "bot@example.com"}) {
		t.Fatalf("git author read back as %+v", got.Git.Author)
	}
	if !got.IsCapacityError(errors.New("lease CLI provision exited 75: try later")) || got.IsCapacityError(errors.New("permission denied")) {
		t.Fatal("the profile's capacity pattern does not decide as written")
	}
}

func TestPolicyValidationNamesTheField(t *testing.T) {
	long := strings.Repeat("x", providers.MaxSetupRunBytes+1)
	for in, field := range map[string]string{
		"setup: {steps: [{name: '', run: x}]}":                         "setup.steps[0].name",
		"setup: {steps: [{name: a, run: x}, {name: a, run: y}]}":       "setup.steps[1].name",
		"setup: {steps: [{name: a, run: '  '}]}":                       "setup.steps[0].run",
		"setup: {steps: [{name: a, run: " + long + "}]}":               "setup.steps[0].run",
		"setup: {steps: [{name: a, run: x, timeout: 7h}]}":             "setup.steps[0].timeout",
		"setup: {steps: [{name: a, run: x, timeout: 10ms}]}":           "setup.steps[0].timeout",
		"setup: {steps: [{name: \"a\\nb\", run: x}]}":                  "setup.steps[0].name",
		"setup: {steps: [{name: a, run: x}], cacheKey: \"k\\u0007\"}":  "setup.cacheKey",
		"setup: {steps: [{name: a, run: x}], closeNetwork: [cli, '']}": "setup.closeNetwork[1]",
		"fallback: [a]":                                            "fallback[0]",
		"fallback: [b, b]":                                         "fallback[1]",
		"fallback: [B!]":                                           "fallback[0]",
		"capacityPattern: '('":                                     "capacityPattern",
		"checkpoint: {every: sometimes}":                           "checkpoint.every",
		"checkpoint: {every: 10s}":                                 "checkpoint.every",
		"checkpoint: {keep: -1}":                                   "checkpoint.keep",
		"checkpoint: {every: turn, keep: 1001}":                    "checkpoint.keep",
		"fallback: [b, c, d, e, f, g, h, i, j]":                    "fallback",
		"git: {author: {name: Bot}}":                               "git.author",
		"git: {author: {name: \"Bot <x>\", email: b@example.com}}": "git.author.name",
		"git: {author: {name: Bot, email: \"b\\n@x\"}}":            "git.author.email",
		"git: {author: {name: Bot, email: not-an-address}}":        "git.author.email",
	} {
		wantField(t, in, field)
	}
	// a good policy
	wantField(t, "setup: {steps: [{name: a, run: x, timeout: 1s}]}\n    fallback: [b]\n    checkpoint: {every: turn, keep: 3}", "")
	wantField(t, "git: {author: {name: Build Bot, email: bot@example.com}}", "")
}

// The default cache key changes with the steps and is stable for the same steps.
func TestSetupCacheKeyFollowsTheSteps(t *testing.T) {
	a := providers.Profile{Setup: &providers.Setup{Steps: []providers.SetupStep{{Name: "a", Run: "make"}}}}
	b := providers.Profile{Setup: &providers.Setup{Steps: []providers.SetupStep{{Name: "a", Run: "make all"}}}}
	a2 := providers.Profile{Setup: &providers.Setup{Steps: []providers.SetupStep{{Name: "a", Run: "make"}}}}
	if a.SetupCacheKey() == "" || a.SetupCacheKey() == b.SetupCacheKey() || a.SetupCacheKey() != a2.SetupCacheKey() {
		t.Fatalf("cache keys %q %q %q", a.SetupCacheKey(), b.SetupCacheKey(), a2.SetupCacheKey())
	}
	if (providers.Profile{}).SetupCacheKey() != "" {
		t.Fatal("a profile without setup has a cache key")
	}
}

package profiles_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/openclaw/cloudworkers/gateway/profiles"
	"github.com/openclaw/cloudworkers/gateway/store"
	"github.com/openclaw/cloudworkers/gateway/store/storetest"
	"github.com/openclaw/cloudworkers/providers"
	"github.com/openclaw/cloudworkers/providers/command"
	"github.com/openclaw/cloudworkers/providers/fake"
)

const issueExample = `
profiles:
  - id: netns
    provider: command
    settings:
      provision: [./examples/lease-netns/lease-netns, warmup, --lease-id, "{leaseId}",
                  --label, "openclaw.gateway={gatewayId}", --label, "openclaw.environment={envId}"]
      inspect: [./examples/lease-netns/lease-netns, inspect, --id, "{leaseId}", --json]
      destroy: [./examples/lease-netns/lease-netns, stop, "{leaseId}"]
      renew: [./examples/lease-netns/lease-netns, heartbeat, --id, "{leaseId}"]
      list: [./examples/lease-netns/lease-netns, list, --json]
      timeout: 5m
    lifetime: {idleTimeout: 30m, ttl: 24h}
    sync: {exclude: [node_modules, .venv]}
    maxEnvironments: 4
`

func TestApplyIssueExampleRoundTrips(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, providers.Registry{"command": command.New(command.Config{}), "fake": fake.New()})
	p := parseFirst(t, issueExample)
	if created, err := s.Put(ctx, &p); err != nil || !created {
		t.Fatalf("put: %v %v", err, created)
	}
	got, err := s.Get(ctx, "netns")
	if err != nil {
		t.Fatal(err)
	}
	if got.Lifetime.TTL.String() != "24h0m0s" || got.Lifetime.IdleTimeout.String() != "30m0s" ||
		got.MaxEnvironments != 4 || strings.Join(got.Sync.Exclude, ",") != "node_modules,.venv" ||
		!strings.Contains(string(got.Settings), `"{leaseId}"`) {
		t.Fatalf("round trip lost data: %+v settings=%s", got, got.Settings)
	}
	if created, err := s.Put(ctx, &got); err != nil || created {
		t.Fatalf("second put: %v created=%v", err, created)
	}
	if err := s.Delete(ctx, "netns"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, "netns"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("after delete: %v", err)
	}
}

func TestParseYAMLNamesBadInput(t *testing.T) {
	cases := map[string]string{
		"profiles:\n  - id: a\n    provider: fake\n    colour: red\n":               "colour",
		"profiles:\n  - id: a\n    provider: fake\n  - id: a\n    provider: fake\n": "profiles[1].id",
		"profiles:\n  - id: a\n    lifetime: {ttl: soon}\n":                         "soon",
		"":               "empty",
		"something: 1\n": "something",
		"profiles: []\n": "no profiles",
	}
	for in, want := range cases {
		_, err := profiles.ParseYAML(strings.NewReader(in))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: error %v, want mention of %q", in, err, want)
		}
	}
}

func TestValidateNamesBadDeleteShare(t *testing.T) {
	for in, field := range map[string]string{"1.5": "sync.maxDeleteShare", "-0.1": "sync.maxDeleteShare", ".nan": "sync.maxDeleteShare", "0.9": "", "0": ""} {
		wantField(t, "sync: {maxDeleteShare: "+in+"}", field)
	}
}

// A profile's sync settings survive the store: the inbound quotas and the deletion brake are
// read back as they were applied (the brake was lost on the way until they had columns).
func TestSyncSettingsRoundTrip(t *testing.T) {
	got := putAndGet(t, newStore(t, providers.Registry{"fake": fake.New()}), parseFirst(t, "profiles:\n  - id: big\n    provider: fake\n"+
		"    sync: {maxDeleteShare: 0.25, maxInboundBytes: 21474836480, maxInboundEntries: 1000000, maxInboundFileBytes: 4294967296}\n"))
	want := providers.SyncRules{MaxDeleteShare: 0.25, MaxInboundBytes: 20 << 30, MaxInboundEntries: 1_000_000, MaxInboundFileBytes: 4 << 30}
	if g := got.Sync; g.MaxDeleteShare != want.MaxDeleteShare || g.MaxInboundBytes != want.MaxInboundBytes ||
		g.MaxInboundEntries != want.MaxInboundEntries || g.MaxInboundFileBytes != want.MaxInboundFileBytes {
		t.Fatalf("sync settings read back as %+v, want %+v", g, want)
	}
}

func TestValidateNamesBadInboundQuotas(t *testing.T) {
	for in, field := range map[string]string{
		"maxInboundBytes: -1":                                      "sync.maxInboundBytes",
		"maxInboundBytes: 2199023255553":                           "sync.maxInboundBytes",
		"maxInboundEntries: -5":                                    "sync.maxInboundEntries",
		"maxInboundEntries: 10000001":                              "sync.maxInboundEntries",
		"maxInboundFileBytes: -1":                                  "sync.maxInboundFileBytes",
		"maxInboundBytes: 1048576, maxInboundFileBytes: 2097152":   "sync.maxInboundFileBytes",
		"maxInboundBytes: 10737418240, maxInboundEntries: 1000000": "",
		"maxInboundFileBytes: 8589934592":                          "",
	} {
		wantField(t, "sync: {"+in+"}", field)
	}
}

// Apply changes every profile or none: a delete refused because the profile is in use, or a
// put refused because it is invalid, leaves the other changes of the same call unwritten.
func TestApplyIsAllOrNothing(t *testing.T) {
	ctx := context.Background()
	db := storetest.Open(t)
	s := profiles.New(db, providers.Registry{"fake": fake.New()}, nil)
	for _, id := range []string{"busy", "idle"} {
		if _, err := s.Put(ctx, &providers.Profile{ID: id, Provider: "fake"}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := db.W.ExecContext(ctx, `INSERT INTO environments(id, profile_id, provider_id, operation_id, state, profile_snapshot, created_at, updated_at, last_activity_at)
		VALUES('env_1','busy','fake','op_1','ready','{}','x','x','x')`); err != nil {
		t.Fatal(err)
	}
	ids := func() []string {
		list, err := s.List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, p := range list {
			out = append(out, p.ID)
		}
		return out
	}
	// idle's delete and new's put come first in the call; busy's delete is refused.
	err := s.Apply(ctx, []*providers.Profile{{ID: "new", Provider: "fake"}}, []string{"idle", "busy"}, nil)
	if !errors.Is(err, profiles.ErrInUse) {
		t.Fatalf("Apply deleting a profile in use: %v, want ErrInUse", err)
	}
	if got := strings.Join(ids(), ","); got != "busy,idle" {
		t.Fatalf("after a refused Apply the profiles are %s, want busy,idle unchanged", got)
	}
	// an invalid put refuses the whole call, deletes included
	err = s.Apply(ctx, []*providers.Profile{{ID: "new", Provider: "fake"}, {ID: "bad", Provider: "no-such-provider"}}, []string{"idle"}, nil)
	if err == nil || !strings.Contains(err.Error(), "bad") {
		t.Fatalf("Apply with an invalid profile: %v, want an error naming it", err)
	}
	if got := strings.Join(ids(), ","); got != "busy,idle" {
		t.Fatalf("after a refused Apply the profiles are %s, want busy,idle unchanged", got)
	}
	// a guard that sees the profiles changed refuses the whole call too
	stale := errors.New("changed meanwhile")
	var seen []string
	err = s.Apply(ctx, []*providers.Profile{{ID: "new", Provider: "fake"}}, []string{"idle"}, func(now []providers.Profile) error {
		for _, p := range now {
			seen = append(seen, p.ID)
		}
		return stale
	})
	if !errors.Is(err, stale) || strings.Join(seen, ",") != "busy,idle" {
		t.Fatalf("Apply with a refusing guard: %v (the guard saw %v)", err, seen)
	}
	if got := strings.Join(ids(), ","); got != "busy,idle" {
		t.Fatalf("after a guard's refusal the profiles are %s, want busy,idle unchanged", got)
	}
	if err := s.Apply(ctx, []*providers.Profile{{ID: "new", Provider: "fake"}}, []string{"idle"}, nil); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(ids(), ","); got != "busy,new" {
		t.Fatalf("after Apply the profiles are %s, want busy,new", got)
	}
}

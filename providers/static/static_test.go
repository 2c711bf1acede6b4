package static

import (
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openclaw/cloudworkers/gateway/store"
	"github.com/openclaw/cloudworkers/gateway/tunnel/tunneltest"
	"github.com/openclaw/cloudworkers/internal/testrig/testenv"
	"github.com/openclaw/cloudworkers/providers"
)

func openDB(t *testing.T, path string) *store.DB {
	t.Helper()
	db, err := store.Open(testenv.Context(t, 30*time.Second), path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func profile(t *testing.T, id string, n int) providers.Profile {
	t.Helper()
	var s Settings
	for i := range n {
		s.Hosts = append(s.Hosts, Host{Host: "127.0.0.1", Port: 2200 + i, User: "dev", KeyPath: "/keys/id", HostKey: tunneltest.HostKey(t)})
	}
	b, _ := json.Marshal(s)
	return providers.Profile{ID: id, Provider: "static", Settings: b}
}

func TestClaimLifecycle(t *testing.T) {
	ctx := testenv.Context(t, 30*time.Second)
	path := filepath.Join(t.TempDir(), "gw.db")
	p := New(openDB(t, path))
	prof := profile(t, "dev", 2)
	req := providers.ProvisionRequest{EnvironmentID: "env1", GatewayID: "gw1"}

	a, err := p.Provision(ctx, prof, "op1", req)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Validate(); err != nil {
		t.Fatal(err)
	}
	if a.ID != LeaseIDFor("op1") || a.ID != p.LeaseID(prof, "op1") || a.SSHPort != 2200 || a.SSHUser != "dev" ||
		a.SSHKeyPath != "/keys/id" || a.Labels[providers.LabelEnvironment] != "env1" {
		t.Fatalf("lease = %+v", a)
	}
	again, err := p.Provision(ctx, prof, "op1", req)
	if err != nil || again.ID != a.ID || again.SSHPort != a.SSHPort {
		t.Fatalf("same operation got %+v, %v; want %+v", again, err, a)
	}
	b, err := p.Provision(ctx, prof, "op2", providers.ProvisionRequest{EnvironmentID: "env2", GatewayID: "gw1", LeaseID: "st_given"})
	if err != nil || b.ID != "st_given" || b.SSHPort != 2201 {
		t.Fatalf("second lease %+v, %v", b, err)
	}
	_, err = p.Provision(ctx, prof, "op3", req)
	if err == nil || err.Error() != "no free host in profile dev (2 hosts, all claimed)" {
		t.Fatalf("third provision: %v", err)
	}
	// Another profile has its own claims.
	if _, err := p.Provision(ctx, profile(t, "other", 1), "op4", req); err != nil {
		t.Fatal(err)
	}

	list, err := p.List(ctx, prof)
	if err != nil || len(list) != 2 || list[0].LeaseID != a.ID || list[1].Labels[providers.LabelEnvironment] != "env2" || !list[1].Ready {
		t.Fatalf("list = %+v, %v", list, err)
	}

	// Claims survive a gateway restart.
	p = New(openDB(t, path))
	if st, err := p.Inspect(ctx, prof, a); err != nil || !st.Ready || st.Gone || st.Lease.HostKeys[0] != a.HostKeys[0] {
		t.Fatalf("inspect = %+v, %v", st, err)
	}
	if err := p.Destroy(ctx, prof, a); err != nil {
		t.Fatal(err)
	}
	if err := p.Destroy(ctx, prof, a); err != nil {
		t.Fatalf("second destroy: %v", err)
	}
	if st, err := p.Inspect(ctx, prof, a); err != nil || !st.Gone {
		t.Fatalf("inspect after destroy = %+v, %v", st, err)
	}
	c, err := p.Provision(ctx, prof, "op3", req)
	if err != nil || c.SSHPort != 2200 {
		t.Fatalf("released host was not reused: %+v, %v", c, err)
	}
}

func TestConcurrentClaimsAreExclusive(t *testing.T) {
	ctx := testenv.Context(t, 30*time.Second)
	p := New(openDB(t, filepath.Join(t.TempDir(), "gw.db")))
	prof := profile(t, "dev", 3)
	const n = 12
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		hosts = map[int]string{}
		fails int
	)
	for i := range n {
		wg.Go(func() {
			l, err := p.Provision(ctx, prof, fmt.Sprintf("op%d", i), providers.ProvisionRequest{})
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err != nil && strings.Contains(err.Error(), "no free host"):
				fails++
			case err != nil:
				t.Error(err)
			default:
				if prev, dup := hosts[l.SSHPort]; dup {
					t.Errorf("host %d claimed by %s and %s", l.SSHPort, prev, l.ID)
				}
				hosts[l.SSHPort] = l.ID
			}
		})
	}
	wg.Wait()
	if len(hosts) != 3 || fails != n-3 {
		t.Fatalf("%d claims and %d refusals, want 3 and %d", len(hosts), fails, n-3)
	}
}

func TestHostRemovedFromProfile(t *testing.T) {
	ctx := testenv.Context(t, 30*time.Second)
	p := New(openDB(t, filepath.Join(t.TempDir(), "gw.db")))
	prof := profile(t, "dev", 1)
	l, err := p.Provision(ctx, prof, "op1", providers.ProvisionRequest{})
	if err != nil {
		t.Fatal(err)
	}
	edited := prof
	edited.Settings = json.RawMessage(strings.Replace(string(prof.Settings), "2200", "2299", 1))
	st, err := p.Inspect(ctx, edited, l)
	if err != nil || st.Gone || st.Ready || st.State != StateHostRemoved {
		t.Fatalf("inspect = %+v, %v: a claim on a removed host is neither gone nor ready", st, err)
	}
}

func TestValidateSettingsNamesTheField(t *testing.T) {
	hk := tunneltest.HostKey(t)
	good := fmt.Sprintf(`{"host":"h","user":"u","keyPath":"/k","hostKey":%q}`, hk)
	for _, tc := range []struct {
		settings string
		field    string
	}{
		{`{}`, "settings.hosts"},
		{`{"hosts":[]}`, "settings.hosts"},
		{`{"hosts":[` + good + `,{"host":"h2","user":"u","keyPath":"/k","hostKey":"ssh-ed25519 nope"}]}`, "settings.hosts[1].hostKey"},
		{`{"hosts":[` + good + `,{"host":"h2","user":"u","keyPath":"/k"}]}`, "settings.hosts[1].hostKey"},
		{`{"hosts":[{"user":"u","keyPath":"/k","hostKey":"x"}]}`, "settings.hosts[0].host"},
		{`{"hosts":[{"host":"h","keyPath":"/k","hostKey":"x"}]}`, "settings.hosts[0].user"},
		{`{"hosts":[{"host":"h","user":"u","hostKey":"x"}]}`, "settings.hosts[0].keyPath"},
		{`{"hosts":[{"host":"h","port":70000,"user":"u","keyPath":"/k","hostKey":"x"}]}`, "settings.hosts[0].port"},
		{`{"hosts":[` + good + `,` + good + `]}`, "settings.hosts[1].host"},
		{`{"hosts":[` + good + `],"extra":1}`, "settings.extra"},
	} {
		err := New(nil).ValidateSettings(json.RawMessage(tc.settings))
		var fe *providers.FieldError
		if !errors.As(err, &fe) || fe.Field != tc.field {
			t.Errorf("%s: err = %v, want a field error for %s", tc.settings, err, tc.field)
		}
	}
	if err := New(nil).ValidateSettings(json.RawMessage(`{"hosts":[` + good + `]}`)); err != nil {
		t.Fatal(err)
	}
	if w := New(nil).ProfileWarnings(providers.Profile{}); len(w) != 1 || w[0] != Warning {
		t.Fatalf("warnings = %q", w)
	}
}

// Claims are dated as the rest of the gateway's database dates its rows (sortable as text).
func TestClaimTimesAreTheStoresFormat(t *testing.T) {
	if timeFormat != store.TimeFormat {
		t.Fatalf("static claims are dated %q, the store writes %q", timeFormat, store.TimeFormat)
	}
}

package fake

import (
	"context"
	"errors"
	"testing"

	"golang.org/x/crypto/ssh"

	"github.com/openclaw/cloudworkers/providers"
)

func TestDefaultBehaviour(t *testing.T) {
	ctx := context.Background()
	f := New()
	var prof providers.Profile
	prof.SetDefaults()
	req := providers.ProvisionRequest{EnvironmentID: "env1", GatewayID: "gw1"}

	a, err := f.Provision(ctx, prof, "op1", req)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Validate(); err != nil {
		t.Fatal(err)
	}
	if _, _, _, _, err := ssh.ParseAuthorizedKey([]byte(a.HostKeys[0])); err != nil {
		t.Fatalf("host key %q: %v", a.HostKeys[0], err)
	}
	if a.ID != f.LeaseID(prof, "op1") || a.Labels[providers.LabelGateway] != "gw1" || a.Labels[providers.LabelEnvironment] != "env1" {
		t.Fatalf("lease = %+v", a)
	}
	again, _ := f.Provision(ctx, prof, "op1", req)
	if again.ID != a.ID || len(f.Leases()) != 1 {
		t.Fatalf("provision is not idempotent per operation: %q %q", a.ID, again.ID)
	}
	b, _ := f.Provision(ctx, prof, "op2", providers.ProvisionRequest{LeaseID: "given"})
	if b.ID != "given" {
		t.Fatalf("lease id %q, want the request's", b.ID)
	}

	if st, err := f.Inspect(ctx, prof, a); err != nil || !st.Ready || st.Gone {
		t.Fatalf("inspect = %+v, %v", st, err)
	}
	if list, err := f.List(ctx, prof); err != nil || len(list) != 2 {
		t.Fatalf("list = %+v, %v", list, err)
	}
	if err := f.Renew(ctx, prof, a); err != nil {
		t.Fatal(err)
	}
	if err := f.Destroy(ctx, prof, a); err != nil {
		t.Fatal(err)
	}
	if st, err := f.Inspect(ctx, prof, a); err != nil || !st.Gone {
		t.Fatalf("inspect after destroy = %+v, %v", st, err)
	}
	if err := f.Renew(ctx, prof, a); !errors.Is(err, providers.ErrLeaseGone) {
		t.Fatalf("renew after destroy: %v", err)
	}
	if got := f.Calls(MethodProvision); got != 3 {
		t.Fatalf("provision calls = %d", got)
	}
	if got := f.Calls(MethodInspect); got != 2 {
		t.Fatalf("inspect calls = %d", got)
	}
}

func TestFuncsOverride(t *testing.T) {
	boom := errors.New("boom")
	f := &Provider{DestroyFunc: func(context.Context, providers.Profile, providers.Lease) error { return boom }}
	if err := f.Destroy(context.Background(), providers.Profile{}, providers.Lease{ID: "x"}); !errors.Is(err, boom) {
		t.Fatalf("err = %v", err)
	}
	if f.Calls(MethodDestroy) != 1 {
		t.Fatalf("calls = %d", f.Calls(MethodDestroy))
	}
}

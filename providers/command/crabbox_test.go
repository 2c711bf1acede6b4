package command

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/openclaw/cloudworkers/gateway/tunnel/tunneltest"
	"github.com/openclaw/cloudworkers/providers"
)

// Shapes as Crabbox prints them (internal/cli/status.go, coordinator.go, hcloud.go).
func TestCrabboxJSONShapes(t *testing.T) {
	hk := tunneltest.HostKey(t)
	c, err := parseCrabbox(json.RawMessage(`{"provider":"hetzner"}`))
	if err != nil {
		t.Fatal(err)
	}
	c.workDir = t.TempDir()
	for _, tc := range []struct {
		name, obj string
		port      int
	}{
		{"string port", `{"id":"cbx_0123456789ab","state":"active","ready":true,"sshHost":"h","sshPort":"2222","sshUser":"u","sshKey":"/k","sshHostKey":"` + hk + `"}`, 2222},
		{"number port", `{"id":"cbx_0123456789ab","state":"active","ready":true,"sshHost":"h","sshPort":2200,"sshUser":"u","sshKey":"/k","sshHostKey":"` + hk + `"}`, 2200},
		{"empty port", `{"id":"cbx_0123456789ab","state":"active","ready":true,"sshHost":"h","sshPort":"","sshUser":"u","sshKey":"/k","sshHostKey":"` + hk + `"}`, 22},
	} {
		var obj leaseJSON
		if err := decodeJSON([]byte(tc.obj), &obj); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		id, _, _ := obj.identity()
		st, err := c.status(obj, id, "")
		if err != nil || st.Lease.SSHPort != tc.port || st.Lease.ID != "cbx_0123456789ab" {
			t.Fatalf("%s: %+v, %v", tc.name, st, err)
		}
	}
	for _, bad := range []string{`{"sshPort":"22; rm"}`, `{"sshPort":70000}`, `{"sshPort":true}`, `{"id":{"x":1}}`} {
		var obj leaseJSON
		err := decodeJSON([]byte(bad), &obj)
		if err == nil {
			_, _, err = obj.identity()
		}
		if err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
	// list --json of a direct provider: raw servers, numeric id, lease id and slug in labels.
	var objs []leaseJSON
	raw := `[{"CloudID":"static_h","Provider":"ssh","HostID":"","id":0,"name":"crabbox-ocl","status":"active",
		"labels":{"lease":"static_h","slug":"ocl-0123456789ab","state":"ready"},"public_net":{"ipv4":{"ip":"h"}}},
		{"id":"cbx_0123456789ab","slug":"swift-crab","provider":"hetzner","state":"released","sshPort":"22"}]`
	if err := decodeJSON([]byte(raw), &objs); err != nil {
		t.Fatal(err)
	}
	want := []providers.LeaseStatus{{LeaseID: "static_h", Slug: "ocl-0123456789ab", State: "ready"}, {LeaseID: "cbx_0123456789ab", Slug: "swift-crab", State: "released", Gone: true}}
	for i, obj := range objs {
		id, slug, err := obj.identity()
		if err != nil {
			t.Fatal(err)
		}
		st, err := c.status(obj, id, slug)
		if err != nil || st.LeaseID != want[i].LeaseID || st.Slug != want[i].Slug || st.State != want[i].State || st.Gone != want[i].Gone {
			t.Fatalf("entry %d: %+v, %v", i, st, err)
		}
	}
	for _, s := range []string{"deleting", "expired", "failed", "missing", "released", "stopped", "stopped_with_code", "terminated"} {
		if !c.goneStates[s] {
			t.Errorf("Crabbox terminal state %s is not gone", s)
		}
	}
}

func TestCrabboxRefusedLeaseIDNamesTheSetting(t *testing.T) {
	cc := &crabboxConfig{}
	usage := "flag provided but not defined: -label\nUsage of warmup:\n  -arch string\n"
	for _, tc := range []struct{ stderr, want string }{
		{"provider=ssh does not support fixed idempotent lease IDs\n", "settings.idempotentLeaseId: false"},
		{usage + "flag provided but not defined: -label\n", "0.41.1 or newer"},
	} {
		err := cc.provisionError(result{stderr: []byte(tc.stderr), exit: 2})
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "Usage of") {
			t.Errorf("%q: %v, want it to say %q without the usage text", tc.stderr, err, tc.want)
		}
	}
}

func TestParseLeasedLine(t *testing.T) {
	for line, want := range map[string]string{
		"leased static_127-0-0-1 slug=ocl-0123456789ab provider=ssh server=x": "static_127-0-0-1",
		"leased cbx_0123456789ab slug=swift-crab provider=hetzner":            "cbx_0123456789ab",
		"leased ../../etc slug=x": "",
		"leased ":                 "",
	} {
		id, ok := parseLeasedLine(line)
		if !ok || id != want {
			t.Errorf("%q: %q %v, want %q", line, id, ok, want)
		}
	}
	if _, ok := parseLeasedLine("ready ssh=u@h:22"); ok {
		t.Error("a ready line taken for a leased line")
	}
}

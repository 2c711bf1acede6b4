package api

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/labstack/echo/v4"

	"github.com/openclaw/cloudworkers/providers"
)

// A profile sent as YAML (the Control UI's editor) is decoded as strictly as JSON, and a bad
// value is named by the same field path.
func TestBindProfileYAML(t *testing.T) {
	e := echo.New()
	bindYAML := func(body string) (providers.Profile, error) {
		req := httptest.NewRequest(http.MethodPut, "/api/v1/profiles/x", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/yaml")
		var p providers.Profile
		err := bindProfile(e.NewContext(req, httptest.NewRecorder()), &p)
		return p, err
	}
	p, err := bindYAML("id: dev\nprovider: local\nlifetime: {idleTimeout: 30m, ttl: 2h}\nmaxEnvironments: 2\nsettings:\n  hosts: [{host: 198.18.0.10}]\n")
	if err != nil || p.ID != "dev" || p.MaxEnvironments != 2 || p.Lifetime.IdleTimeout.String() != "30m0s" || !strings.Contains(string(p.Settings), `"198.18.0.10"`) {
		t.Fatalf("good YAML: %+v %v", p, err)
	}
	for _, c := range []struct{ body, field, code string }{
		{"id: dev\nprovider: local\nlifetime: {idleTimeout: banana}\n", "lifetime.idleTimeout", ""},
		{"id: dev\nprovider: local\nmaxEnviroments: 2\n", "maxEnviroments", ""},
		{"id: dev\nmaxEnvironments: many\n", "maxEnvironments", ""},
		{"- id: dev\n", "", "invalid-body"},
		{"", "", "invalid-body"},
		{"id: [unclosed\n", "", "invalid-body"},
		{"a: &a [x, x]\nb: &b [*a, *a]\nc: [*b, *b]\n", "", ""}, // aliases expand, then fail as unknown fields
	} {
		_, err := bindYAML(c.body)
		var fe *providers.FieldError
		var ae *Error
		switch {
		case err == nil:
			t.Fatalf("%q: accepted", c.body)
		case c.field != "" && (!errors.As(err, &fe) || fe.Field != c.field):
			t.Fatalf("%q: %v, want field %s named", c.body, err, c.field)
		case c.code != "" && (!errors.As(err, &ae) || ae.Code != c.code):
			t.Fatalf("%q: %v, want %s", c.body, err, c.code)
		}
	}
}

func TestProfileYAMLRoundTrips(t *testing.T) {
	e := echo.New()
	in := providers.Profile{ID: "dev", Provider: "static", MaxEnvironments: 1, Settings: []byte(`{"hosts":[{"host":"198.18.0.10","user":"w"}]}`),
		Warnings: []string{"not stored"}}
	b, err := profileYAML(in)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), "not stored") || strings.Contains(string(b), `{"`) {
		t.Fatalf("YAML of a profile:\n%s", b)
	}
	req := httptest.NewRequest(http.MethodPut, "/", strings.NewReader(string(b)))
	req.Header.Set("Content-Type", "application/yaml")
	var out providers.Profile
	if err := bindProfile(e.NewContext(req, httptest.NewRecorder()), &out); err != nil {
		t.Fatalf("the YAML the gateway writes does not read back:\n%s\n%v", b, err)
	}
	if out.ID != in.ID || out.Provider != in.Provider || !strings.Contains(string(out.Settings), `"198.18.0.10"`) {
		t.Fatalf("round trip: %+v", out)
	}
}

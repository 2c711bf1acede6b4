package command

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/openclaw/cloudworkers/providers"
)

// hostileValues are the seeds of every argv test: option injection, shell syntax, separators,
// and lengths at and past the bound.
var hostileValues = []string{
	"x; id > /tmp/f #", "-x", "--lease-id=attacker-chosen", "$(id)", "`id`", "a b", "a\tb", "a\nb",
	"a|b", "a&b", "a>b", "../x", "/etc/passwd", "x'y", `x"y`, "", " ", "\x00", "é", "{leaseId}",
	strings.Repeat("a", 64), strings.Repeat("a", 65), strings.Repeat("a", 128), strings.Repeat("a", 129),
	"cx22", "ocl_0123", "env_1:2@x",
}

// FuzzExpandKeepsArgvShape: whatever value reaches a placeholder, the argv either keeps the
// template's shape — the same number of arguments, each the template's with only the
// placeholder replaced by a value that cannot read as an option or carry shell syntax — or the
// command does not run.
func FuzzExpandKeepsArgvShape(f *testing.F) {
	for _, v := range hostileValues {
		f.Add(v, "ocl_1", "cx22")
		f.Add("ocl_1", v, "cx22")
		f.Add("cx22", "ocl_1", v)
	}
	tmpl := []string{"sh", "-c", "lease --class {class} --id {leaseId} --env {envId}", "{class}", "--slug={slug}", "{gatewayId}"}
	f.Fuzz(func(t *testing.T, class, leaseID, other string) {
		vars := map[string]string{phClass: class, phLeaseID: leaseID, phEnvID: other, phSlug: other, phGatewayID: other}
		out, err := expand(tmpl, vars)
		if err != nil {
			return
		}
		if len(out) != len(tmpl) {
			t.Fatalf("argv %q has %d arguments, the template %d", out, len(out), len(tmpl))
		}
		for name, v := range vars {
			if v == "" {
				continue
			}
			if name == phClass {
				if providers.CheckMachineClass(v) != nil {
					t.Fatalf("class %q reached the argv %q", v, out)
				}
			} else if !providers.ValidArg(v) {
				t.Fatalf("%s %q reached the argv %q", name, v, out)
			}
			if strings.ContainsAny(v, " \t\n;|&$`'\"<>(){}\\/*?") || strings.HasPrefix(v, "-") {
				t.Fatalf("%s %q carries shell syntax or an option into %q", name, v, out)
			}
		}
	})
}

// A profile whose lease command runs a shell, given a hostile machine class: the check every door
// shares refuses it naming machineClass, and given to the provider anyway (a class that got past
// a door) the lease CLI does not run.
func TestShellProfileWithHostileClassRunsNothing(t *testing.T) {
	dir := t.TempDir()
	marker := filepath.Join(dir, "marker")
	rec := filepath.Join(dir, "argv.jsonl")
	exe := helperExe(t)
	prof := profile(t, map[string]any{
		"provision": []string{"sh", "-c", exe + " record " + rec + " provision {class} {leaseId}"},
		"inspect":   []string{exe, "inspect", dir, "{leaseId}"},
		"destroy":   []string{exe, "record", rec, "destroy", "{leaseId}"},
	}, nil)
	p := New(Config{WorkRoot: dir})
	for _, class := range []string{"x; touch " + marker + " #", "$(touch " + marker + ")", "-x", "--lease-id=attacker-chosen", "a b"} {
		err := providers.CheckMachineClass(class)
		var fe *providers.FieldError
		if !errors.As(err, &fe) || fe.Field != "machineClass" {
			t.Errorf("CheckMachineClass(%q): got %v, want a field error naming machineClass", class, err)
		}
		// past the doors: the provider itself refuses before it runs the command
		if _, err := p.Provision(testCtx(t), withClass(t, prof, class), "op-1", providers.ProvisionRequest{}); err == nil || !strings.Contains(err.Error(), "class") {
			t.Errorf("Provision with class %q: %v, want the class refused", class, err)
		}
		// the template's own class is held to the same check when the profile is validated
		if err := p.ValidateSettings(withClass(t, prof, class).Settings); err == nil || !strings.Contains(err.Error(), "settings.class") {
			t.Errorf("ValidateSettings with class %q: %v, want settings.class named", class, err)
		}
	}
	if _, err := os.Stat(marker); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the hostile class ran a command on the gateway (marker: %v)", err)
	}
	if b, err := os.ReadFile(rec); err == nil {
		t.Fatalf("the lease CLI ran: %s", b)
	}
	// a good class keeps the argv's shape
	good := withClass(t, prof, "cx22")
	_, _ = p.Provision(testCtx(t), good, "op-1", providers.ProvisionRequest{}) // its inspect has no host key to pin: only the provision argv matters
	b, err := os.ReadFile(rec)
	if err != nil || !strings.HasPrefix(string(b), `["provision","cx22","ocl_`) {
		t.Fatalf("recorded argv %s (%v), want provision cx22 ocl_…", b, err)
	}
}

// withClass is prof with settings.class set, without any check.
func withClass(t *testing.T, prof providers.Profile, class string) providers.Profile {
	t.Helper()
	var s map[string]any
	if err := json.Unmarshal(prof.Settings, &s); err != nil {
		t.Fatal(err)
	}
	s["class"] = class
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	prof.Settings = b
	return prof
}

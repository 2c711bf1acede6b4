package layout

import (
	"bytes"
	"encoding/json"
	"os/exec"
	"strings"
	"testing"
)

const module = "github.com/openclaw/cloudworkers/"

// floors, most specific prefix first.
var floors = []struct {
	prefix string
	floor  int
}{
	{"cmd/", 4}, {"examples/", 4},
	{"gateway", 3},
	{"providers", 2}, {"sync", 2}, {"worker", 2}, {"ui", 2},
	{"internal/", 1}, {"protocol", 1},
}

func floorOf(pkg string) int {
	for _, f := range floors {
		if pkg == strings.TrimSuffix(f.prefix, "/") || strings.HasPrefix(pkg, strings.TrimSuffix(f.prefix, "/")+"/") {
			return f.floor
		}
	}
	return 0
}

// rig reports whether pkg is a test rig: under internal/testrig, or a <name>test package.
func rig(pkg string) bool {
	last := pkg[strings.LastIndex(pkg, "/")+1:]
	return strings.HasPrefix(pkg, "internal/testrig/") || (strings.HasSuffix(last, "test") && last != "test")
}

type listed struct {
	ImportPath string
	Imports    []string
}

// packages lists the module's packages with their non-test imports, module-relative.
func packages(t *testing.T) map[string][]string {
	t.Helper()
	cmd := exec.Command("go", "list", "-json=ImportPath,Imports", module+"...")
	cmd.Dir = "../.."
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	pkgs := map[string][]string{}
	dec := json.NewDecoder(bytes.NewReader(out))
	for dec.More() {
		var p listed
		if err := dec.Decode(&p); err != nil {
			t.Fatal(err)
		}
		var imps []string
		for _, im := range p.Imports {
			if strings.HasPrefix(im, module) {
				imps = append(imps, strings.TrimPrefix(im, module))
			}
		}
		pkgs[strings.TrimPrefix(p.ImportPath, module)] = imps
	}
	return pkgs
}

// No import runs from a lower floor to a higher one, every package has a floor, and only test
// rigs import test rigs.
func TestNoImportRunsUpAFloor(t *testing.T) {
	pkgs := packages(t)
	if len(pkgs) < 50 {
		t.Fatalf("go list found %d packages: not the whole module", len(pkgs))
	}
	for pkg, imps := range pkgs {
		f := floorOf(pkg)
		if f == 0 {
			t.Errorf("%s has no floor: add its folder to the floors in internal/layout", pkg)
			continue
		}
		if rig(pkg) {
			continue
		}
		for _, im := range imps {
			switch {
			case rig(im):
				t.Errorf("%s (floor %d) imports the test rig %s: only tests and rigs may", pkg, f, im)
			case floorOf(im) > f:
				t.Errorf("%s (floor %d) imports %s (floor %d): an import up a floor", pkg, f, im, floorOf(im))
			}
		}
	}
}

// The rule itself: an upward import and a rig import are caught, a sideways one is not.
func TestFloorsCatchAnUpwardImport(t *testing.T) {
	for _, tc := range []struct {
		pkg, imp string
		up       bool
	}{
		{"sync/stream", "gateway/bootstrap", true},
		{"internal/jsonbody", "providers", true},
		{"providers/static", "gateway/store", true},
		{"gateway/placement", "sync/stream", false},
		{"cmd/openclaw", "gateway", false},
		{"internal/clock", "internal/backoff", false},
		{"ui", "gateway/api", true},
	} {
		if got := floorOf(tc.imp) > floorOf(tc.pkg); got != tc.up {
			t.Errorf("%s -> %s: upward %v, want %v", tc.pkg, tc.imp, got, tc.up)
		}
	}
	for _, p := range []string{"internal/testrig/netnsbox", "providers/local/localtest", "gateway/store/storetest"} {
		if !rig(p) {
			t.Errorf("%s is a test rig", p)
		}
	}
	if rig("gateway/turns") || rig("internal/untrusted") {
		t.Error("a product package taken for a test rig")
	}
}

package sessions

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/openclaw/cloudworkers/providers"
)

// Every path a door may name is judged after symlinks and ".." are resolved: inside a root, never
// the data dir (nor containing it, nor inside it), never a system directory or the home itself.
func TestRootsConfineWorkspaces(t *testing.T) {
	top := t.TempDir()
	home := filepath.Join(top, "home")
	proj := filepath.Join(home, "proj")
	data := filepath.Join(home, ".local", "state", "openclaw-gateway")
	other := filepath.Join(top, "elsewhere")
	for _, d := range []string{proj, data, other, filepath.Join(data, "agents", "x", "workspace"), filepath.Join(data, "anchors", "s1", "workspace"), filepath.Join(data, "worktrees", "fp", "s1")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	mustLink := func(target, name string) string {
		t.Helper()
		p := filepath.Join(proj, name)
		if err := os.Symlink(target, p); err != nil {
			t.Fatal(err)
		}
		return p
	}
	toData := mustLink(data, "to-data")
	toEtc := mustLink("/etc", "to-etc")
	toOther := mustLink(other, "to-other")
	r, err := NewRoots("workspaces.roots", []string{home}, data, home)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name, dir string
		stored    bool
		rule      string // "" allowed; else a word of the refusal
	}{
		{"a project in the root", proj, false, ""},
		{"a directory to be made in the root", filepath.Join(proj, "new", "sub"), false, ""},
		{"the data dir", data, false, "data dir"},
		{"inside the data dir", filepath.Join(data, "agents"), false, "data dir"},
		{"the data dir through ..", filepath.Join(proj, "..", ".local", "state", "openclaw-gateway"), false, "data dir"},
		{"a symlink to the data dir", toData, false, "data dir"},
		{"a directory that contains the data dir", filepath.Join(home, ".local"), false, "contains the gateway's data dir"},
		{"the home itself", home, false, "home directory"},
		{"/", "/", false, "may not be /"},
		{"/etc", "/etc", false, "/etc"},
		{"inside /etc", "/etc/ssh", false, "/etc"},
		{"a symlink to /etc", toEtc, false, "/etc"},
		{"/proc/self", "/proc/self", false, "/proc"},
		{"/root", "/root", false, "/root"},
		{"outside the roots", other, false, "outside the workspace roots"},
		{"a symlink out of the roots", toOther, false, "outside the workspace roots"},
		{"relative", "proj", false, "absolute"},
		{"a fork the gateway made, from a door", filepath.Join(data, "agents", "x", "workspace"), false, "data dir"},
		{"a fork the gateway made, stored", filepath.Join(data, "agents", "x", "workspace"), true, ""},
		{"a pull-back anchor, stored", filepath.Join(data, "anchors", "s1", "workspace"), true, ""},
		{"a managed worktree, stored", filepath.Join(data, "worktrees", "fp", "s1"), true, ""},
		{"a managed worktree, from a door", filepath.Join(data, "worktrees", "fp", "s1"), false, "data dir"},
		{"the agents area itself, stored", filepath.Join(data, "agents"), true, "data dir"},
		{"the data dir, stored", data, true, "data dir"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			check := r.Check
			if c.stored {
				check = r.CheckStored
			}
			err := check("workspace", c.dir)
			var fe *providers.FieldError
			switch {
			case c.rule == "" && err != nil:
				t.Fatalf("%s refused: %v", c.dir, err)
			case c.rule == "":
			case !errors.As(err, &fe) || fe.Field != "workspace":
				t.Fatalf("%s: got %v, want a field error naming workspace", c.dir, err)
			case !strings.Contains(err.Error(), c.rule) || !strings.Contains(err.Error(), c.dir):
				t.Fatalf("%s: got %q, want the path and %q", c.dir, err, c.rule)
			}
		})
	}
}

// A narrower token's roots must lie inside the gateway's; the data dir rule stays.
func TestRootsNarrow(t *testing.T) {
	top := t.TempDir()
	a, b := filepath.Join(top, "a"), filepath.Join(top, "b")
	data := filepath.Join(top, "data")
	for _, d := range []string{filepath.Join(a, "p"), b, data} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	r, err := NewRoots("workspaces.roots", []string{top}, data, "")
	if err != nil {
		t.Fatal(err)
	}
	n, err := r.Narrow("mcp.workspaceRoots", []string{a})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Check("workspace", filepath.Join(a, "p")); err != nil {
		t.Errorf("inside the narrow root: %v", err)
	}
	if err := n.Check("workspace", b); err == nil || !strings.Contains(err.Error(), "outside the workspace roots") {
		t.Errorf("outside the narrow root: %v", err)
	}
	if err := n.Check("workspace", data); err == nil || !strings.Contains(err.Error(), "data dir") {
		t.Errorf("the data dir through the narrow roots: %v", err)
	}
	inner, err := NewRoots("workspaces.roots", []string{a}, data, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := inner.Narrow("mcp.workspaceRoots", []string{b}); err == nil || !strings.Contains(err.Error(), "mcp.workspaceRoots") {
		t.Errorf("a narrow root outside the gateway's: %v", err)
	}
	if _, err := NewRoots("workspaces.roots", []string{"relative"}, data, ""); err == nil || !strings.Contains(err.Error(), "workspaces.roots[0]") {
		t.Errorf("a relative root: %v", err)
	}
	if _, err := NewRoots("workspaces.roots", []string{filepath.Join(top, "missing")}, data, ""); err == nil || !strings.Contains(err.Error(), "workspaces.roots[0]") {
		t.Errorf("a missing root: %v", err)
	}
}

// A session's agent must be a name and its model one of the catalog's, before any row.
func TestCreateChecksAgentAndModel(t *testing.T) {
	s := newStore(t)
	s.cfg.CheckModel = func(m string) error {
		if m != "known/model" {
			return errors.New("no such model")
		}
		return nil
	}
	for _, c := range []struct {
		p     CreateParams
		field string
	}{
		{CreateParams{Agent: "../../x"}, "agent"},
		{CreateParams{Agent: "-x"}, "agent"},
		{CreateParams{Model: "nope/../../x"}, "model"},
		{CreateParams{Agent: "main", Model: "known/model"}, ""},
	} {
		_, err := s.Create(t.Context(), c.p)
		var fe *providers.FieldError
		if c.field == "" {
			if err != nil {
				t.Errorf("%+v: %v", c.p, err)
			}
			continue
		}
		if !errors.As(err, &fe) || fe.Field != c.field {
			t.Errorf("%+v: got %v, want a field error naming %s", c.p, err, c.field)
		}
	}
	list, err := s.List(t.Context())
	if err != nil || len(list) != 1 {
		t.Fatalf("sessions after the refusals: %d (%v), want 1", len(list), err)
	}
}

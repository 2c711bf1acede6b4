package tools

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/openclaw/cloudworkers/internal/testrig/testenv"
)

func TestSetSchemas(t *testing.T) {
	s, _ := newTestSet(t, nil)
	want := []string{"read", "write", "edit", "apply_patch", "exec", "process", "grep", "find", "ls"}
	var got []string
	for _, sc := range s.Schemas() {
		got = append(got, sc.Name)
		var m map[string]any
		if err := jsonUnmarshal(sc.Parameters, &m); err != nil || m["type"] != "object" {
			t.Errorf("%s: parameters are not a JSON-Schema object: %v %s", sc.Name, err, sc.Parameters)
		}
		if sc.Description == "" {
			t.Errorf("%s: no description", sc.Name)
		}
	}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("tools = %v, want %v", got, want)
	}
}

func TestSetRunBadCalls(t *testing.T) {
	s, _ := newTestSet(t, nil)
	tests := []struct {
		name, tool, args string
		want             []string
	}{
		{"unknown tool", "bash", `{"command":"ls"}`, []string{`unknown tool "bash"`, "exec"}},
		{"malformed json", "read", `{"path":`, []string{"invalid arguments for tool read"}},
		{"array args", "read", `["a"]`, []string{"invalid arguments for tool read", "JSON object"}},
		{"wrong type", "read", `{"path": 42}`, []string{"invalid arguments for tool read", "path"}},
		{"missing required", "write", `{"path":"a.txt"}`, []string{"content is required"}},
		{"bad integer", "read", `{"path":"a.txt","offset":"ten"}`, []string{"invalid arguments for tool read"}},
		{"null args", "read", `null`, []string{"path is required"}},
		{"bad process action", "process", `{"action":"explode"}`, []string{`unknown action "explode"`}},
		{"empty exec", "exec", `{}`, []string{"command is required"}},
		{"bad regexp", "grep", `{"pattern":"("}`, []string{"invalid regular expression"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			mustErr(t, runTool(t, s, tc.tool, tc.args), tc.want...)
		})
	}
}

func TestLenientArgs(t *testing.T) {
	s, ws := newTestSet(t, nil)
	testenv.WriteFiles(t, ws, map[string]string{"a.txt": numberedLines(1, 10)})
	// Models sometimes send numbers as strings; accept them.
	out := mustOK(t, runTool(t, s, "read", `{"path":"a.txt","offset":"3","limit":"2"}`))
	if !strings.HasPrefix(out, "line 3\nline 4\n") {
		t.Fatalf("got %q", out)
	}
}

func TestPathEscapeRefused(t *testing.T) {
	s, ws := newTestSet(t, nil)
	outside := t.TempDir()
	testenv.WriteFiles(t, outside, map[string]string{"secret.txt": "secret"})
	if err := os.Symlink(outside, filepath.Join(ws, "link")); err != nil {
		t.Fatal(err)
	}
	testenv.WriteFiles(t, ws, map[string]string{"in.txt": "inside\n"})
	tests := []struct {
		name, tool string
		args       map[string]any
	}{
		{"read dotdot", "read", map[string]any{"path": "../" + filepath.Base(outside) + "/secret.txt"}},
		{"read absolute outside", "read", map[string]any{"path": filepath.Join(outside, "secret.txt")}},
		{"read through symlink", "read", map[string]any{"path": "link/secret.txt"}},
		{"write dotdot", "write", map[string]any{"path": "../escape.txt", "content": "x"}},
		{"write through symlink", "write", map[string]any{"path": "link/new.txt", "content": "x"}},
		{"edit absolute", "edit", map[string]any{"path": filepath.Join(outside, "secret.txt"), "edits": []any{map[string]any{"oldText": "secret", "newText": "x"}}}},
		{"ls parent", "ls", map[string]any{"path": ".."}},
		{"grep parent", "grep", map[string]any{"pattern": "secret", "path": "../"}},
		{"find outside", "find", map[string]any{"pattern": "*", "path": outside}},
		{"patch add outside", "apply_patch", map[string]any{"input": "*** Begin Patch\n*** Add File: ../x.txt\n+x\n*** End Patch"}},
		{"patch move outside", "apply_patch", map[string]any{"input": "*** Begin Patch\n*** Update File: in.txt\n*** Move to: ../../moved.txt\n@@\n-inside\n+moved\n*** End Patch"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			mustErr(t, runTool(t, s, tc.tool, tc.args), "outside the workspace")
		})
	}
	if got := readFile(t, outside, "secret.txt"); got != "secret" {
		t.Fatalf("outside file changed: %q", got)
	}
	if _, err := os.Stat(filepath.Join(outside, "new.txt")); err == nil {
		t.Fatal("write through symlink created a file outside the workspace")
	}
	if got := readFile(t, ws, "in.txt"); got != "inside\n" {
		t.Fatalf("in.txt changed by a refused patch: %q", got)
	}
	// Absolute paths inside the workspace are fine.
	mustOK(t, runTool(t, s, "read", map[string]any{"path": filepath.Join(ws, "in.txt")}))
}

func TestMatchGlob(t *testing.T) {
	tests := []struct {
		pattern, name string
		want          bool
	}{
		{"*.go", "main.go", true},
		{"*.go", "dir/main.go", false},
		{"**/*.go", "main.go", true},
		{"**/*.go", "a/b/main.go", true},
		{"src/**/*.ts", "src/a/b/x.ts", true},
		{"src/**/*.ts", "lib/x.ts", false},
		{"*.{ts,tsx}", "x.tsx", true},
		{"*.{ts,tsx}", "x.js", false},
		{"a/**", "a/b/c", true},
		{"[ab].txt", "b.txt", true},
	}
	for _, tc := range tests {
		if got := matchGlob(tc.pattern, tc.name); got != tc.want {
			t.Errorf("matchGlob(%q, %q) = %v, want %v", tc.pattern, tc.name, got, tc.want)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	for _, c := range []Config{{}, {Workspace: "rel"}, {Workspace: filepath.Join(t.TempDir(), "missing")}} {
		if err := c.Validate(); err == nil {
			t.Errorf("Validate(%+v) = nil", c)
		}
	}
}

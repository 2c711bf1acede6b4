package tools

import (
	"strings"
	"testing"

	"github.com/openclaw/cloudworkers/internal/testrig/testenv"
)

func searchTree(t *testing.T) (*Set, string) {
	t.Helper()
	s, ws := newTestSet(t, nil)
	testenv.WriteFiles(t, ws, map[string]string{
		".gitignore":              "build/\n*.log\n!keep.log\n",
		"main.go":                 "package main\n\n// TODO: fix\nfunc main() {\n\tFoo()\n}\n",
		"lib/foo.go":              "package lib\n\nfunc Foo() {}\nfunc foo2() {}\n",
		"lib/foo_test.go":         "package lib\n// todo lowercase\n",
		"lib/deep/x.ts":           "const a = 1; // TODO(a.b)\n",
		"docs/readme.md":          "a.b literal\naXb regex only\n",
		"ctx.txt":                 "l1\nl2\nMATCH\nl4\nl5\nl6\nl7\nMATCH\nl9\n",
		"build/out.go":            "TODO in build\n",
		"node_modules/m/index.js": "TODO in node_modules\n",
		".git/config":             "TODO in git\n",
		"app.log":                 "TODO in log\n",
		"keep.log":                "TODO kept\n",
		"bin.dat":                 "TODO\x00binary",
	})
	return s, ws
}

func TestGrep(t *testing.T) {
	s, _ := searchTree(t)
	tests := []struct {
		name string
		args map[string]any
		want string // exact output
		has  []string
		not  []string
	}{
		{name: "regex skips ignored and binary", args: map[string]any{"pattern": "TODO"},
			has: []string{"main.go:3: // TODO: fix", "lib/deep/x.ts:1: const a = 1; // TODO(a.b)", "keep.log:1: TODO kept"},
			not: []string{"build", "node_modules", ".git", "app.log", "bin.dat", "lowercase"}},
		{name: "ignoreCase", args: map[string]any{"pattern": "todo", "ignoreCase": true},
			has: []string{"lib/foo_test.go:2: // todo lowercase", "main.go:3:"}},
		{name: "literal", args: map[string]any{"pattern": "a.b", "literal": true, "path": "docs"},
			want: "readme.md:1: a.b literal"},
		{name: "regex", args: map[string]any{"pattern": "a.b", "path": "docs"},
			want: "readme.md:1: a.b literal\nreadme.md:2: aXb regex only"},
		{name: "glob", args: map[string]any{"pattern": "func", "glob": "*_test.go"}, want: "No matches found"},
		{name: "glob basename", args: map[string]any{"pattern": "Foo", "glob": "*.go"},
			want: "lib/foo.go:3: func Foo() {}\nmain.go:5: \tFoo()"},
		{name: "glob path", args: map[string]any{"pattern": "TODO", "glob": "lib/**/*.ts"},
			want: "lib/deep/x.ts:1: const a = 1; // TODO(a.b)"},
		{name: "context", args: map[string]any{"pattern": "MATCH", "path": "ctx.txt", "context": 1},
			want: "ctx.txt-2- l2\nctx.txt:3: MATCH\nctx.txt-4- l4\n--\nctx.txt-7- l7\nctx.txt:8: MATCH\nctx.txt-9- l9"},
		{name: "limit", args: map[string]any{"pattern": "MATCH", "path": "ctx.txt", "limit": 1},
			want: "ctx.txt:3: MATCH\n\n[1 matches limit reached; use limit=2 for more, or refine the pattern]"},
		{name: "no match", args: map[string]any{"pattern": "zzzz"}, want: "No matches found"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out := mustOK(t, runTool(t, s, "grep", tc.args))
			if tc.want != "" && out != tc.want {
				t.Fatalf("got %q, want %q", out, tc.want)
			}
			for _, h := range tc.has {
				if !strings.Contains(out, h) {
					t.Errorf("output lacks %q:\n%s", h, out)
				}
			}
			for _, n := range tc.not {
				if strings.Contains(out, n) {
					t.Errorf("output has %q:\n%s", n, out)
				}
			}
		})
	}
}

func TestGrepOutputBounded(t *testing.T) {
	s, ws := newTestSet(t, func(c *Config) { c.MaxOutputBytes = 2000 })
	testenv.WriteFiles(t, ws, map[string]string{"big.txt": strings.Repeat("needle "+strings.Repeat("x", 90)+"\n", 500)})
	out := mustOK(t, runTool(t, s, "grep", map[string]any{"pattern": "needle", "limit": 1000}))
	if len(out) > 2200 || !strings.Contains(out, "output limit of") {
		t.Fatalf("unbounded (%d bytes): %s", len(out), tail(out, 200))
	}
}

func TestFind(t *testing.T) {
	s, _ := searchTree(t)
	tests := []struct {
		name string
		args map[string]any
		want string
	}{
		{name: "basename glob", args: map[string]any{"pattern": "*.go"}, want: "lib/foo.go\nlib/foo_test.go\nmain.go"},
		{name: "path glob", args: map[string]any{"pattern": "lib/**/*.ts"}, want: "lib/deep/x.ts"},
		{name: "braces", args: map[string]any{"pattern": "*.{md,ts}"}, want: "docs/readme.md\nlib/deep/x.ts"},
		{name: "directories", args: map[string]any{"pattern": "d*"}, want: "docs/\nlib/deep/"},
		{name: "in path", args: map[string]any{"pattern": "*.go", "path": "lib"}, want: "foo.go\nfoo_test.go"},
		{name: "gitignore", args: map[string]any{"pattern": "*.log"}, want: "keep.log"},
		{name: "limit", args: map[string]any{"pattern": "*.go", "limit": 1},
			want: "lib/foo.go\n\n[1 results limit reached; use limit=2 for more, or refine the pattern]"},
		{name: "none", args: map[string]any{"pattern": "*.rs"}, want: "No files found matching pattern"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if out := mustOK(t, runTool(t, s, "find", tc.args)); out != tc.want {
				t.Fatalf("got %q, want %q", out, tc.want)
			}
		})
	}
	mustErr(t, runTool(t, s, "find", map[string]any{"pattern": "*.go", "path": "main.go"}), "not a directory")
}

func TestLs(t *testing.T) {
	s, ws := searchTree(t)
	testenv.WriteFiles(t, ws, map[string]string{"empty/.keep": ""})
	tests := []struct {
		name string
		args map[string]any
		want string
	}{
		{name: "root", args: map[string]any{}, want: ".git/\n.gitignore\napp.log\nbin.dat\nbuild/\nctx.txt\ndocs/\nempty/\nkeep.log\nlib/\nmain.go\nnode_modules/"},
		{name: "sub", args: map[string]any{"path": "lib"}, want: "deep/\nfoo.go\nfoo_test.go"},
		{name: "limit", args: map[string]any{"path": "lib", "limit": 2}, want: "deep/\nfoo.go\n\n[1 more entries; limit of 2 reached; use limit=3 for more]"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if out := mustOK(t, runTool(t, s, "ls", tc.args)); out != tc.want {
				t.Fatalf("got %q, want %q", out, tc.want)
			}
		})
	}
	mustErr(t, runTool(t, s, "ls", map[string]any{"path": "main.go"}), "not a directory")
	mustErr(t, runTool(t, s, "ls", map[string]any{"path": "missing"}), "missing")
}

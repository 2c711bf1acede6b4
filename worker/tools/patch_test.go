package tools

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/openclaw/cloudworkers/internal/testrig/testenv"
)

func TestApplyPatch(t *testing.T) {
	base := map[string]string{
		"src/main.go": "package main\n\nfunc main() {\n\tprintln(\"hi\")\n}\n\nfunc other() {\n\tprintln(\"hi\")\n}\n",
		"old.txt":     "obsolete\n",
		"notes.md":    "# Notes\none\ntwo\nthree\n",
	}
	tests := []struct {
		name  string
		patch string
		want  map[string]string // path → content; "" with gone=true means deleted
		gone  []string
		errs  []string
	}{
		{
			name: "add update delete move",
			patch: `*** Begin Patch
*** Add File: pkg/new.go
+package pkg
+
+const X = 1
*** Delete File: old.txt
*** Update File: src/main.go
@@ func other() {
-	println("hi")
+	println("other")
*** Update File: notes.md
*** Move to: docs/notes.md
@@
 one
-two
+TWO
 three
*** End of File
*** End Patch`,
			want: map[string]string{
				"pkg/new.go":    "package pkg\n\nconst X = 1\n",
				"src/main.go":   "package main\n\nfunc main() {\n\tprintln(\"hi\")\n}\n\nfunc other() {\n\tprintln(\"other\")\n}\n",
				"docs/notes.md": "# Notes\none\nTWO\nthree\n",
			},
			gone: []string{"old.txt", "notes.md"},
		},
		{
			name:  "first hunk without @@ and heredoc wrapper",
			patch: "<<'EOF'\n*** Begin Patch\n*** Update File: notes.md\n one\n+one and a half\n two\n*** End Patch\nEOF",
			want:  map[string]string{"notes.md": "# Notes\none\none and a half\ntwo\nthree\n"},
		},
		{
			name:  "pure addition appends",
			patch: "*** Begin Patch\n*** Update File: notes.md\n@@\n+four\n*** End Patch",
			want:  map[string]string{"notes.md": "# Notes\none\ntwo\nthree\nfour\n"},
		},
		{
			name:  "whitespace-tolerant match",
			patch: "*** Begin Patch\n*** Update File: notes.md\n@@\n one   \n-two\n+2\n*** End Patch",
			want:  map[string]string{"notes.md": "# Notes\none\n2\nthree\n"},
		},
		{
			name: "bad hunk leaves every file unchanged",
			patch: `*** Begin Patch
*** Add File: pkg/new.go
+package pkg
*** Delete File: old.txt
*** Update File: notes.md
@@
-one
+ONE
@@ three
-no such line
+x
*** End Patch`,
			errs: []string{"notes.md", "hunk 2", "did not match", "No file was changed"},
			gone: []string{"pkg/new.go"},
		},
		{
			name:  "missing context header",
			patch: "*** Begin Patch\n*** Update File: src/main.go\n@@ func missing() {\n-x\n+y\n*** End Patch",
			errs:  []string{"src/main.go", "hunk 1 (@@ func missing() {)", "not found"},
		},
		{
			name:  "delete missing file",
			patch: "*** Begin Patch\n*** Delete File: ghost.txt\n*** End Patch",
			errs:  []string{"Delete File ghost.txt", "not found"},
		},
		{
			name:  "update missing file",
			patch: "*** Begin Patch\n*** Update File: ghost.txt\n@@\n-a\n+b\n*** End Patch",
			errs:  []string{"Update File ghost.txt", "not found"},
		},
		{
			name:  "no begin",
			patch: "*** Update File: notes.md\n@@\n-one\n+1\n*** End Patch",
			errs:  []string{"*** Begin Patch"},
		},
		{
			name:  "no end",
			patch: "*** Begin Patch\n*** Update File: notes.md\n@@\n-one\n+1\n",
			errs:  []string{"*** End Patch"},
		},
		{
			name:  "bad line in add",
			patch: "*** Begin Patch\n*** Add File: x.txt\nnot plus\n*** End Patch",
			errs:  []string{"line 3", "must start with '+'"},
		},
		{
			name:  "bad line in hunk",
			patch: "*** Begin Patch\n*** Update File: notes.md\n@@\n*one\n*** End Patch",
			errs:  []string{"line 4", "expected a line starting with"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, ws := newTestSet(t, nil)
			testenv.WriteFiles(t, ws, base)
			r := runTool(t, s, "apply_patch", map[string]any{"input": tc.patch})
			if tc.errs != nil {
				mustErr(t, r, tc.errs...)
				for p, c := range base {
					if got := readFile(t, ws, p); got != c {
						t.Errorf("%s changed by a failed patch: %q", p, got)
					}
				}
			} else {
				out := mustOK(t, r)
				if !strings.HasPrefix(out, "Success. Updated the following files:") {
					t.Fatalf("output %q", out)
				}
				for p, c := range tc.want {
					if got := readFile(t, ws, p); got != c {
						t.Errorf("%s = %q, want %q", p, got, c)
					}
				}
			}
			for _, p := range tc.gone {
				if _, err := os.Stat(filepath.Join(ws, p)); err == nil {
					t.Errorf("%s still exists", p)
				}
			}
			leftovers, _ := filepath.Glob(filepath.Join(ws, "*", ".*.tmp-*"))
			top, _ := filepath.Glob(filepath.Join(ws, ".*.tmp-*"))
			if len(leftovers)+len(top) > 0 {
				t.Errorf("temp files left: %v %v", leftovers, top)
			}
		})
	}
}

func TestApplyPatchSummary(t *testing.T) {
	s, ws := newTestSet(t, nil)
	testenv.WriteFiles(t, ws, map[string]string{"a.txt": "a\n", "b.txt": "b\n"})
	out := mustOK(t, runTool(t, s, "apply_patch", map[string]any{"input": "*** Begin Patch\n*** Add File: c.txt\n+c\n*** Update File: a.txt\n@@\n-a\n+A\n*** Delete File: b.txt\n*** End Patch"}))
	want := "Success. Updated the following files:\nA c.txt\nM a.txt\nD b.txt"
	if out != want {
		t.Fatalf("got %q, want %q", out, want)
	}
}

package tools

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/openclaw/cloudworkers/internal/testrig/testenv"
	"github.com/openclaw/cloudworkers/protocol"
)

func TestRead(t *testing.T) {
	s, ws := newTestSet(t, func(c *Config) { c.MaxLines = 50; c.MaxOutputBytes = 4096 })
	png := []byte("\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x01\x00\x00\x00\x01\x08\x02\x00\x00\x00")
	testenv.WriteFiles(t, ws, map[string]string{
		"small.txt":   "alpha\nbeta\ngamma\n",
		"nonl.txt":    "one\ntwo",
		"crlf.txt":    "a\r\nb\r\n",
		"long.txt":    numberedLines(1, 120),
		"wide.txt":    strings.Repeat(strings.Repeat("x", 99)+"\n", 100),
		"huge1.txt":   strings.Repeat("y", 10000) + "\nnext\n",
		"empty.txt":   "",
		"bin.dat":     "abc\x00def",
		"img.png":     string(png),
		"dir/sub.txt": "sub\n",
	})
	tests := []struct {
		name   string
		args   map[string]any
		want   string // exact text, or prefix with wantSuffix
		suffix string
		errs   []string
	}{
		{name: "whole file", args: map[string]any{"path": "small.txt"}, want: "alpha\nbeta\ngamma"},
		{name: "no trailing newline", args: map[string]any{"path": "nonl.txt"}, want: "one\ntwo"},
		{name: "crlf", args: map[string]any{"path": "crlf.txt"}, want: "a\nb"},
		{name: "offset", args: map[string]any{"path": "small.txt", "offset": 2}, want: "beta\ngamma"},
		{name: "offset and limit", args: map[string]any{"path": "long.txt", "offset": 10, "limit": 3},
			want: "line 10\nline 11\nline 12\n\n[... 108 more lines; use offset=13 to continue]"},
		{name: "max lines marker", args: map[string]any{"path": "long.txt"},
			want: numberedLines(1, 50) + "\n[... 70 more lines; use offset=51 to continue]"},
		{name: "continue from marker", args: map[string]any{"path": "long.txt", "offset": 101},
			want: strings.TrimSuffix(numberedLines(101, 120), "\n")},
		{name: "byte limit marker", args: map[string]any{"path": "wide.txt"},
			suffix: "\n\n[... 60 more lines; output limit of 4 KiB reached; use offset=41 to continue]"},
		{name: "huge single line", args: map[string]any{"path": "huge1.txt", "limit": 1},
			suffix: "[... line 1 truncated: 5904 more bytes]\n\n[... 1 more lines; use offset=2 to continue]"},
		{name: "empty", args: map[string]any{"path": "empty.txt"}, want: "(file is empty)"},
		{name: "nested", args: map[string]any{"path": "dir/sub.txt"}, want: "sub"},
		{name: "offset past end", args: map[string]any{"path": "small.txt", "offset": 10}, errs: []string{"beyond the end", "3 lines"}},
		{name: "binary", args: map[string]any{"path": "bin.dat"}, errs: []string{"binary file"}},
		{name: "missing", args: map[string]any{"path": "nope.txt"}, errs: []string{"nope.txt", "no such file"}},
		{name: "directory", args: map[string]any{"path": "dir"}, errs: []string{"is a directory"}},
		{name: "bad offset", args: map[string]any{"path": "small.txt", "offset": 0}, errs: []string{"offset must be >= 1"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := runTool(t, s, "read", tc.args)
			if tc.errs != nil {
				mustErr(t, r, tc.errs...)
				return
			}
			got := mustOK(t, r)
			if tc.suffix != "" {
				if !strings.HasSuffix(got, tc.suffix) {
					t.Fatalf("got ...%q, want suffix %q", tail(got, 200), tc.suffix)
				}
				if len(got) > 4096+200 {
					t.Fatalf("output %d bytes exceeds the limit", len(got))
				}
				return
			}
			if got != tc.want {
				t.Fatalf("got %q, want %q", got, tc.want)
			}
		})
	}
	t.Run("image", func(t *testing.T) {
		r := runTool(t, s, "read", map[string]any{"path": "img.png"})
		mustOK(t, r)
		if len(r.Content) != 2 || r.Content[1].Type != protocol.ContentImage || r.Content[1].MimeType != "image/png" || r.Content[1].Data == "" {
			t.Fatalf("content = %+v", r.Content)
		}
	})
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

func TestWrite(t *testing.T) {
	s, ws := newTestSet(t, nil)
	testenv.WriteFiles(t, ws, map[string]string{"exec.sh": "old"})
	if err := os.Chmod(filepath.Join(ws, "exec.sh"), 0o755); err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		name string
		args map[string]any
		file string
		want string
		err  string
	}{
		{name: "create with parents", args: map[string]any{"path": "a/b/c.txt", "content": "hello\n"}, file: "a/b/c.txt", want: "hello\n"},
		{name: "overwrite", args: map[string]any{"path": "a/b/c.txt", "content": "bye\n"}, file: "a/b/c.txt", want: "bye\n"},
		{name: "append", args: map[string]any{"path": "a/b/c.txt", "content": "more\n", "append": true}, file: "a/b/c.txt", want: "bye\nmore\n"},
		{name: "append creates", args: map[string]any{"path": "new/log.txt", "content": "x", "append": true}, file: "new/log.txt", want: "x"},
		{name: "empty content", args: map[string]any{"path": "empty.txt", "content": ""}, file: "empty.txt", want: ""},
		{name: "keeps mode", args: map[string]any{"path": "exec.sh", "content": "#!/bin/sh\n"}, file: "exec.sh", want: "#!/bin/sh\n"},
		{name: "onto a directory", args: map[string]any{"path": "a/b", "content": "x"}, err: "is a directory"},
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			r := runTool(t, s, "write", st.args)
			if st.err != "" {
				mustErr(t, r, st.err)
				return
			}
			mustOK(t, r)
			if got := readFile(t, ws, st.file); got != st.want {
				t.Fatalf("%s = %q, want %q", st.file, got, st.want)
			}
		})
	}
	if fi, err := os.Stat(filepath.Join(ws, "exec.sh")); err != nil || fi.Mode().Perm() != 0o755 {
		t.Fatalf("exec.sh mode = %v, %v; want 0755", fi.Mode(), err)
	}
	entries, _ := os.ReadDir(filepath.Join(ws, "a", "b"))
	if len(entries) != 1 {
		t.Fatalf("temp files left behind: %v", entries)
	}
}

func TestEdit(t *testing.T) {
	const orig = "func a() {\n\treturn 1\n}\n\nfunc b() {\n\treturn 1\n}\n"
	edit := func(old, new string, all bool) map[string]any {
		return map[string]any{"oldText": old, "newText": new, "replaceAll": all}
	}
	tests := []struct {
		name  string
		edits []map[string]any
		want  string   // file afterwards; orig when the edit fails
		errs  []string // error result mentioning these
	}{
		{name: "single", edits: []map[string]any{edit("func a() {\n\treturn 1", "func a() {\n\treturn 2", false)},
			want: "func a() {\n\treturn 2\n}\n\nfunc b() {\n\treturn 1\n}\n"},
		{name: "multi", edits: []map[string]any{edit("func a()", "func x()", false), edit("func b()", "func y()", false)},
			want: "func x() {\n\treturn 1\n}\n\nfunc y() {\n\treturn 1\n}\n"},
		{name: "replaceAll", edits: []map[string]any{edit("return 1", "return 3", true)},
			want: "func a() {\n\treturn 3\n}\n\nfunc b() {\n\treturn 3\n}\n"},
		{name: "no match", edits: []map[string]any{edit("return 42", "x", false)}, want: orig, errs: []string{"not found", "0 matches"}},
		{name: "ambiguous", edits: []map[string]any{edit("return 1", "return 2", false)}, want: orig, errs: []string{"matches 2 times"}},
		{name: "second edit fails leaves file unchanged", edits: []map[string]any{edit("func a()", "func x()", false), edit("nothing here", "y", false)},
			want: orig, errs: []string{"edits[1]", "not found"}},
		{name: "empty oldText", edits: []map[string]any{edit("", "x", false)}, want: orig, errs: []string{"oldText must not be empty"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, ws := newTestSet(t, nil)
			testenv.WriteFiles(t, ws, map[string]string{"f.go": orig})
			r := runTool(t, s, "edit", map[string]any{"path": "f.go", "edits": tc.edits})
			if tc.errs != nil {
				mustErr(t, r, tc.errs...)
			} else {
				mustOK(t, r)
			}
			if got := readFile(t, ws, "f.go"); got != tc.want {
				t.Fatalf("file = %q, want %q", got, tc.want)
			}
		})
	}
	t.Run("crlf file", func(t *testing.T) {
		s, ws := newTestSet(t, nil)
		testenv.WriteFiles(t, ws, map[string]string{"w.txt": "one\r\ntwo\r\nthree\r\n"})
		mustOK(t, runTool(t, s, "edit", map[string]any{"path": "w.txt", "edits": []map[string]any{edit("one\ntwo", "1\n2", false)}}))
		if got := readFile(t, ws, "w.txt"); got != "1\r\n2\r\nthree\r\n" {
			t.Fatalf("got %q", got)
		}
	})
	t.Run("missing file", func(t *testing.T) {
		s, _ := newTestSet(t, nil)
		mustErr(t, runTool(t, s, "edit", map[string]any{"path": "nope.go", "edits": []map[string]any{edit("a", "b", false)}}), "nope.go")
	})
}

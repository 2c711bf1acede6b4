package manifest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/openclaw/cloudworkers/sync/internal/synctest"
)

func TestRules(t *testing.T) {
	tests := []struct {
		rules []string
		path  string
		dir   bool
		want  bool
	}{
		{[]string{"*.log"}, "a/b/x.log", false, true},
		{[]string{"*.log"}, "a/b/x.txt", false, false},
		{[]string{"/build"}, "build/x", false, true},
		{[]string{"/build"}, "src/build/x", false, false},
		{[]string{"build/"}, "build", false, false},
		{[]string{"build/"}, "build", true, true},
		{[]string{"build/"}, "src/build/o.o", false, true},
		{[]string{"docs/*.md"}, "docs/a.md", false, true},
		{[]string{"docs/*.md"}, "docs/x/a.md", false, false},
		{[]string{"**/cache"}, "a/b/cache/f", false, true},
		{[]string{"a/**/z"}, "a/z", false, true},
		{[]string{"a/**/z"}, "a/b/c/z", false, true},
		{[]string{"*.env", "!keep.env"}, "keep.env", false, false},
		{[]string{"*.env", "!keep.env"}, "x.env", false, true},
		{[]string{"# comment", "", "f[0-9].txt"}, "f3.txt", false, true},
		{[]string{"f[!0-9].txt"}, "f3.txt", false, false},
		{[]string{`\#hash`}, "#hash", false, true},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.rules, ",")+"|"+tt.path, func(t *testing.T) {
			if got := ParseRules(tt.rules).Match(tt.path, tt.dir); got != tt.want {
				t.Fatalf("Match(%q, dir=%v) = %v, want %v", tt.path, tt.dir, got, tt.want)
			}
		})
	}
}

func paths(m *Manifest) []string {
	var out []string
	for _, e := range m.Entries {
		out = append(out, string(e.Type[0])+":"+e.Path)
	}
	return out
}

func TestBuildPlain(t *testing.T) {
	ctx := synctest.Context(t)
	root := t.TempDir()
	synctest.Write(t, root, map[string]string{
		"a.txt":                                  "a",
		"src/main.go":                            "package main",
		"node_modules/x.js":                      "x",
		"build/out.o":                            "o",
		"build/keep.txt":                         "keep",
		".git/config":                            "never",
		"nested/.git/HEAD":                       "never",
		"logs/app.log":                           "log",
		StagingPrefix + "1/x":                    "staging",
		"src/" + StagingPrefix + "submodule-2/y": "a submodule's staging, left by a crash",
	})
	if err := os.Symlink("src/main.go", filepath.Join(root, "link")); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(filepath.Join(root, "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(root, "empty"), 0o750); err != nil {
		t.Fatal(err)
	}
	m, st, err := Build(ctx, root, Options{
		Exclude: []string{"node_modules/", "build/", "*.log"},
		Include: []string{"build/keep.txt"},
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"f:a.txt", "d:build", "f:build/keep.txt", "d:empty", "s:link", "d:logs", "d:nested", "d:src", "f:src/main.go"}
	if got := paths(m); !slices.Equal(got, want) {
		t.Fatalf("entries %v\nwant %v", got, want)
	}
	if !slices.Equal(st.Skipped, []string{"fifo"}) {
		t.Fatalf("skipped %v, want the fifo", st.Skipped)
	}
	idx := m.Index()
	if e := idx["link"]; e.Target != "src/main.go" {
		t.Fatalf("symlink target %q", e.Target)
	}
	if e := idx["empty"]; e.Mode != 0o750 {
		t.Fatalf("dir mode %o", e.Mode)
	}
	if e := idx["a.txt"]; e.SHA256 != "ca978112ca1bbdcafac231b39a23dc4da786eff8147c4e72b9807785afee48bb" || e.Size != 1 {
		t.Fatalf("a.txt entry %+v", e)
	}
	if err := m.Validate(Limits{}); err != nil {
		t.Fatalf("built manifest does not validate: %v", err)
	}
}

func TestBuildGit(t *testing.T) {
	synctest.HaveGit(t)
	ctx := synctest.Context(t)
	root := filepath.Join(t.TempDir(), "repo")
	outside := t.TempDir()
	synctest.Write(t, outside, map[string]string{"secret.env": "outside"})
	synctest.InitRepo(t, root, map[string]string{
		".gitignore":       "*.env\nbuild/\nlinked\n",
		".worktreeinclude": "*.env\nlinked/\n",
		"tracked.txt":      "t",
		"gone.txt":         "g",
		"dir/code.go":      "c",
	})
	synctest.Write(t, root, map[string]string{
		"untracked.txt":  "u",
		"local.env":      "ignored but included",
		"build/out.o":    "ignored",
		"dir/.env":       "ignored, included",
		"excluded/x.txt": "profile-excluded",
	})
	if err := os.Remove(filepath.Join(root, "gone.txt")); err != nil {
		t.Fatal(err)
	}
	// An ignored symlinked directory matched by .worktreeinclude: never followed.
	if err := os.Symlink(outside, filepath.Join(root, "linked")); err != nil {
		t.Fatal(err)
	}
	m, _, err := Build(ctx, root, Options{Mode: ModeGit, Exclude: []string{"excluded/"}})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"f:.gitignore", "f:.worktreeinclude", "d:dir", "f:dir/.env", "f:dir/code.go", "f:local.env", "f:tracked.txt", "f:untracked.txt"}
	got := paths(m)
	if !slices.Equal(got, want) {
		t.Fatalf("entries %v\nwant %v", got, want)
	}
}

// TestBuildGitSkipsSubmodules: a checked-out submodule is neither listed nor walked in git mode
// (its files are another repository's); it is named in Stats.Skipped, so that callers can say
// that it was not synced.
func TestBuildGitSkipsSubmodules(t *testing.T) {
	synctest.HaveGit(t)
	ctx := synctest.Context(t)
	lib := filepath.Join(t.TempDir(), "lib")
	synctest.InitRepo(t, lib, map[string]string{"lib.go": "package lib"})
	root := filepath.Join(t.TempDir(), "repo")
	synctest.InitRepo(t, root, map[string]string{"main.go": "package main"})
	synctest.Git(t, root, "submodule", "add", "--quiet", lib, "third_party/lib")
	synctest.Git(t, root, "commit", "--quiet", "-m", "add lib")
	if synctest.Read(t, root, "third_party/lib/lib.go") != "package lib" {
		t.Fatal("submodule not checked out")
	}
	m, st, err := Build(ctx, root, Options{Mode: ModeGit})
	if err != nil {
		t.Fatal(err)
	}
	// (the directory it sits in is listed: it exists in the checkout)
	if got, want := paths(m), []string{"f:.gitmodules", "f:main.go", "d:third_party"}; !slices.Equal(got, want) {
		t.Fatalf("entries %v\nwant %v", got, want)
	}
	if !slices.Equal(st.Skipped, []string{"third_party/lib"}) {
		t.Fatalf("skipped %v, want the submodule", st.Skipped)
	}
}

func TestCacheSkipsUnchangedFiles(t *testing.T) {
	ctx := synctest.Context(t)
	root := t.TempDir()
	synctest.Write(t, root, map[string]string{"a": "one", "b": "two", "c": "three"})
	old := time.Now().Add(-time.Hour)
	for _, p := range []string{"a", "b", "c"} {
		if err := os.Chtimes(filepath.Join(root, p), old, old); err != nil {
			t.Fatal(err)
		}
	}
	cache := NewCache()
	m1, st, err := Build(ctx, root, Options{Cache: cache})
	if err != nil || st.Hashed != 3 {
		t.Fatalf("first build hashed %d, err %v", st.Hashed, err)
	}
	cacheFile := filepath.Join(t.TempDir(), "cache.json")
	if err := cache.Save(cacheFile); err != nil {
		t.Fatal(err)
	}
	cache = LoadCache(cacheFile)
	_, st, err = Build(ctx, root, Options{Cache: cache})
	if err != nil || st.Hashed != 0 || st.Cached != 3 {
		t.Fatalf("second build: hashed %d cached %d, err %v", st.Hashed, st.Cached, err)
	}
	// Same size, same mtime, new content: the ctime moves, so the file is hashed again.
	if err := os.WriteFile(filepath.Join(root, "b"), []byte("TWO"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(filepath.Join(root, "b"), old, old); err != nil {
		t.Fatal(err)
	}
	m3, st, err := Build(ctx, root, Options{Cache: cache})
	if err != nil || st.Hashed != 1 {
		t.Fatalf("third build hashed %d, err %v", st.Hashed, err)
	}
	c := Diff(m1, m3)
	if len(c.Changed) != 1 || c.Changed[0].Path != "b" || len(c.Added)+len(c.Deleted) != 0 {
		t.Fatalf("diff %+v", c)
	}
}

func TestDiff(t *testing.T) {
	h := func(c byte) string { return strings.Repeat(string(c), 64) }
	base := &Manifest{Version: 1, Entries: []Entry{
		{Path: "a", Type: TypeFile, Mode: 0o644, SHA256: h('a')},
		{Path: "b", Type: TypeFile, Mode: 0o644, SHA256: h('b')},
		{Path: "c", Type: TypeFile, Mode: 0o644, SHA256: h('c')},
		{Path: "d", Type: TypeSymlink, Mode: 0o777, Target: "a"},
	}}
	other := &Manifest{Version: 1, Entries: []Entry{
		{Path: "a", Type: TypeFile, Mode: 0o644, SHA256: h('a'), MTime: 99},
		{Path: "b", Type: TypeFile, Mode: 0o755, SHA256: h('b')},
		{Path: "d", Type: TypeSymlink, Mode: 0o777, Target: "b"},
		{Path: "e", Type: TypeDir, Mode: 0o755},
	}}
	c := Diff(base, other)
	if got := Paths(c.Added); !slices.Equal(got, []string{"e"}) {
		t.Fatalf("added %v", got)
	}
	if got := Paths(c.Changed); !slices.Equal(got, []string{"b", "d"}) {
		t.Fatalf("changed %v", got)
	}
	if got := Paths(c.Deleted); !slices.Equal(got, []string{"c"}) {
		t.Fatalf("deleted %v", got)
	}
}

func TestDecodeRefusesHostileManifests(t *testing.T) {
	h := strings.Repeat("a", 64)
	file := func(p string) string {
		return `{"path":` + quote(p) + `,"type":"file","mode":420,"size":1,"sha256":"` + h + `"}`
	}
	doc := func(entries ...string) string {
		return `{"version":1,"entries":[` + strings.Join(entries, ",") + `]}`
	}
	tests := map[string]string{
		"dotdot":          doc(file("../x")),
		"inner dotdot":    doc(file("a/../../x")),
		"absolute":        doc(file("/etc/passwd")),
		"nul":             doc(file("a\x00b")),
		"unclean":         doc(file("a//b")),
		"dot":             doc(file(".")),
		"git metadata":    doc(file(".git/hooks/post-commit")),
		"git metadata ci": doc(file("sub/.GIT/config")),
		"device type":     doc(`{"path":"dev","type":"device","mode":420}`),
		"fifo type":       doc(`{"path":"p","type":"fifo","mode":420}`),
		"setuid mode":     doc(`{"path":"x","type":"file","mode":2541,"size":1,"sha256":"` + h + `"}`),
		"bad hash":        doc(`{"path":"x","type":"file","mode":420,"size":1,"sha256":"zz"}`),
		"unsorted":        doc(file("b"), file("a")),
		"duplicate":       doc(file("a"), file("a")),
		"below file":      doc(file("a"), file("a/b")),
		"below symlink":   doc(`{"path":"l","type":"symlink","mode":511,"target":"/etc"}`, file("l/passwd")),
		// The file's nearest listed ancestor is a directory, which lies below a file.
		"below a dir below a file": doc(file("a"), `{"path":"a/d","type":"dir","mode":493}`, file("a/d/f")),
		// The directory between them is not listed.
		"deep below file":       doc(file("a"), file("a/x/y")),
		"upper case hex":        doc(`{"path":"x","type":"file","mode":420,"size":1,"sha256":"` + strings.Repeat("A", 64) + `"}`),
		"odd length hex commit": `{"version":1,"baseCommit":"` + strings.Repeat("a", 41) + `","entries":[]}`,
		"unknown field":         `{"version":1,"entries":[],"extra":1}`,
		"trailing data":         doc() + `{}`,
		"wrong version":         `{"version":2,"entries":[]}`,
		"too many":              doc(file("a"), file("b"), file("c"), file("d")),
		"negative size":         doc(`{"path":"x","type":"file","mode":420,"size":-1,"sha256":"` + h + `"}`),
		"empty target":          doc(`{"path":"l","type":"symlink","mode":511}`),
	}
	for name, in := range tests {
		t.Run(name, func(t *testing.T) {
			m, err := Decode(strings.NewReader(in), Limits{MaxEntries: 3})
			if err == nil {
				t.Fatalf("accepted: %+v", m)
			}
		})
	}
	// A name with a control character is refused, and printed quoted: the error shows the bytes
	// the box sent rather than letting them act on a terminal or split a log line.
	for _, p := range []string{"a\tb", "new\nline", "esc\x1b[2Jx", "del\x7f", "c1\u0085", "c1\u009b31m", "d/\u0000"} {
		t.Run(fmt.Sprintf("control character %q", p), func(t *testing.T) {
			_, err := Decode(strings.NewReader(doc(`{"path":"d","type":"dir","mode":493}`, file(p))), Limits{})
			if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("%q", p)) || !strings.Contains(err.Error(), "control character") {
				t.Fatalf("err %v, want a refusal naming %q", err, p)
			}
			_, err = Decode(strings.NewReader(doc(`{"path":"l","type":"symlink","mode":511,"target":`+quote(p)+`}`)), Limits{})
			if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("%q", p)) {
				t.Fatalf("symlink target: err %v, want a refusal naming %q", err, p)
			}
		})
	}
	for _, p := range []string{"ünïcødé", "nbsp\u00a0", "tab-free"} {
		if err := ValidPath(p); err != nil {
			t.Errorf("ValidPath(%q): %v", p, err)
		}
	}
	t.Run("oversized", func(t *testing.T) {
		_, err := Decode(strings.NewReader(doc(file("a"))), Limits{MaxBytes: 20})
		if !errors.Is(err, ErrTooLarge) {
			t.Fatalf("err %v, want ErrTooLarge", err)
		}
	})
	t.Run("valid", func(t *testing.T) {
		if _, err := Decode(strings.NewReader(doc(file("a"), file("b/c"))), Limits{}); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("unhashed", func(t *testing.T) {
		// A streamed plan's entries: files without hashes, checked otherwise like any.
		m := &Manifest{Version: Version, Entries: []Entry{
			{Path: "a", Type: TypeDir, Mode: 0o755},
			{Path: "a/f", Type: TypeFile, Mode: 0o644, Size: 3},
		}}
		if err := m.ValidateUnhashed(Limits{}); err != nil {
			t.Fatal(err)
		}
		if err := m.Validate(Limits{}); err == nil {
			t.Fatal("Validate accepted a file without a hash")
		}
		m.Entries[1].SHA256 = h
		if err := m.ValidateUnhashed(Limits{}); err == nil {
			t.Fatal("ValidateUnhashed accepted a file with a hash")
		}
		m.Entries[1].SHA256 = ""
		m.Entries = append(m.Entries, Entry{Path: "a/f/g", Type: TypeFile, Mode: 0o644})
		if err := m.ValidateUnhashed(Limits{}); err == nil {
			t.Fatal("ValidateUnhashed accepted an entry below a file")
		}
	})
}

func quote(s string) string {
	var b bytes.Buffer
	b.WriteByte('"')
	for _, r := range s {
		if r < 0x20 {
			b.WriteString(`\u00`)
			b.WriteString("0123456789abcdef"[r>>4 : r>>4+1])
			b.WriteString("0123456789abcdef"[r&15 : r&15+1])
			continue
		}
		b.WriteRune(r)
	}
	b.WriteByte('"')
	return b.String()
}

func TestSymlinkInside(t *testing.T) {
	tests := []struct {
		link, target string
		want         bool
	}{
		{"l", "a/b", true},
		{"d/l", "../a", true},
		{"l", "../a", false},
		{"l", "/etc", false},
		{"d/l", "x/../../..", false},
		{"l", "s/..", false}, // s may be a symlink to "."
		{"l", ".", true},
		{"d/e/l", "../../x", true},
	}
	for _, tt := range tests {
		if got := SymlinkInside(tt.link, tt.target); got != tt.want {
			t.Errorf("SymlinkInside(%q, %q) = %v, want %v", tt.link, tt.target, got, tt.want)
		}
	}
}

func FuzzDecode(f *testing.F) {
	h := strings.Repeat("0", 64)
	f.Add([]byte(`{"version":1,"entries":[{"path":"a","type":"file","mode":420,"size":1,"sha256":"` + h + `"}]}`))
	f.Add([]byte(`{"version":1,"entries":[{"path":"d","type":"dir","mode":493},{"path":"d/l","type":"symlink","mode":511,"target":"../x"}]}`))
	f.Add([]byte(`{"version":1,"entries":[{"path":"../a","type":"file"}]}`))
	f.Add([]byte(`{}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := DecodeBytes(b, Limits{MaxBytes: 1 << 16, MaxEntries: 64})
		if err != nil {
			return
		}
		// Whatever is accepted is safe to join below a root and re-validates after a round trip.
		for _, e := range m.Entries {
			if ValidPath(e.Path) != nil || strings.HasPrefix(filepath.Clean(e.Path), "..") || filepath.IsAbs(e.Path) {
				t.Fatalf("accepted unsafe path %q", e.Path)
			}
		}
		var buf bytes.Buffer
		if err := m.Encode(&buf); err != nil {
			t.Fatal(err)
		}
		if _, err := DecodeBytes(buf.Bytes(), Limits{MaxBytes: 1 << 20, MaxEntries: 64}); err != nil {
			t.Fatalf("re-decode: %v", err)
		}
	})
}

// A cache saved after a build of files with names JSON must escape is read back whole: the next
// build hashes nothing.
func TestCacheFileKeepsAwkwardNames(t *testing.T) {
	ctx := synctest.Context(t)
	root := t.TempDir()
	names := []string{"plain.txt", `quo"te`, `back\slash`, "ünïcødé", "<html>&", "nbsp\u00a0é"}
	files := map[string]string{}
	for i, n := range names {
		files["dir/"+n] = strings.Repeat("x", i)
	}
	// Names with control characters are left out of every manifest (no box may send one back
	// either): listed as skipped, with the characters replaced.
	synctest.Write(t, root, map[string]string{"ctl/tab\tname": "t", "ctl/new\nline": "n", "ctl/del\x7f": "d", "ctl/c1\u0085": "c"})
	synctest.Write(t, root, files)
	old := time.Now().Add(-time.Hour)
	for n := range files {
		if err := os.Chtimes(filepath.Join(root, n), old, old); err != nil {
			t.Fatal(err)
		}
	}
	cache := NewCache()
	m1, st1, err := Build(ctx, root, Options{Cache: cache})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"ctl/c1?", "ctl/del?", "ctl/new?line", "ctl/tab?name"}; !slices.Equal(st1.Skipped, want) {
		t.Fatalf("skipped %q, want %q", st1.Skipped, want)
	}
	file := filepath.Join(t.TempDir(), "cache.json")
	if err := cache.Save(file); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(file)
	if err != nil || !json.Valid(raw) {
		t.Fatalf("cache file is not JSON (%v): %s", err, raw)
	}
	loaded := LoadCache(file)
	if loaded.Len() != len(names) {
		t.Fatalf("loaded %d cached hashes, want %d", loaded.Len(), len(names))
	}
	m2, st, err := Build(ctx, root, Options{Cache: loaded})
	if err != nil || st.Hashed != 0 || st.Cached != len(names) {
		t.Fatalf("build from the loaded cache: hashed %d cached %d, err %v", st.Hashed, st.Cached, err)
	}
	if c := Diff(m1, m2); !c.Empty() {
		t.Fatalf("builds differ: %+v", c)
	}
}

// The walk reads several directories at once; what it lists is exactly what a plain sequential
// walk finds, with the rules applied, in any tree shape.
func TestWalkListsWhatASequentialWalkFinds(t *testing.T) {
	ctx := synctest.Context(t)
	root := t.TempDir()
	files := map[string]string{}
	for i := range 40 {
		for j := range 6 {
			files[fmt.Sprintf("d%02d/s%d/f%d.go", i, j, i*j)] = "x"
			files[fmt.Sprintf("d%02d/s%d/deep/er/f.log", i, j)] = "log"
		}
		files[fmt.Sprintf("d%02d/top.txt", i)] = "t"
		if err := os.MkdirAll(filepath.Join(root, fmt.Sprintf("d%02d/empty%d", i, i)), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	files["skip/inside.txt"] = "s"
	synctest.Write(t, root, files)
	opts := Options{Exclude: []string{"*.log", "skip/"}}
	for range 5 {
		m, _, err := Build(ctx, root, opts)
		if err != nil {
			t.Fatal(err)
		}
		var want []string
		rules := ParseRules(opts.Exclude)
		err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil || p == root {
				return err
			}
			rel, _ := filepath.Rel(root, p)
			if rules.Match(filepath.ToSlash(rel), d.IsDir()) {
				if d.IsDir() {
					return filepath.SkipDir
				}
				return nil
			}
			kind := "f:"
			if d.IsDir() {
				kind = "d:"
			}
			want = append(want, kind+filepath.ToSlash(rel))
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		slices.Sort(want)
		got := paths(m)
		slices.Sort(got)
		if !slices.Equal(got, want) {
			t.Fatalf("listed %d entries, a sequential walk finds %d", len(got), len(want))
		}
	}
}

// TestRulePrefix: a tree listed as the directory third_party/lib of the tree its rules were
// written for (a submodule of a workspace) is matched on its paths there: anchored patterns with
// wildcards reach into it, ones for other directories do not.
func TestRulePrefix(t *testing.T) {
	ctx := synctest.Context(t)
	root := t.TempDir()
	synctest.Write(t, root, map[string]string{"secret.txt": "s", "x/key.pem": "k", "build/out": "o", "keep.go": "k", "other.txt": "o"})
	m, _, err := Build(ctx, root, Options{
		Exclude:    []string{"third_party/*/secret.txt", "**/lib/x/*.pem", "/third_party/lib/build/", "third_party/other/other.txt", "/other.txt"},
		RulePrefix: "third_party/lib",
	})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := paths(m), []string{"f:keep.go", "f:other.txt", "d:x"}; !slices.Equal(got, want) {
		t.Fatalf("entries %v\nwant %v", got, want)
	}
}

// TestRulePrefixGitInclude: in git mode the profile's Include selects ignored files on their
// paths in the workspace too (RulePrefix), while .worktreeinclude keeps to the listed root.
func TestRulePrefixGitInclude(t *testing.T) {
	synctest.HaveGit(t)
	ctx := synctest.Context(t)
	root := filepath.Join(t.TempDir(), "repo")
	synctest.InitRepo(t, root, map[string]string{".gitignore": "gen/\n*.env\n", ".worktreeinclude": "*.env\n", "a.go": "a"})
	synctest.Write(t, root, map[string]string{"gen/x.go": "generated", "local.env": "e", "gen2/y.go": "y"})
	m, _, err := Build(ctx, root, Options{Mode: ModeGit, Include: []string{"third_party/lib/gen/"}, RulePrefix: "third_party/lib"})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"f:.gitignore", "f:.worktreeinclude", "f:a.go", "d:gen", "f:gen/x.go", "d:gen2", "f:gen2/y.go", "f:local.env"}
	if got := paths(m); !slices.Equal(got, want) {
		t.Fatalf("entries %v\nwant %v", got, want)
	}
}

// TestOpenFile: what hashing and sending read through. A symlink is refused (a box or a user
// could point one anywhere), a FIFO put in a file's place does not block the open, and the stat
// of the open file is that of a regular file with its size, mtime and inode.
func TestOpenFile(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "f")
	if err := os.WriteFile(file, []byte("hello"), 0o640); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(file, filepath.Join(dir, "l")); err != nil {
		t.Fatal(err)
	}
	if f, err := OpenFile(filepath.Join(dir, "l")); err == nil {
		f.Close()
		t.Fatal("opened a symlink")
	}
	if err := syscall.Mkfifo(filepath.Join(dir, "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		f, err := OpenFile(filepath.Join(dir, "fifo"))
		if err == nil {
			fi, serr := f.Stat()
			if serr == nil && fi.Mode().IsRegular() {
				serr = fmt.Errorf("a FIFO stats as a regular file")
			}
			// Nothing writes to it: a read must fail, not wait for a writer; nor when a writer
			// holds it open but writes nothing.
			if _, rerr := f.Read(make([]byte, 8)); serr == nil && rerr == nil {
				serr = fmt.Errorf("read a FIFO nothing writes to without an error")
			}
			if w, werr := os.OpenFile(filepath.Join(dir, "fifo"), os.O_RDWR, 0); werr == nil {
				if _, rerr := f.Read(make([]byte, 8)); serr == nil && (rerr == nil || !strings.Contains(rerr.Error(), "not a regular file")) {
					serr = fmt.Errorf("read a FIFO with an idle writer: %v, want not a regular file", rerr)
				}
				w.Close()
			} else if serr == nil {
				serr = werr
			}
			err = serr
			f.Close()
		}
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("opening a FIFO blocked")
	}
	if _, _, err := HashFile(context.Background(), filepath.Join(dir, "fifo")); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Fatalf("hash of a FIFO: %v, want not a regular file (it would hash as an empty file)", err)
	}

	f, err := OpenFile(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	want, err := os.Lstat(file)
	if err != nil {
		t.Fatal(err)
	}
	ino, _ := StatKey(fi)
	wino, _ := StatKey(want)
	if !fi.Mode().IsRegular() || fi.Mode().Perm() != 0o640 || fi.Size() != 5 || !fi.ModTime().Equal(want.ModTime()) || ino != wino {
		t.Fatalf("stat %v %d %v ino %d, want %v %d %v ino %d", fi.Mode(), fi.Size(), fi.ModTime(), ino, want.Mode(), want.Size(), want.ModTime(), wino)
	}
	b, err := io.ReadAll(f)
	if err != nil || string(b) != "hello" {
		t.Fatalf("read %q, %v", b, err)
	}
}

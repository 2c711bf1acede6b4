package stream

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/klauspost/compress/zstd"

	"github.com/openclaw/cloudworkers/sync/internal/synctest"
	"github.com/openclaw/cloudworkers/sync/manifest"
)

func build(t *testing.T, root string) *manifest.Manifest {
	t.Helper()
	m, _, err := manifest.Build(synctest.Context(t), root, manifest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func sameTree(t *testing.T, a, b *manifest.Manifest) {
	t.Helper()
	if c := manifest.Diff(a, b); !c.Empty() {
		t.Fatalf("trees differ: added %v changed %v deleted %v",
			manifest.Paths(c.Added), manifest.Paths(c.Changed), manifest.Paths(c.Deleted))
	}
}

func TestRoundTripAndDelta(t *testing.T) {
	ctx := synctest.Context(t)
	src, dst := t.TempDir(), t.TempDir()
	synctest.Write(t, src, map[string]string{
		"README.md":   "hello",
		"src/a.go":    "package a",
		"src/b/b.go":  strings.Repeat("b", 1<<20),
		"old/x.txt":   "x",
		"becomes-dir": "file now",
		"bin/tool":    "#!/bin/sh",
		// Past the 100 bytes of a tar header's name field, and not ASCII: GNU long-name entries.
		"deep/" + strings.Repeat("d", 90) + "/" + strings.Repeat("n", 120) + ".txt": "long",
		"unicodé/naïve ✓.txt": "utf-8",
	})
	must(t, os.Chmod(filepath.Join(src, "bin/tool"), 0o755))
	must(t, os.Symlink("src/a.go", filepath.Join(src, "link")))
	must(t, os.Symlink(strings.Repeat("../", 40)+"x", filepath.Join(src, "long-link")))
	must(t, os.Symlink("/usr/lib", filepath.Join(src, "abs-link")))
	must(t, os.Mkdir(filepath.Join(src, "empty"), 0o700))

	base := build(t, src)
	var buf bytes.Buffer
	st, err := Write(ctx, &buf, src, PlanFor(nil, base))
	if err != nil {
		t.Fatal(err)
	}
	if st.Files != 8 || st.Symlinks != 3 {
		t.Fatalf("stats %+v", st)
	}
	// The box side accepts the workspace's absolute symlink; an inbound apply would not.
	if _, err := Apply(ctx, bytes.NewReader(buf.Bytes()), t.TempDir(), ApplyOptions{}); err == nil {
		t.Fatal("strict apply accepted a symlink leaving the root")
	}
	if _, err := Apply(ctx, bytes.NewReader(buf.Bytes()), dst, ApplyOptions{AllowEscapingSymlinks: true}); err != nil {
		t.Fatal(err)
	}
	sameTree(t, base, build(t, dst))
	// Into a directory that does not exist yet (staged beside it, one rename): directories of
	// the usual mode and of others (0700, 0750 with a file in it) end with their own.
	must(t, os.Mkdir(filepath.Join(src, "group"), 0o750))
	synctest.Write(t, src, map[string]string{"group/g.txt": "g"})
	must(t, os.Chmod(filepath.Join(src, "group"), 0o750))
	cold := filepath.Join(t.TempDir(), "cold")
	coldBase := build(t, src)
	var coldBuf bytes.Buffer
	if _, err := Write(ctx, &coldBuf, src, PlanFor(nil, coldBase)); err != nil {
		t.Fatal(err)
	}
	if _, err := Apply(ctx, &coldBuf, cold, ApplyOptions{AllowEscapingSymlinks: true}); err != nil {
		t.Fatal(err)
	}
	sameTree(t, coldBase, build(t, cold))
	// Below a setgid directory, new directories inherit the bit: they still end with the plan's
	// mode exactly, like the others.
	sgid := t.TempDir()
	must(t, os.Chmod(sgid, 0o755|os.ModeSetgid))
	if fi, err := os.Lstat(sgid); err == nil && fi.Mode()&os.ModeSetgid != 0 {
		coldBuf.Reset()
		if _, err := Write(ctx, &coldBuf, src, PlanFor(nil, coldBase)); err != nil {
			t.Fatal(err)
		}
		if _, err := Apply(ctx, &coldBuf, filepath.Join(sgid, "cold"), ApplyOptions{AllowEscapingSymlinks: true}); err != nil {
			t.Fatal(err)
		}
		for _, d := range []string{"cold", "cold/src", "cold/group", "cold/empty"} {
			if fi, err := os.Lstat(filepath.Join(sgid, d)); err != nil || fi.Mode()&os.ModeSetgid != 0 {
				t.Fatalf("%s: %v %v, want the plan's mode without setgid", d, fi.Mode(), err)
			}
		}
	}
	must(t, os.RemoveAll(filepath.Join(src, "group")))

	// Change, delete, rename, and turn a file into a directory.
	must(t, os.WriteFile(filepath.Join(src, "README.md"), []byte("changed"), 0o644))
	must(t, os.RemoveAll(filepath.Join(src, "old")))
	must(t, os.Rename(filepath.Join(src, "src/a.go"), filepath.Join(src, "src/renamed.go")))
	must(t, os.Remove(filepath.Join(src, "becomes-dir")))
	synctest.Write(t, src, map[string]string{"becomes-dir/inner": "i"})
	next := build(t, src)
	plan := PlanFor(build(t, dst), next)
	if got := plan.Deletes; !slices.Equal(got, []string{"becomes-dir", "old", "old/x.txt", "src/a.go"}) {
		t.Fatalf("deletes %v", got)
	}
	if plan.Bytes() > 100 {
		t.Fatalf("delta carries %d bytes: the unchanged 1 MiB file was sent again", plan.Bytes())
	}
	buf.Reset()
	if _, err := Write(ctx, &buf, src, plan); err != nil {
		t.Fatal(err)
	}
	if _, err := Apply(ctx, &buf, dst, ApplyOptions{AllowEscapingSymlinks: true}); err != nil {
		t.Fatal(err)
	}
	sameTree(t, next, build(t, dst))
}

func TestWriteNoticesChangedFile(t *testing.T) {
	ctx := synctest.Context(t)
	src := t.TempDir()
	synctest.Write(t, src, map[string]string{"a": "one"})
	m := build(t, src)
	must(t, os.WriteFile(filepath.Join(src, "a"), []byte("two"), 0o644))
	if _, err := Write(ctx, &bytes.Buffer{}, src, PlanFor(nil, m)); !errors.Is(err, ErrChanged) {
		t.Fatalf("err %v, want ErrChanged", err)
	}
	// Appended to: the planned bytes still match their hash, but the file is longer now and
	// would arrive cut short.
	must(t, os.WriteFile(filepath.Join(src, "a"), []byte("one"), 0o644))
	m = build(t, src)
	f, err := os.OpenFile(filepath.Join(src, "a"), os.O_APPEND|os.O_WRONLY, 0)
	must(t, err)
	_, err = f.WriteString(" and more")
	must(t, err)
	must(t, f.Close())
	if _, err := Write(ctx, &bytes.Buffer{}, src, PlanFor(nil, m)); !errors.Is(err, ErrChanged) {
		t.Fatalf("appended file: err %v, want ErrChanged", err)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// raw is one tar entry of a hand-made archive.
type raw struct {
	h    tar.Header
	body string
}

func sum(s string) string { h := sha256.Sum256([]byte(s)); return hex.EncodeToString(h[:]) }

// sumRecord is a streamed archive's record of a file with content s in its sums entry.
func sumRecord(s string) []byte {
	h := sha256.Sum256([]byte(s))
	return appendSum(nil, h[:], xxhash.Sum64String(s))
}

func fileEntry(p, body string) (manifest.Entry, raw) {
	return manifest.Entry{Path: p, Type: manifest.TypeFile, Mode: 0o644, Size: int64(len(body)), SHA256: sum(body)},
		raw{tar.Header{Name: p, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(body))}, body}
}

// archive builds a tar+zstd archive with plan at its head followed by entries, as a hostile box could.
func archive(t testing.TB, plan Plan, entries ...raw) []byte {
	t.Helper()
	if plan.Version == 0 {
		plan.Version = PlanVersion
	}
	var tb bytes.Buffer
	tw := tar.NewWriter(&tb)
	pb, _ := json.Marshal(plan)
	_ = tw.WriteHeader(&tar.Header{Name: headerName, Typeflag: tar.TypeReg, Mode: 0o600, Size: int64(len(pb))})
	_, _ = tw.Write(pb)
	for _, e := range entries {
		h := e.h
		h.Format = tar.FormatPAX
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatal(err)
		}
		_, _ = tw.Write([]byte(e.body))
	}
	_ = tw.Close()
	return compress(t, tb.Bytes())
}

func compress(t testing.TB, b []byte) []byte {
	t.Helper()
	var out bytes.Buffer
	zw, err := zstd.NewWriter(&out)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = zw.Write(b)
	_ = zw.Close()
	return out.Bytes()
}

func TestApplyRefusesHostileArchives(t *testing.T) {
	okE, okR := fileEntry("ok.txt", "fine")
	evilE, evilR := fileEntry("../evil", "x")
	absE, absR := fileEntry("/tmp/evil", "x")
	bigE, bigR := fileEntry("big", strings.Repeat("z", 2048))
	viaE, viaR := fileEntry("out/pwned", "x")
	gitE, gitR := fileEntry(".git/hooks/post-checkout", "#!/bin/sh")
	badHash, badHashR := fileEntry("a", "aaaa")
	badHashR.body = "bbbb"
	manyPlan := Plan{}
	var manyRaw []raw
	for i := range 50 {
		e, r := fileEntry(strings.Repeat("f", 1)+string(rune('a'+i%26))+strings.Repeat("x", i/26), "")
		manyPlan.Entries = append(manyPlan.Entries, e)
		manyRaw = append(manyRaw, r)
	}
	slices.SortFunc(manyPlan.Entries, func(a, b manifest.Entry) int { return strings.Compare(a.Path, b.Path) })
	slices.SortFunc(manyRaw, func(a, b raw) int { return strings.Compare(a.h.Name, b.h.Name) })
	link := func(p, target string) (manifest.Entry, raw) {
		return manifest.Entry{Path: p, Type: manifest.TypeSymlink, Mode: 0o777, Target: target},
			raw{tar.Header{Name: p, Typeflag: tar.TypeSymlink, Linkname: target, Mode: 0o777}, ""}
	}
	etcE, etcR := link("etc", "/etc")
	upE, upR := link("up", "../../outside")
	dotE, dotR := link("d", ".")
	dotdotE, dotdotR := link("e", "d/..")
	valid := archive(t, Plan{Entries: []manifest.Entry{bigE, okE}}, bigR, okR)
	// streamed: a SumsLast archive of entries (their hashes moved to the sums entry), then extra.
	streamed := func(sums []byte, entries []manifest.Entry, raws []raw, extra ...raw) []byte {
		p := Plan{SumsLast: true}
		if sums == nil {
			for _, r := range raws {
				if r.h.Typeflag == tar.TypeReg {
					sums = append(sums, sumRecord(r.body)...)
				}
			}
		}
		for _, e := range entries {
			e.SHA256 = ""
			p.Entries = append(p.Entries, e)
		}
		all := append(slices.Clone(raws), raw{tar.Header{Name: sumsName, Typeflag: tar.TypeReg, Mode: 0o600, Size: int64(len(sums))}, string(sums)})
		return archive(t, p, append(all, extra...)...)
	}
	twoSums := func(a, b string) []byte { return append(sumRecord(a), sumRecord(b)...) }

	tests := []struct {
		name  string
		data  []byte
		lim   Limits
		setup func(t *testing.T, root, outside string)
	}{
		{name: "dotdot in plan", data: archive(t, Plan{Entries: []manifest.Entry{evilE}}, evilR)},
		{name: "absolute in plan", data: archive(t, Plan{Entries: []manifest.Entry{absE}}, absR)},
		{name: "tar name differs from plan", data: archive(t, Plan{Entries: []manifest.Entry{okE}}, raw{tar.Header{Name: "../ok.txt", Typeflag: tar.TypeReg, Size: 4}, "fine"})},
		{name: "git metadata", data: archive(t, Plan{Entries: []manifest.Entry{gitE}}, gitR)},
		{name: "symlink to /etc", data: archive(t, Plan{Entries: []manifest.Entry{etcE}}, etcR)},
		{name: "symlink climbing out", data: archive(t, Plan{Entries: []manifest.Entry{upE}}, upR)},
		{name: "dotdot through a symlink", data: archive(t, Plan{Entries: []manifest.Entry{dotE, dotdotE}}, dotR, dotdotR)},
		{name: "write below a symlink in the archive", data: archive(t, Plan{Entries: []manifest.Entry{etcE, {Path: "etc/passwd", Type: manifest.TypeFile, Mode: 0o644, SHA256: sum("")}}}, etcR, raw{tar.Header{Name: "etc/passwd", Typeflag: tar.TypeReg}, ""})},
		{
			name: "symlinked directory in the target used to write outside",
			data: archive(t, Plan{Entries: []manifest.Entry{viaE}}, viaR),
			setup: func(t *testing.T, root, outside string) {
				must(t, os.Symlink(outside, filepath.Join(root, "out")))
			},
		},
		{
			name: "deletion through a symlinked directory",
			data: archive(t, Plan{Deletes: []string{"out/keep"}}),
			setup: func(t *testing.T, root, outside string) {
				must(t, os.Symlink(outside, filepath.Join(root, "out")))
			},
		},
		{name: "fifo", data: archive(t, Plan{Entries: []manifest.Entry{okE}}, raw{tar.Header{Name: "ok.txt", Typeflag: tar.TypeFifo, Mode: 0o644}, ""})},
		{name: "char device", data: archive(t, Plan{Entries: []manifest.Entry{okE}}, raw{tar.Header{Name: "ok.txt", Typeflag: tar.TypeChar, Devmajor: 1, Devminor: 3}, ""})},
		{name: "hard link", data: archive(t, Plan{Entries: []manifest.Entry{okE}}, raw{tar.Header{Name: "ok.txt", Typeflag: tar.TypeLink, Linkname: "/etc/passwd"}, ""})},
		{name: "device type in plan", data: archive(t, Plan{Entries: []manifest.Entry{{Path: "dev", Type: "device"}}})},
		{name: "oversized file", data: valid, lim: Limits{MaxFileSize: 1024}},
		{name: "over total size", data: valid, lim: Limits{MaxTotalSize: 2050}},
		{name: "huge entry count", data: archive(t, manyPlan, manyRaw...), lim: Limits{MaxEntries: 10}},
		{name: "content does not match hash", data: archive(t, Plan{Entries: []manifest.Entry{badHash}}, badHashR)},
		{name: "entry missing", data: archive(t, Plan{Entries: []manifest.Entry{bigE, okE}}, bigR)},
		{name: "entry beyond plan", data: archive(t, Plan{Entries: []manifest.Entry{okE}}, okR, bigR)},
		{name: "no plan", data: compress(t, []byte{})},
		{name: "truncated", data: valid[:len(valid)-20]},
		{name: "truncated early", data: valid[:len(valid)/2]},
		{name: "corrupt", data: func() []byte { b := slices.Clone(valid); b[len(b)/2] ^= 0xff; b[len(b)/2+1] ^= 0x55; return b }()},
		{name: "trailing garbage", data: append(slices.Clone(valid), []byte("garbage garbage garbage")...)},
		{name: "not zstd", data: []byte("plain text, not an archive")},
		{name: "streamed: content does not match its sum", data: streamed(twoSums(bigR.body, "FINE"), []manifest.Entry{bigE, okE}, []raw{bigR, okR})},
		{name: "streamed: sums in the wrong order", data: streamed(twoSums(okR.body, bigR.body), []manifest.Entry{bigE, okE}, []raw{bigR, okR})},
		{name: "streamed: right sha256, wrong checksum", data: streamed(func() []byte {
			b := twoSums(bigR.body, okR.body)
			b[len(b)-1] ^= 1 // ok.txt's XXH64
			return b
		}(), []manifest.Entry{bigE, okE}, []raw{bigR, okR})},
		{name: "streamed: sums missing", data: archive(t, Plan{SumsLast: true, Entries: []manifest.Entry{{Path: "ok.txt", Type: manifest.TypeFile, Mode: 0o644, Size: 4}}}, okR)},
		{name: "streamed: sums cut short", data: streamed(twoSums(bigR.body, okR.body)[:40], []manifest.Entry{bigE, okE}, []raw{bigR, okR})},
		{name: "streamed: entry after the sums", data: streamed(nil, []manifest.Entry{okE}, []raw{okR}, bigR)},
		{name: "streamed: hash in the plan", data: archive(t, Plan{SumsLast: true, Entries: []manifest.Entry{okE}}, okR, raw{tar.Header{Name: sumsName, Typeflag: tar.TypeReg, Size: sumSize}, string(sumRecord(okR.body))})},
		{name: "streamed: dotdot", data: streamed(nil, []manifest.Entry{evilE}, []raw{evilR})},
		{
			name: "file over an existing directory not deleted first",
			data: archive(t, Plan{Entries: []manifest.Entry{okE}}, okR),
			setup: func(t *testing.T, root, outside string) {
				must(t, os.Mkdir(filepath.Join(root, "ok.txt"), 0o755))
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := synctest.Context(t)
			root, outside := t.TempDir(), t.TempDir()
			synctest.Write(t, root, map[string]string{"existing.txt": "keep me", "ok.txt": "old"})
			synctest.Write(t, outside, map[string]string{"keep": "outside"})
			if tt.setup != nil {
				must(t, os.Remove(filepath.Join(root, "ok.txt")))
				tt.setup(t, root, outside)
			}
			before, beforeOut := synctest.Snapshot(t, root), synctest.Snapshot(t, outside)
			_, err := Apply(ctx, bytes.NewReader(tt.data), root, ApplyOptions{Limits: tt.lim})
			if err == nil {
				t.Fatal("archive accepted")
			}
			t.Logf("refused: %v", err)
			if after := synctest.Snapshot(t, root); !maps.Equal(before, after) {
				t.Fatalf("target changed:\nbefore %v\nafter  %v", before, after)
			}
			if after := synctest.Snapshot(t, outside); !maps.Equal(beforeOut, after) {
				t.Fatalf("outside changed: %v", after)
			}
			if tt.setup != nil {
				return // the archive is only hostile against that target
			}
			// A target that does not exist yet is staged next to it: refused, nothing is left.
			parent := t.TempDir()
			if _, err := Apply(ctx, bytes.NewReader(tt.data), filepath.Join(parent, "new"), ApplyOptions{Limits: tt.lim}); err == nil {
				t.Fatal("archive accepted into a new target")
			}
			if entries, _ := os.ReadDir(parent); len(entries) != 0 {
				t.Fatalf("refused archive left %v", entries)
			}
		})
	}
	for name, data := range map[string][]byte{"the valid archive applies": valid, "the valid streamed archive applies": streamed(nil, []manifest.Entry{bigE, okE}, []raw{bigR, okR})} {
		t.Run(name, func(t *testing.T) {
			root := t.TempDir()
			if _, err := Apply(synctest.Context(t), bytes.NewReader(data), root, ApplyOptions{}); err != nil {
				t.Fatal(err)
			}
			if got := synctest.Read(t, root, "ok.txt"); got != "fine" {
				t.Fatalf("ok.txt = %q", got)
			}
		})
	}
}

var fuzzEnc, _ = zstd.NewWriter(nil, zstd.WithEncoderConcurrency(1), zstd.WithLowerEncoderMem(true))

// fuzzArchive builds an archive from a compact description, so that the fuzzer mutates what
// Apply decides on (paths, types, sizes, hashes, targets, order, truncation) in inputs of a few
// dozen bytes. Raw tar bytes made the inputs kilobytes long (512-byte blocks): every input that
// found new coverage was then minimized by the fuzzing engine's quadratic pass for its whole
// 60-second budget, during which the worker reported no executions, so `go test -fuzz` stalled
// after a handful of them.
//
// spec holds one entry per line: "<kind><flags> <path>[ <arg>]". Kinds: f (file, arg = content),
// d (dir), l (symlink, arg = target), x (a deletion). Flags is one character whose low bits
// corrupt the tar entry against its plan entry: 1 another tar type, 2 another hash or target,
// 4 a declared size one larger than the content, 8 no tar entry, 16 no plan entry, 32 mode
// bits outside 0777. cut drops that many bytes from the end of the tar stream.
func fuzzArchive(spec []byte, cut uint16) []byte {
	var plan Plan
	plan.Version = PlanVersion
	var tb bytes.Buffer
	tw := tar.NewWriter(&tb)
	var entries []raw
	streamed, sumsFlags := false, byte(0)
	content := map[string]string{} // by path: the content each file's plan hash is of
	for line := range strings.SplitSeq(string(spec), "\n") {
		if len(line) >= 2 && line[0] == 's' {
			// a streamed archive (sums at the end); flags: 1 no sums entry, 2 sums one byte short,
			// 4 a hash left in the plan
			streamed, sumsFlags = true, line[1]
			continue
		}
		if len(line) < 3 {
			continue
		}
		kind, flags := line[0], line[1]
		p, arg, _ := strings.Cut(line[3:], " ")
		if kind == 'x' {
			plan.Deletes = append(plan.Deletes, p)
			continue
		}
		e := manifest.Entry{Path: p, Mode: 0o644}
		h := tar.Header{Name: p, Mode: 0o644}
		switch kind {
		case 'f':
			e.Type, e.Size, e.SHA256 = manifest.TypeFile, int64(len(arg)), sum(arg)
			h.Typeflag, h.Size = tar.TypeReg, int64(len(arg))
		case 'd':
			e.Type, e.Mode, h.Typeflag, h.Mode = manifest.TypeDir, 0o755, tar.TypeDir, 0o755
			arg = ""
		case 'l':
			e.Type, e.Mode, e.Target = manifest.TypeSymlink, 0o777, arg
			h.Typeflag, h.Linkname = tar.TypeSymlink, arg
			arg = ""
		default:
			continue
		}
		if flags&1 != 0 {
			h.Typeflag = map[byte]byte{tar.TypeReg: tar.TypeFifo, tar.TypeDir: tar.TypeReg, tar.TypeSymlink: tar.TypeLink}[h.Typeflag]
		}
		if flags&2 != 0 {
			e.SHA256, e.Target = sum(arg+"!"), e.Target+"x"
			if kind == 'f' {
				content[p] = arg + "!"
			}
		} else if kind == 'f' {
			content[p] = arg
		}
		if flags&4 != 0 {
			h.Size++
		}
		if flags&32 != 0 {
			e.Mode |= 0o4000
		}
		if flags&16 == 0 {
			plan.Entries = append(plan.Entries, e)
		}
		if flags&8 == 0 {
			entries = append(entries, raw{h, arg})
		}
	}
	var sums []byte
	if streamed {
		plan.SumsLast = true
		for i, e := range plan.Entries {
			if e.Type == manifest.TypeFile {
				sums = append(sums, sumRecord(content[e.Path])...) // the plan's hash, of the content it names
				if sumsFlags&4 == 0 || i > 0 {
					plan.Entries[i].SHA256 = ""
				}
			}
		}
		if sumsFlags&2 != 0 && len(sums) > 0 {
			sums = sums[:len(sums)-1]
		}
		if sumsFlags&1 == 0 {
			entries = append(entries, raw{tar.Header{Name: sumsName, Typeflag: tar.TypeReg, Mode: 0o600, Size: int64(len(sums))}, string(sums)})
		}
	}
	pb, _ := json.Marshal(plan)
	_ = tw.WriteHeader(&tar.Header{Name: headerName, Typeflag: tar.TypeReg, Mode: 0o600, Size: int64(len(pb))})
	_, _ = tw.Write(pb)
	for _, e := range entries {
		h := e.h
		h.Format = tar.FormatPAX
		_ = tw.WriteHeader(&h) // a short entry makes the next header fail: a truncated archive
		_, _ = tw.Write([]byte(e.body))
	}
	_ = tw.Close()
	b := tb.Bytes()
	b = b[:len(b)-min(int(cut), len(b))]
	return fuzzEnc.EncodeAll(b, nil)
}

func FuzzApply(f *testing.F) {
	f.Add([]byte("d0 d\nl0 d/l ../ok.txt\nf0 ok.txt fine"), uint16(0))
	f.Add([]byte("x0 x"), uint16(0))
	f.Add([]byte("f1 ok.txt fine"), uint16(0))
	f.Add([]byte("f2 ok.txt fine"), uint16(0))
	f.Add([]byte("f0 ../evil x"), uint16(0))
	f.Add([]byte("l0 etc /etc\nf0 etc/passwd x"), uint16(0))
	f.Add([]byte("f0 a aaaa\nf0 b bbbb"), uint16(700))
	f.Add([]byte("d0 x\nf0 x/y new"), uint16(0))
	f.Add([]byte("s0\nd0 d\nf0 d/a aaaa\nf2 d/b bbbb"), uint16(0))
	f.Add([]byte("s1\nf0 ok.txt fine"), uint16(0))
	f.Add([]byte("s2\nf0 ok.txt fine"), uint16(0))
	f.Add([]byte("s4\nf0 ok.txt fine"), uint16(0))
	f.Fuzz(func(t *testing.T, spec []byte, cut uint16) {
		parent := t.TempDir()
		root := filepath.Join(parent, "root")
		outside := filepath.Join(parent, "outside")
		must(t, os.MkdirAll(filepath.Join(root, "x"), 0o755))
		must(t, os.WriteFile(filepath.Join(root, "x", "old"), []byte("old"), 0o644))
		must(t, os.MkdirAll(outside, 0o755))
		before := synctest.Snapshot(t, root)
		_, err := Apply(synctest.Context(t), bytes.NewReader(fuzzArchive(spec, cut)), root,
			ApplyOptions{Limits: Limits{MaxEntries: 64, MaxFileSize: 1 << 16, MaxTotalSize: 1 << 18}})
		if entries, _ := os.ReadDir(outside); len(entries) != 0 {
			t.Fatal("wrote outside the root")
		}
		if entries, _ := os.ReadDir(parent); len(entries) != 2 {
			t.Fatalf("staging left next to the root: %v", entries)
		}
		after := synctest.Snapshot(t, root)
		if err != nil && !maps.Equal(before, after) {
			t.Fatalf("refused archive changed the root: %v", err)
		}
		for p, v := range after {
			if strings.HasPrefix(p, manifest.StagingPrefix) {
				t.Fatalf("staging left in the root: %s", p)
			}
			if strings.HasPrefix(v, "link:") && !manifest.SymlinkInside(filepath.ToSlash(p), strings.TrimPrefix(v, "link:")) {
				t.Fatalf("escaping symlink %s %s", p, v)
			}
		}
	})
}

// TestApplyKeepsModesAndMTimes: staged files get exactly the plan's mode (even bits the umask
// would strip, and read-only ones) and its mtime to the nanosecond, in a planned and a streamed
// archive.
func TestApplyKeepsModesAndMTimes(t *testing.T) {
	ctx := synctest.Context(t)
	src := t.TempDir()
	modes := map[string]os.FileMode{"rw-rw-r": 0o664, "private": 0o600, "exec": 0o755, "readonly": 0o444, "big-shared": 0o666}
	mt := time.Date(2024, 2, 29, 12, 34, 56, 123456789, time.UTC)
	for name, mode := range modes {
		body := name
		if strings.HasPrefix(name, "big") {
			body = strings.Repeat("b", smallFile+1) // streamed by the reader, not the pool
		}
		must(t, os.WriteFile(filepath.Join(src, name), []byte(body), 0o600))
		must(t, os.Chmod(filepath.Join(src, name), mode))
		must(t, os.Chtimes(filepath.Join(src, name), mt, mt))
	}
	m := build(t, src)
	listing, err := manifest.List(ctx, src, manifest.Options{})
	must(t, err)
	for kind, plan := range map[string]Plan{"planned": PlanFor(nil, m), "streamed": {Entries: listing.Unhashed().Entries, SumsLast: true}} {
		var buf bytes.Buffer
		if _, err := Write(ctx, &buf, src, plan); err != nil {
			t.Fatal(err)
		}
		dst := filepath.Join(t.TempDir(), kind)
		if _, err := Apply(ctx, &buf, dst, ApplyOptions{}); err != nil {
			t.Fatal(err)
		}
		for name, mode := range modes {
			fi, err := os.Lstat(filepath.Join(dst, name))
			must(t, err)
			if fi.Mode().Perm() != mode || !fi.ModTime().Equal(mt) {
				t.Errorf("%s %s: mode %v mtime %v, want %v %v", kind, name, fi.Mode().Perm(), fi.ModTime().UTC(), mode, mt)
			}
		}
	}
}

// TestApplyPartsChecksTheWhole: parts of one sync must be parts 0..n-1 of n, each once, in order
// across them, with deletions and the cache in part 0 only; a part alone, or a part that fails, is
// refused with nothing written. Two good parts apply as one tree.
func TestApplyPartsChecksTheWhole(t *testing.T) {
	aE, aR := fileEntry("a", "A")
	bE, bR := fileEntry("b", "B")
	cE, cR := fileEntry("c", "C")
	badE, badR := fileEntry("c", "C")
	badR.body = "X"
	part := func(k, n int, entries []manifest.Entry, raws ...raw) []byte {
		return archive(t, Plan{Part: k, Parts: n, Entries: entries}, raws...)
	}
	cases := []struct {
		name  string
		parts [][]byte
	}{
		{"same part twice", [][]byte{part(0, 2, []manifest.Entry{aE}, aR), part(0, 2, []manifest.Entry{bE}, bR)}},
		{"parts out of order across them", [][]byte{part(0, 2, []manifest.Entry{bE}, bR), part(1, 2, []manifest.Entry{aE}, aR)}},
		{"overlapping parts", [][]byte{part(0, 2, []manifest.Entry{aE}, aR), part(1, 2, []manifest.Entry{aE}, aR)}},
		{"parts count differs", [][]byte{part(0, 3, []manifest.Entry{aE}, aR), part(1, 3, []manifest.Entry{bE}, bR)}},
		{"deletion in part 1", [][]byte{part(0, 2, []manifest.Entry{aE}, aR), archive(t, Plan{Part: 1, Parts: 2, Entries: []manifest.Entry{bE}, Deletes: []string{"x"}}, bR)}},
		{"one part fails its hash", [][]byte{part(0, 2, []manifest.Entry{aE, bE}, aR, bR), part(1, 2, []manifest.Entry{badE}, badR)}},
		{"a part alone", [][]byte{part(1, 2, []manifest.Entry{cE}, cR)}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			parent := t.TempDir()
			var rs []io.Reader
			for _, p := range tc.parts {
				rs = append(rs, bytes.NewReader(p))
			}
			_, err := ApplyParts(synctest.Context(t), rs, filepath.Join(parent, "root"), ApplyOptions{})
			if err == nil {
				t.Fatal("accepted")
			}
			t.Logf("refused: %v", err)
			if entries, _ := os.ReadDir(parent); len(entries) != 0 {
				t.Fatalf("refused parts left %v", entries)
			}
		})
	}
	root := filepath.Join(t.TempDir(), "root")
	// given in any order: the part numbers say which is which
	if _, err := ApplyParts(synctest.Context(t), []io.Reader{bytes.NewReader(part(1, 2, []manifest.Entry{cE}, cR)), bytes.NewReader(part(0, 2, []manifest.Entry{aE, bE}, aR, bR))}, root, ApplyOptions{}); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{"a": "A", "b": "B", "c": "C"} {
		if got := synctest.Read(t, root, name); got != want {
			t.Fatalf("%s = %q", name, got)
		}
	}
}

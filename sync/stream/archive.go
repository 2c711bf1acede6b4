package stream

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"syscall"
	"time"

	"github.com/klauspost/compress/zstd"

	"github.com/openclaw/cloudworkers/sync/manifest"
)

// headerName names the first tar entry of every archive: the plan it carries, as JSON.
const headerName = ".openclaw-sync-plan.json"

// Plan is what an archive carries: entries to write (sorted, with their content hashes) and paths
// to delete first (sorted).
type Plan struct {
	Version int              `json:"version"`
	Entries []manifest.Entry `json:"entries"`
	Deletes []string         `json:"deletes,omitempty"`
}

// PlanFor is the plan that turns the tree described by from into the tree described by to.
// A nil from means an empty tree.
func PlanFor(from, to *manifest.Manifest) Plan {
	if from == nil {
		return Plan{Version: 1, Entries: slices.Clone(to.Entries)}
	}
	c := manifest.Diff(from, to)
	return Plan{Version: 1, Entries: c.Send(), Deletes: c.DeletePaths(from)}
}

// Empty reports whether the plan changes nothing.
func (p Plan) Empty() bool { return len(p.Entries) == 0 && len(p.Deletes) == 0 }

// Bytes sums the file sizes of the plan.
func (p Plan) Bytes() int64 {
	var n int64
	for _, e := range p.Entries {
		n += e.Size
	}
	return n
}

// Stats count what an archive carried.
type Stats struct {
	Files, Dirs, Symlinks, Deleted int
	// Bytes is the file content carried (uncompressed).
	Bytes int64
}

// ErrChanged is returned by Write when a file no longer matches its manifest entry.
var ErrChanged = errors.New("file changed since the manifest was built")

// RefusedError is an archive that was rejected; nothing was written to the target.
type RefusedError struct {
	Path   string // the offending path, when there is one
	Reason string
}

func (e *RefusedError) Error() string {
	if e.Path == "" {
		return "archive refused: " + e.Reason
	}
	return fmt.Sprintf("archive refused: %q: %s", e.Path, e.Reason)
}

func refused(p, format string, args ...any) error {
	return &RefusedError{Path: p, Reason: fmt.Sprintf(format, args...)}
}

// Write streams the plan as a tar+zstd archive of the files below root to w. Every file is
// re-hashed while it is sent; one that no longer matches its entry fails with ErrChanged.
func Write(ctx context.Context, w io.Writer, root string, plan Plan) (Stats, error) {
	return WriteFrom(ctx, w, plan, func(e manifest.Entry) string {
		return filepath.Join(root, filepath.FromSlash(e.Path))
	})
}

// WriteFrom is Write with the content of each file entry read from source(entry) instead of from
// below a root: a content-addressed store, for example. Each file is still checked against its
// entry's size and sha256 while it is sent.
func WriteFrom(ctx context.Context, w io.Writer, plan Plan, source func(manifest.Entry) string) (Stats, error) {
	var st Stats
	plan.Version = 1
	zw, err := zstd.NewWriter(w, zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithEncoderConcurrency(runtime.GOMAXPROCS(0)))
	if err != nil {
		return st, err
	}
	defer zw.Close()
	tw := tar.NewWriter(zw)
	hdr, err := json.Marshal(plan)
	if err != nil {
		return st, err
	}
	if err := tw.WriteHeader(&tar.Header{Name: headerName, Typeflag: tar.TypeReg, Mode: 0o600, Size: int64(len(hdr)), Format: tar.FormatPAX}); err != nil {
		return st, fmt.Errorf("write archive: %w", err)
	}
	if _, err := tw.Write(hdr); err != nil {
		return st, fmt.Errorf("write archive: %w", err)
	}
	buf := make([]byte, 256<<10)
	for _, e := range plan.Entries {
		if err := ctx.Err(); err != nil {
			return st, err
		}
		h := &tar.Header{Name: e.Path, Mode: int64(e.Mode), Format: tar.FormatPAX}
		switch e.Type {
		case manifest.TypeDir:
			h.Typeflag = tar.TypeDir
			st.Dirs++
		case manifest.TypeSymlink:
			h.Typeflag, h.Linkname = tar.TypeSymlink, e.Target
			st.Symlinks++
		case manifest.TypeFile:
			h.Typeflag, h.Size, h.ModTime = tar.TypeReg, e.Size, time.Unix(0, e.MTime)
			st.Files++
		default:
			return st, fmt.Errorf("write archive: %s: type %q", e.Path, e.Type)
		}
		if err := tw.WriteHeader(h); err != nil {
			return st, fmt.Errorf("write archive: %s: %w", e.Path, err)
		}
		if e.Type != manifest.TypeFile {
			continue
		}
		n, err := copyFile(tw, source(e), e, buf)
		st.Bytes += n
		if err != nil {
			return st, err
		}
	}
	st.Deleted = len(plan.Deletes)
	if err := tw.Close(); err != nil {
		return st, fmt.Errorf("write archive: %w", err)
	}
	if err := zw.Close(); err != nil {
		return st, fmt.Errorf("write archive: %w", err)
	}
	return st, nil
}

func copyFile(w io.Writer, file string, e manifest.Entry, buf []byte) (int64, error) {
	f, err := os.OpenFile(file, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return 0, fmt.Errorf("send %s: %w", e.Path, err)
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.CopyBuffer(io.MultiWriter(w, h), io.LimitReader(f, e.Size), buf)
	if err != nil {
		return n, fmt.Errorf("send %s: %w", e.Path, err)
	}
	var one [1]byte
	if n != e.Size || hex.EncodeToString(h.Sum(nil)) != e.SHA256 {
		return n, fmt.Errorf("send %s: %w", e.Path, ErrChanged)
	}
	if m, _ := f.Read(one[:]); m > 0 {
		return n, fmt.Errorf("send %s: %w", e.Path, ErrChanged)
	}
	return n, nil
}

// Limits bound an archive read from elsewhere.
type Limits struct {
	// MaxEntries bounds entries plus deletions; default 1,000,000.
	MaxEntries int
	// MaxFileSize bounds one file; default 8 GiB.
	MaxFileSize int64
	// MaxTotalSize bounds all file content; default 64 GiB.
	MaxTotalSize int64
	// MaxPlanBytes bounds the plan at the head of the archive; default 256 MiB.
	MaxPlanBytes int64
}

// DefaultLimits are used for zero fields.
var DefaultLimits = Limits{MaxEntries: 1_000_000, MaxFileSize: 8 << 30, MaxTotalSize: 64 << 30, MaxPlanBytes: 256 << 20}

func (l *Limits) setDefaults() {
	if l.MaxEntries <= 0 {
		l.MaxEntries = DefaultLimits.MaxEntries
	}
	if l.MaxFileSize <= 0 {
		l.MaxFileSize = DefaultLimits.MaxFileSize
	}
	if l.MaxTotalSize <= 0 {
		l.MaxTotalSize = DefaultLimits.MaxTotalSize
	}
	if l.MaxPlanBytes <= 0 {
		l.MaxPlanBytes = DefaultLimits.MaxPlanBytes
	}
}

// ApplyOptions configure Apply.
type ApplyOptions struct {
	Limits
	// Expect, when set, is the plan the caller asked for: the archive must carry exactly it.
	Expect *Plan
	// AllowEscapingSymlinks accepts symlinks whose targets leave the root. Only a box unpacking
	// what the gateway sent sets it (the gateway's workspace may hold such links); nothing read
	// from a box ever does.
	AllowEscapingSymlinks bool
	// Fsync syncs every written file and directory before it is renamed into place.
	Fsync bool
}

// ValidatePlan checks a plan's paths, types, order and limits, and symlink containment unless
// allowEscaping.
func ValidatePlan(p *Plan, lim Limits, allowEscaping bool) error {
	lim.setDefaults()
	if p.Version != 1 {
		return refused("", "plan version %d not supported", p.Version)
	}
	if len(p.Entries)+len(p.Deletes) > lim.MaxEntries {
		return refused("", "%d entries and deletions, over the limit of %d", len(p.Entries)+len(p.Deletes), lim.MaxEntries)
	}
	m := manifest.Manifest{Version: manifest.Version, Entries: p.Entries}
	if err := m.Validate(manifest.Limits{MaxEntries: lim.MaxEntries}); err != nil {
		var pe *manifest.PathError
		if errors.As(err, &pe) {
			return refused(pe.Path, "%s", pe.Reason)
		}
		return refused("", "%v", err)
	}
	var total int64
	for _, e := range p.Entries {
		if e.Type == manifest.TypeFile {
			if e.Size > lim.MaxFileSize {
				return refused(e.Path, "file of %d bytes is over the limit of %d", e.Size, lim.MaxFileSize)
			}
			total += e.Size
			if total > lim.MaxTotalSize {
				return refused(e.Path, "archive content over the limit of %d bytes", lim.MaxTotalSize)
			}
		}
		if e.Type == manifest.TypeSymlink && !allowEscaping && !manifest.SymlinkInside(e.Path, e.Target) {
			return refused(e.Path, "symlink to %q leaves the root", e.Target)
		}
	}
	for i, d := range p.Deletes {
		if err := manifest.ValidPath(d); err != nil {
			return refused(d, "deletion: %v", err)
		}
		if i > 0 && p.Deletes[i-1] >= d {
			return refused(d, "deletions not sorted or duplicated")
		}
	}
	return nil
}

func samePlan(a, b *Plan) bool {
	if len(a.Entries) != len(b.Entries) || !slices.Equal(a.Deletes, b.Deletes) {
		return false
	}
	for i := range a.Entries {
		if a.Entries[i].Path != b.Entries[i].Path || !a.Entries[i].Same(b.Entries[i]) {
			return false
		}
	}
	return true
}

// Apply reads an archive from r and applies it below root. It first reads the whole archive into
// a staging directory inside root, checking every entry against the plan at its head (paths,
// types, sizes, sha256, limits, symlink containment) and the target for symlinked or mismatched
// parents; any violation, and any truncated or corrupt input, returns a *RefusedError (or the
// read error) with root untouched. Only then are deletions made and staged entries renamed into place.
func Apply(ctx context.Context, r io.Reader, root string, opts ApplyOptions) (Stats, error) {
	opts.Limits.setDefaults()
	var st Stats
	if err := os.MkdirAll(root, 0o755); err != nil {
		return st, err
	}
	if fi, err := os.Lstat(root); err != nil || !fi.IsDir() {
		return st, fmt.Errorf("apply archive: %s is not a directory", root)
	}
	zr, err := zstd.NewReader(r, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxMemory(1<<30), zstd.WithDecoderMaxWindow(128<<20))
	if err != nil {
		return st, err
	}
	defer zr.Close()
	tr := tar.NewReader(zr)

	h, err := tr.Next()
	if err != nil {
		return st, refused("", "read plan: %v", err)
	}
	if h.Name != headerName || h.Typeflag != tar.TypeReg || h.Size < 0 || h.Size > opts.MaxPlanBytes {
		return st, refused(h.Name, "archive does not start with a plan")
	}
	pb, err := io.ReadAll(tr)
	if err != nil {
		return st, refused("", "read plan: %v", err)
	}
	dec := json.NewDecoder(bytes.NewReader(pb))
	dec.DisallowUnknownFields()
	var plan Plan
	if err := dec.Decode(&plan); err != nil {
		return st, refused("", "decode plan: %v", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return st, refused("", "decode plan: trailing data")
	}
	if err := ValidatePlan(&plan, opts.Limits, opts.AllowEscapingSymlinks); err != nil {
		return st, err
	}
	if opts.Expect != nil && !samePlan(&plan, opts.Expect) {
		return st, refused("", "archive does not carry the requested plan")
	}

	staging, err := os.MkdirTemp(root, manifest.StagingPrefix+"*")
	if err != nil {
		return st, err
	}
	defer os.RemoveAll(staging)
	staged := make([]string, len(plan.Entries))
	buf := make([]byte, 256<<10)
	for i, e := range plan.Entries {
		if err := ctx.Err(); err != nil {
			return st, err
		}
		h, err := tr.Next()
		if err != nil {
			return st, refused(e.Path, "archive ends before this entry: %v", err)
		}
		if h.Name != e.Path {
			return st, refused(h.Name, "entry out of plan (expected %q)", e.Path)
		}
		want := map[manifest.Type]byte{manifest.TypeFile: tar.TypeReg, manifest.TypeDir: tar.TypeDir, manifest.TypeSymlink: tar.TypeSymlink}[e.Type]
		if h.Typeflag != want {
			return st, refused(h.Name, "entry type %q not allowed here (devices, FIFOs, sockets and hard links never are)", string(h.Typeflag))
		}
		switch e.Type {
		case manifest.TypeDir:
			st.Dirs++
		case manifest.TypeSymlink:
			if h.Linkname != e.Target {
				return st, refused(h.Name, "symlink target differs from the plan")
			}
			st.Symlinks++
		case manifest.TypeFile:
			if h.Size != e.Size {
				return st, refused(h.Name, "size %d differs from the plan (%d)", h.Size, e.Size)
			}
			staged[i] = filepath.Join(staging, fmt.Sprintf("%d", i))
			if err := stageFile(tr, staged[i], e, buf, opts.Fsync); err != nil {
				return st, err
			}
			st.Files++
			st.Bytes += e.Size
		}
	}
	if _, err := tr.Next(); err != io.EOF {
		return st, refused("", "data after the last planned entry")
	}
	// The zstd stream must end cleanly too: a truncated or corrupt tail is refused.
	if n, err := io.Copy(io.Discard, io.LimitReader(zr, 1<<20)); err != nil || n >= 1<<20 {
		return st, refused("", "corrupt or overlong archive tail")
	}
	if err := checkTarget(root, &plan); err != nil {
		return st, err
	}
	st.Deleted = len(plan.Deletes)
	return st, commit(root, staging, &plan, staged, opts.Fsync)
}

func stageFile(r io.Reader, file string, e manifest.Entry, buf []byte, fsync bool) error {
	f, err := os.OpenFile(file, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	h := sha256.New()
	n, err := io.CopyBuffer(io.MultiWriter(f, h), io.LimitReader(r, e.Size), buf)
	if err == nil && fsync {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return refused(e.Path, "read content: %v", err)
	}
	if n != e.Size {
		return refused(e.Path, "truncated content")
	}
	if hex.EncodeToString(h.Sum(nil)) != e.SHA256 {
		return refused(e.Path, "content does not match its sha256")
	}
	return nil
}

// checkTarget refuses a plan that would write through a symlink or over an entry of another type
// that is not deleted first.
func checkTarget(root string, plan *Plan) error {
	deleted := make(map[string]bool, len(plan.Deletes))
	for _, d := range plan.Deletes {
		deleted[d] = true
	}
	checked := map[string]bool{}
	check := func(p string, isEntry bool, t manifest.Type) error {
		// Parents: real directories, or gone once deletions are done.
		var parents []string
		for d := filepath.Dir(p); d != "."; d = filepath.Dir(d) {
			parents = append(parents, d)
		}
		gone := false
		for i := len(parents) - 1; i >= 0; i-- {
			d := parents[i]
			if deleted[d] {
				gone = true
				break // everything below it is removed first
			}
			if checked[d] {
				continue
			}
			fi, err := os.Lstat(filepath.Join(root, d))
			if errors.Is(err, os.ErrNotExist) {
				break
			}
			if err != nil {
				return err
			}
			if !fi.IsDir() {
				return refused(p, "parent %q is not a directory (a symlink or file) in the target", d)
			}
			checked[d] = true
		}
		if !isEntry || gone || deleted[p] {
			return nil
		}
		fi, err := os.Lstat(filepath.Join(root, filepath.FromSlash(p)))
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		if (t == manifest.TypeDir) != fi.IsDir() || (fi.Mode()&os.ModeType != 0 && !fi.IsDir() && fi.Mode()&os.ModeSymlink == 0) {
			return refused(p, "exists in the target as another type and is not deleted first")
		}
		return nil
	}
	for _, d := range plan.Deletes {
		if err := check(d, false, ""); err != nil {
			return err
		}
	}
	for _, e := range plan.Entries {
		if err := check(e.Path, true, e.Type); err != nil {
			return err
		}
	}
	return nil
}

// commit makes the checked plan real: deletions (deepest first), directories, then files and
// symlinks renamed from staging, then directory modes (deepest first).
func commit(root, staging string, plan *Plan, staged []string, fsync bool) error {
	dels := slices.Clone(plan.Deletes)
	sort.Sort(sort.Reverse(sort.StringSlice(dels)))
	for _, d := range dels {
		if err := os.RemoveAll(filepath.Join(root, filepath.FromSlash(d))); err != nil {
			return fmt.Errorf("delete %s: %w", d, err)
		}
	}
	touched := map[string]bool{}
	for i, e := range plan.Entries {
		dst := filepath.Join(root, filepath.FromSlash(e.Path))
		switch e.Type {
		case manifest.TypeDir:
			if err := os.MkdirAll(dst, 0o700); err != nil {
				return fmt.Errorf("create %s: %w", e.Path, err)
			}
			_ = os.Chmod(dst, 0o700|os.FileMode(e.Mode)) // final mode once its content is in
		case manifest.TypeFile:
			if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
				return err
			}
			if err := os.Chmod(staged[i], os.FileMode(e.Mode)); err != nil {
				return err
			}
			mt := time.Unix(0, e.MTime)
			_ = os.Chtimes(staged[i], mt, mt)
			if err := os.Rename(staged[i], dst); err != nil {
				return fmt.Errorf("write %s: %w", e.Path, err)
			}
		case manifest.TypeSymlink:
			if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
				return err
			}
			tmp := filepath.Join(staging, fmt.Sprintf("l%d", i))
			if err := os.Symlink(e.Target, tmp); err != nil {
				return err
			}
			if err := os.Rename(tmp, dst); err != nil {
				return fmt.Errorf("write %s: %w", e.Path, err)
			}
		}
		touched[filepath.Dir(dst)] = true
	}
	for i := len(plan.Entries) - 1; i >= 0; i-- {
		e := plan.Entries[i]
		if e.Type == manifest.TypeDir {
			if err := os.Chmod(filepath.Join(root, filepath.FromSlash(e.Path)), os.FileMode(e.Mode)); err != nil {
				return err
			}
		}
	}
	if fsync {
		for d := range touched {
			if f, err := os.Open(d); err == nil {
				_ = f.Sync()
				f.Close()
			}
		}
	}
	return nil
}

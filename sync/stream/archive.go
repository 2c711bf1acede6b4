package stream

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"path/filepath"
	"slices"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/openclaw/cloudworkers/sync/manifest"
)

// headerName names the first tar entry of every archive: the plan it carries, as JSON.
const headerName = ".openclaw-sync-plan.json"

// sumsName names the last tar entry of a streamed archive (Plan.SumsLast): one record of sumSize
// bytes per file entry, in plan order: the file's sha256 (32 raw bytes), then the XXH64 of the
// same bytes (big-endian). The box checks what it wrote against the XXH64 and records the sha256
// in the plan and its hash cache: the stream is authenticated by SSH end to end, so the check
// guards against a file torn, misframed or miscopied on the way, which a 64-bit checksum of the
// content catches as surely as a second sha256, at a twentieth of the CPU (see docs/sync.md).
const sumsName = ".openclaw-sync-sums"

// sumSize is the size of one record of a sums entry.
const sumSize = sha256.Size + 8

// appendSum appends a file's record for a sums entry.
func appendSum(b, sha []byte, check uint64) []byte {
	return binary.BigEndian.AppendUint64(append(b, sha...), check)
}

// parseSum splits a record of a sums entry: the file's sha256 in hex and its XXH64.
func parseSum(rec []byte) (string, uint64) {
	return hex.EncodeToString(rec[:sha256.Size]), binary.BigEndian.Uint64(rec[sha256.Size:])
}

// PlanVersion is the version of the plans and archives this build writes and reads: 2 since
// the sums entry of a streamed archive carries each file's XXH64 beside its sha256 (version 1
// carried the sha256 alone).
const PlanVersion = 2

// Plan is what an archive carries: entries to write (sorted, with their content hashes) and paths
// to delete first (sorted).
type Plan struct {
	Version int              `json:"version"`
	Entries []manifest.Entry `json:"entries"`
	Deletes []string         `json:"deletes,omitempty"`
	// Cache, set by the gateway only, names a hash cache file on the box that `unpack` updates
	// with the files it wrote, so that the box's next `manifest --cache` of the same directory
	// does not re-hash them. Apply refuses an archive naming one unless UpdateCache is set.
	Cache string `json:"cache,omitempty"`
	// SumsLast marks a streamed archive: its file entries carry no SHA256 in the plan; the
	// writer hashes each file as it sends it, and the archive ends with a sums entry that the
	// reader checks every staged file against before anything is committed. The sender can then
	// start before it has hashed the tree (an initial sync). Only the gateway sends one: Apply
	// refuses it when Expect is set.
	SumsLast bool `json:"sumsLast,omitempty"`
	// Part and Parts: this archive is part Part (from 0) of Parts that together carry one sync,
	// each over its own channel, read by one box process (ApplyParts); the parts' entries follow
	// each other in the whole plan. Zero Parts: a whole sync.
	Part  int `json:"part,omitempty"`
	Parts int `json:"parts,omitempty"`
}

// PlanFor is the plan that turns the tree described by from into the tree described by to.
// A nil from means an empty tree.
func PlanFor(from, to *manifest.Manifest) Plan {
	if from == nil {
		return Plan{Version: PlanVersion, Entries: slices.Clone(to.Entries)}
	}
	c := manifest.Diff(from, to)
	return Plan{Version: PlanVersion, Entries: c.Send(), Deletes: c.DeletePaths(from)}
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

// add sums the counts of the parts of one sync.
func (s *Stats) add(o Stats) {
	s.Files, s.Dirs, s.Symlinks, s.Deleted, s.Bytes = s.Files+o.Files, s.Dirs+o.Dirs, s.Symlinks+o.Symlinks, s.Deleted+o.Deleted, s.Bytes+o.Bytes
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
	return writeFrom(ctx, w, plan, source, nil)
}

// writeFrom is WriteFrom counting files and content bytes in c, when set, as they are sent.
func writeFrom(ctx context.Context, w io.Writer, plan Plan, source func(manifest.Entry) string, c *counter) (st Stats, err error) {
	plan.Version = PlanVersion
	mode := CompressAuto
	if c != nil && c.compression != "" {
		mode = c.compression
	}
	zw, err := newFrameWriter(w, mode)
	if err != nil {
		return st, err
	}
	defer func() {
		if err != nil {
			zw.abort() // the reader must see a truncated archive, never a shorter valid one
		}
	}()
	tw := tar.NewWriter(zw)
	zw.beginHead()
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
	// The plan leaves in a frame of its own: the box reads and checks it while the first files
	// are read here, instead of waiting for them to fill the plan's frame.
	if err := tw.Flush(); err != nil {
		return st, fmt.Errorf("write archive: %w", err)
	}
	zw.flushHead()
	var dst io.Writer = tw
	if c != nil {
		dst = countingWriter{tw, c}
	}
	cp := newCopier(dst)
	var sums []byte
	for i, e := range plan.Entries {
		if err := ctx.Err(); err != nil {
			return st, err
		}
		// GNU headers (long names and targets in GNU long-name entries), the mtime to the second:
		// the box takes the exact mtime from the plan. Not USTAR: Go's reader scans every USTAR
		// or PAX header block rune by rune for non-ASCII bytes (to tell the format apart), which
		// cost the box 12 ms of CPU per sync of the Go tree; a GNU block is not scanned.
		h := &tar.Header{Name: e.Path, Mode: int64(e.Mode), Format: tar.FormatGNU}
		switch e.Type {
		case manifest.TypeDir:
			h.Typeflag = tar.TypeDir
			st.Dirs++
		case manifest.TypeSymlink:
			h.Typeflag, h.Linkname = tar.TypeSymlink, e.Target
			st.Symlinks++
		case manifest.TypeFile:
			h.Typeflag, h.Size, h.ModTime = tar.TypeReg, e.Size, time.Unix(e.MTime/1e9, 0)
			st.Files++
		default:
			return st, fmt.Errorf("write archive: %q: type %q", e.Path, e.Type)
		}
		if err := tw.WriteHeader(h); err != nil {
			return st, fmt.Errorf("write archive: %q: %w", e.Path, err)
		}
		if e.Type != manifest.TypeFile {
			if c != nil && e.Type == manifest.TypeSymlink {
				c.addFile()
			}
			continue
		}
		opened := time.Now()
		n, sum, check, fi, err := cp.copyFile(source(e), e, plan.SumsLast)
		var hexSum string
		if err == nil && (plan.SumsLast || (c != nil && c.sent != nil)) {
			hexSum = hex.EncodeToString(sum)
		}
		if c != nil {
			c.addFile()
			if err == nil && c.sent != nil {
				c.sent(e.Path, fi, hexSum, opened)
			}
		}
		st.Bytes += n
		if err != nil {
			return st, err
		}
		if plan.SumsLast {
			plan.Entries[i].SHA256 = hexSum
			sums = appendSum(sums, sum, check)
		}
	}
	if plan.SumsLast {
		if err := tw.WriteHeader(&tar.Header{Name: sumsName, Typeflag: tar.TypeReg, Mode: 0o600, Size: int64(len(sums)), Format: tar.FormatPAX}); err != nil {
			return st, fmt.Errorf("write archive: %w", err)
		}
		if _, err := tw.Write(sums); err != nil {
			return st, fmt.Errorf("write archive: %w", err)
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

// copier sends files' contents into w, with its buffer and hashes reused from file to file: a
// cold sync sends tens of thousands of files, and each allocated about ten objects for this.
type copier struct {
	buf []byte
	lim io.LimitedReader
	tee teeWriter
	sum [sha256.Size]byte
}

func newCopier(w io.Writer) *copier {
	return &copier{buf: make([]byte, 256<<10), tee: teeWriter{w: w, sha: sha256.New(), x: xxhash.New()}}
}

// teeWriter writes to w and hashes what w took: always its sha256, and its XXH64 when check is set.
type teeWriter struct {
	w     io.Writer
	sha   hash.Hash
	x     *xxhash.Digest
	check bool
}

func (t *teeWriter) Write(p []byte) (int, error) {
	n, err := t.w.Write(p)
	t.sha.Write(p[:n])
	if t.check {
		t.x.Write(p[:n])
	}
	return n, err
}

// copyFile sends the file described by e and returns its sha256 (valid until the next call) and,
// when streamed, its XXH64 (for the sums entry). Without streamed, the content must match
// e.SHA256; with it (e has no hash yet), the open file must still have e's size and mtime. Either
// way a file that changed fails with ErrChanged.
func (cp *copier) copyFile(file string, e manifest.Entry, streamed bool) (int64, []byte, uint64, fs.FileInfo, error) {
	f, err := manifest.OpenFile(file)
	if err != nil {
		return 0, nil, 0, nil, fmt.Errorf("send %q: %w", e.Path, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return 0, nil, 0, nil, fmt.Errorf("send %q: %w", e.Path, err)
	}
	if !fi.Mode().IsRegular() || (streamed && (fi.Size() != e.Size || fi.ModTime().UnixNano() != e.MTime)) {
		return 0, nil, 0, nil, fmt.Errorf("send %q: %w", e.Path, ErrChanged)
	}
	cp.tee.sha.Reset()
	cp.tee.x.Reset()
	cp.tee.check = streamed
	cp.lim = io.LimitedReader{R: f, N: e.Size}
	n, err := io.CopyBuffer(&cp.tee, &cp.lim, cp.buf)
	if err != nil {
		return n, nil, 0, nil, fmt.Errorf("send %q: %w", e.Path, err)
	}
	sum := cp.tee.sha.Sum(cp.sum[:0])
	if n != e.Size || (!streamed && hex.EncodeToString(sum) != e.SHA256) {
		return n, nil, 0, nil, fmt.Errorf("send %q: %w", e.Path, ErrChanged)
	}
	// A file that grew while it was read has a larger size now. When streamed, nothing checks the
	// content against an earlier hash either: a file rewritten while it was read would be sent
	// torn, with a hash that matches the tear. Its stat tells.
	after, err := f.Stat()
	if err != nil || after.Size() != e.Size || (streamed && !sameStat(fi, after)) {
		return n, nil, 0, nil, fmt.Errorf("send %q: %w", e.Path, ErrChanged)
	}
	var check uint64
	if streamed {
		check = cp.tee.x.Sum64()
	}
	return n, sum, check, fi, nil
}

// sameStat reports whether two stats of one open file show no change: size, mtime and, where the
// platform has it, ctime.
func sameStat(a, b fs.FileInfo) bool {
	if a.Size() != b.Size() || !a.ModTime().Equal(b.ModTime()) {
		return false
	}
	_, ca := manifest.StatKey(a)
	_, cb := manifest.StatKey(b)
	return ca == cb // both 0 where the platform's ctime is not read
}

// Limits bound an archive read from elsewhere. Zero fields take DefaultLimits: those of an
// archive from a box.
type Limits struct {
	// MaxEntries bounds entries plus deletions; default 200,000.
	MaxEntries int
	// MaxFileSize bounds one file; default 1 GiB.
	MaxFileSize int64
	// MaxTotalSize bounds all file content; default 4 GiB.
	MaxTotalSize int64
	// MaxPlanBytes bounds the plan at the head of the archive; default 64 MiB.
	MaxPlanBytes int64
}

// DefaultLimits are used for zero fields: the gateway's bounds on what a box sends back (a
// pull-back's changed files). $(go env GOROOT)/src, a large source tree, is 11,500 files and
// 15,000 entries, 121 MB, with a plan of 2.3 MB: it fits thirteen times over in entries and 33
// times in content, while a hostile box can make the gateway stage no more than 4 GiB and decode
// no more than a 64 MiB plan (about 50 MB of heap at the entry bound). A profile raises them
// for a larger tree (sync.maxInboundBytes, sync.maxInboundEntries, sync.maxInboundFileBytes:
// InboundLimits).
var DefaultLimits = Limits{MaxEntries: 200_000, MaxFileSize: 1 << 30, MaxTotalSize: 4 << 30, MaxPlanBytes: manifest.DefaultLimits.MaxBytes}

// TrustedLimits bound an archive that the gateway wrote: its copy of a workspace into an anchor,
// a checkpoint restored, and what a box unpacks from the gateway. They are the user's own
// workspace, which may be far larger than what a box may send back.
var TrustedLimits = Limits{MaxEntries: 1_000_000, MaxFileSize: 8 << 30, MaxTotalSize: 64 << 30, MaxPlanBytes: 256 << 20}

// InboundLimits are the bounds of an archive and a manifest from a box under a profile's inbound
// quotas (sync.maxInboundBytes, sync.maxInboundEntries, sync.maxInboundFileBytes; zero takes
// the default). The plan's and the manifest's byte bounds grow with the entry bound
// (manifest.ScaledBytes).
func InboundLimits(maxBytes int64, maxEntries int, maxFileBytes int64) (Limits, manifest.Limits) {
	l := Limits{MaxEntries: maxEntries, MaxFileSize: maxFileBytes, MaxTotalSize: maxBytes}
	l.setDefaults()
	l.MaxPlanBytes = manifest.ScaledBytes(l.MaxEntries)
	return l, manifest.Limits{MaxEntries: l.MaxEntries, MaxBytes: l.MaxPlanBytes}
}

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
	// UpdateCache honours the plan's Cache (the box side only: an archive read from a box that
	// names a cache file is refused).
	UpdateCache bool
	// Space, when set, keeps room free on the filesystems the archive is written to and those
	// Space.Keep names: an archive whose content would leave less than the reserve free is
	// refused (*SpaceError) before anything is staged, and checked again before the commit.
	Space *SpaceCheck
	// Inspect, when set, sees the staged tree (staging mirrors root, holding the plan's entries)
	// once every entry is verified and before anything is committed; an error refuses the
	// archive with root untouched. Local use only: it is never sent.
	Inspect func(staging string, plan *Plan) error `json:"-"`
}

// ValidatePlan checks a plan's paths, types, order and limits, and symlink containment unless
// allowEscaping.
func ValidatePlan(p *Plan, lim Limits, allowEscaping bool) error {
	lim.setDefaults()
	if err := checkPlanVersion(p.Version); err != nil {
		return err
	}
	if len(p.Entries)+len(p.Deletes) > lim.MaxEntries {
		return refused("", "%d entries and deletions, over the limit of %d", len(p.Entries)+len(p.Deletes), lim.MaxEntries)
	}
	m := manifest.Manifest{Version: manifest.Version, Entries: p.Entries}
	validate := m.Validate
	if p.SumsLast {
		validate = m.ValidateUnhashed // the hashes come at the end: the entries must carry none
	}
	if err := validate(manifest.Limits{MaxEntries: lim.MaxEntries}); err != nil {
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
	if p.Cache != "" && (!filepath.IsAbs(p.Cache) || filepath.Clean(p.Cache) != p.Cache) {
		return refused(p.Cache, "hash cache file must be a clean absolute path")
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

func checkPlanVersion(v int) error {
	if v != PlanVersion {
		return refused("", "plan version %d not supported (this openclaw reads version %d: the gateway's and the box's openclaw are different builds)", v, PlanVersion)
	}
	return nil
}

func samePlan(a, b *Plan) bool {
	if a.SumsLast || b.SumsLast {
		return false
	}
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

package manifest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path"
	"sort"
	"strings"
	"unicode/utf8"

	"github.com/openclaw/cloudworkers/internal/untrusted"
)

// Version is the manifest format version.
const Version = 1

// Type is the kind of a manifest entry.
type Type string

// Entry types. Devices, FIFOs and sockets are never part of a manifest.
const (
	TypeFile    Type = "file"
	TypeDir     Type = "dir"
	TypeSymlink Type = "symlink"
)

// Valid reports whether t is one of the three entry types.
func (t Type) Valid() bool { return t == TypeFile || t == TypeDir || t == TypeSymlink }

// Entry is one path of a tree.
type Entry struct {
	// Path is relative to the root, slash-separated and clean.
	Path string `json:"path"`
	Type Type   `json:"type"`
	// Mode holds the permission bits only (0 to 0777).
	Mode uint32 `json:"mode"`
	// Size, MTime (Unix nanoseconds) and SHA256 (hex) are set for files only.
	Size   int64  `json:"size,omitempty"`
	MTime  int64  `json:"mtime,omitempty"`
	SHA256 string `json:"sha256,omitempty"`
	// Target is a symlink's target, as stored in the link.
	Target string `json:"target,omitempty"`
}

// Same reports whether e and o describe the same content: type, mode, and the hash (files) or
// target (symlinks). MTime is not content.
func (e Entry) Same(o Entry) bool {
	if e.Type != o.Type || e.Mode != o.Mode {
		return false
	}
	switch e.Type {
	case TypeFile:
		return e.SHA256 == o.SHA256 && e.Size == o.Size
	case TypeSymlink:
		return e.Target == o.Target
	}
	return true
}

// Manifest is a whole tree: entries sorted by path, each path once.
type Manifest struct {
	Version int `json:"version"`
	// BaseCommit is the commit the tree was synced at (git mode), or "".
	BaseCommit string `json:"baseCommit,omitempty"`
	// SnapshotOf is the user's HEAD when BaseCommit is the snapshot commit of their uncommitted
	// work on top of it (git mode, a dispatch from a dirty checkout), or "".
	SnapshotOf string  `json:"snapshotOf,omitempty"`
	Entries    []Entry `json:"entries"`
}

// Sort orders the entries by path.
func (m *Manifest) Sort() {
	sort.Slice(m.Entries, func(i, j int) bool { return m.Entries[i].Path < m.Entries[j].Path })
}

// Index maps each path to its entry.
func (m *Manifest) Index() map[string]Entry {
	idx := make(map[string]Entry, len(m.Entries))
	for _, e := range m.Entries {
		idx[e.Path] = e
	}
	return idx
}

// Files counts the file and symlink entries.
func (m *Manifest) Files() int {
	n := 0
	for _, e := range m.Entries {
		if e.Type != TypeDir {
			n++
		}
	}
	return n
}

// TotalSize sums the sizes of the file entries.
func (m *Manifest) TotalSize() int64 {
	var n int64
	for _, e := range m.Entries {
		n += e.Size
	}
	return n
}

// Encode writes m as JSON.
func (m *Manifest) Encode(w io.Writer) error {
	enc := json.NewEncoder(w)
	return enc.Encode(m)
}

// Changes is what turns one tree into another.
type Changes struct {
	// Added and Changed hold the entries of the other tree; Deleted those of the base.
	Added, Changed, Deleted []Entry
}

// Empty reports whether there is nothing to do.
func (c Changes) Empty() bool { return len(c.Added)+len(c.Changed)+len(c.Deleted) == 0 }

// Send is what has to be transferred: Added and Changed, sorted by path.
func (c Changes) Send() []Entry {
	out := append(append([]Entry(nil), c.Added...), c.Changed...)
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out
}

// DeletePaths lists the deleted paths, plus the changed paths whose type changed (the old
// entry has to go before the new one can be written), sorted.
func (c Changes) DeletePaths(base *Manifest) []string {
	var out []string
	for _, e := range c.Deleted {
		out = append(out, e.Path)
	}
	if base != nil {
		idx := base.Index()
		for _, e := range c.Changed {
			if old, ok := idx[e.Path]; ok && old.Type != e.Type {
				out = append(out, e.Path)
			}
		}
	}
	sort.Strings(out)
	return out
}

// Paths lists the paths of entries.
func Paths(entries []Entry) []string {
	out := make([]string, len(entries))
	for i, e := range entries {
		out[i] = e.Path
	}
	return out
}

// Diff compares base with other. Both must be sorted.
func Diff(base, other *Manifest) Changes {
	var c Changes
	a, b := base.Entries, other.Entries
	i, j := 0, 0
	for i < len(a) || j < len(b) {
		switch {
		case j == len(b) || (i < len(a) && a[i].Path < b[j].Path):
			c.Deleted = append(c.Deleted, a[i])
			i++
		case i == len(a) || b[j].Path < a[i].Path:
			c.Added = append(c.Added, b[j])
			j++
		default:
			if !a[i].Same(b[j]) {
				c.Changed = append(c.Changed, b[j])
			}
			i++
			j++
		}
	}
	return c
}

// Limits bound a manifest read from a box.
type Limits struct {
	// MaxBytes bounds the encoded manifest; default 64 MiB.
	MaxBytes int64
	// MaxEntries bounds the number of entries; default 200,000.
	MaxEntries int
}

// DefaultLimits are the limits used when a field is zero: those of a manifest read from a box.
// The manifest of $(go env GOROOT)/src (about 15,000 entries) takes 2.3 MB, about 150 bytes an
// entry: 200,000 entries of a tree with paths twice as long fit in 64 MiB. Decoded, an entry
// takes about 250 bytes of heap, so a manifest at both limits costs about 50 MB while it is
// read; a tree beyond them needs its profile's sync.maxInboundFiles raised.
var DefaultLimits = Limits{MaxBytes: 64 << 20, MaxEntries: 200_000}

// TrustedLimits bound a manifest the gateway wrote itself (the base manifest of a workspace, a
// checkpoint's), which may describe a tree far larger than what a box may send back.
var TrustedLimits = Limits{MaxBytes: 256 << 20, MaxEntries: 1_000_000}

// BytesPerEntry is the encoded size per entry that a manifest or plan may take on average when
// its entry bound is raised past the default (see ScaledBytes).
const BytesPerEntry = 320

// ScaledBytes is the byte bound that goes with an entry bound: DefaultLimits.MaxBytes, or
// BytesPerEntry per entry when that is more.
func ScaledBytes(entries int) int64 {
	return max(DefaultLimits.MaxBytes, int64(entries)*BytesPerEntry)
}

func (l *Limits) setDefaults() {
	if l.MaxBytes <= 0 {
		l.MaxBytes = DefaultLimits.MaxBytes
	}
	if l.MaxEntries <= 0 {
		l.MaxEntries = DefaultLimits.MaxEntries
	}
}

// ErrTooLarge is returned for a manifest over its byte or entry limit.
var ErrTooLarge = errors.New("manifest over limit")

// PathError names the offending path of a refused manifest or archive.
type PathError struct {
	Path   string
	Reason string
}

func (e *PathError) Error() string { return fmt.Sprintf("refused path %q: %s", e.Path, e.Reason) }

// Decode reads a manifest strictly: bounded size and entry count, no unknown or repeated fields,
// the version first, no trailing data, and every entry valid (see Validate). It decodes as it
// reads (JSONStream), one entry at a time: the version is checked before any entry is read, and
// a manifest is refused as soon as it passes either bound, having cost no more than the bound.
func Decode(r io.Reader, lim Limits) (*Manifest, error) {
	lim.setDefaults()
	s := NewJSONStream(r, lim.MaxBytes)
	var m Manifest
	err := s.Object("version", func(key string) error {
		switch key {
		case "version":
			if err := s.Value(&m.Version); err != nil {
				return err
			}
			if m.Version != Version {
				return fmt.Errorf("manifest version %d not supported", m.Version)
			}
			return nil
		case "baseCommit":
			return s.Value(&m.BaseCommit)
		case "snapshotOf":
			return s.Value(&m.SnapshotOf)
		case "entries":
			var err error
			m.Entries, err = s.Entries(lim.MaxEntries, func() error {
				return fmt.Errorf("%w: more than %d entries", ErrTooLarge, lim.MaxEntries)
			})
			return err
		}
		return fmt.Errorf("unknown field %q", key)
	})
	if err == nil {
		err = s.End()
	}
	if err != nil {
		return nil, fmt.Errorf("decode manifest: %w", err)
	}
	if err := m.Validate(lim); err != nil {
		return nil, err
	}
	return &m, nil
}

// DecodeBytes is Decode of a byte slice.
func DecodeBytes(b []byte, lim Limits) (*Manifest, error) {
	lim.setDefaults()
	if int64(len(b)) > lim.MaxBytes {
		return nil, fmt.Errorf("decode manifest: %w: more than %d bytes", ErrTooLarge, lim.MaxBytes)
	}
	return Decode(bytes.NewReader(b), lim)
}

// JSONStream decodes one JSON document read from a box (a manifest, a sync plan) token by token,
// within a byte bound: the caller's callbacks see each field and each array element as it
// arrives, and count them, so that a document is refused as soon as it passes a bound, without
// having been read or decoded whole. Object keys are matched exactly and each may come once.
type JSONStream struct {
	dec *json.Decoder
}

// NewJSONStream reads a document of at most maxBytes from r. Reading past maxBytes fails with
// ErrTooLarge (wrapped).
func NewJSONStream(r io.Reader, maxBytes int64) *JSONStream {
	dec := json.NewDecoder(&boundedReader{r: r, n: maxBytes, max: maxBytes})
	dec.DisallowUnknownFields()
	return &JSONStream{dec: dec}
}

// Object reads an object whose first key must be first (a format's version, which field can
// check before anything else is read). field is called for each key and must consume its value
// (Value, Array) or fail.
func (s *JSONStream) Object(first string, field func(key string) error) error {
	if err := s.delim('{'); err != nil {
		return err
	}
	seen := map[string]bool{}
	for s.dec.More() {
		t, err := s.dec.Token()
		if err != nil {
			return err
		}
		key, ok := t.(string)
		if !ok {
			return fmt.Errorf("object key %v is not a string", t)
		}
		if len(seen) == 0 && key != first {
			return fmt.Errorf("%q must be the first field, found %q", first, key)
		}
		if seen[key] {
			return fmt.Errorf("field %q repeated", key)
		}
		seen[key] = true
		if err := field(key); err != nil {
			return err
		}
	}
	if len(seen) == 0 {
		return fmt.Errorf("no %q field", first)
	}
	return s.delim('}')
}

// Array reads an array (null is an empty one), calling each for every element, which must
// consume it (Value) or fail.
func (s *JSONStream) Array(each func() error) error {
	t, err := s.dec.Token()
	if err != nil {
		return err
	}
	if t == nil {
		return nil
	}
	if t != json.Delim('[') {
		return fmt.Errorf("found %v where an array was expected", t)
	}
	for s.dec.More() {
		if err := each(); err != nil {
			return err
		}
	}
	return s.delim(']')
}

// entryChunk is how many entries Entries decodes into one block: a slice grown by append to n
// entries would allocate about five times their size on the way (large slices grow by a quarter),
// blocks and the final copy twice.
const entryChunk = 1024

// Entries reads an array of entries (null is none) and returns them; past max entries it fails
// with over's error, having decoded no more than max.
func (s *JSONStream) Entries(max int, over func() error) ([]Entry, error) {
	var chunks [][]Entry
	cur := make([]Entry, 0, entryChunk)
	n := 0
	err := s.Array(func() error {
		if n == max {
			return over()
		}
		if len(cur) == cap(cur) {
			chunks = append(chunks, cur)
			cur = make([]Entry, 0, entryChunk)
		}
		cur = append(cur, Entry{})
		n++
		return s.Value(&cur[len(cur)-1])
	})
	if err != nil {
		return nil, err
	}
	if len(chunks) == 0 {
		return cur, nil
	}
	out := make([]Entry, 0, n)
	for _, c := range chunks {
		out = append(out, c...)
	}
	return append(out, cur...), nil
}

// Value decodes the next value into v (strictly: no unknown fields).
func (s *JSONStream) Value(v any) error { return s.dec.Decode(v) }

// End checks that nothing but white space follows the document.
func (s *JSONStream) End() error {
	if _, err := s.dec.Token(); err != io.EOF {
		if err != nil && errors.Is(err, ErrTooLarge) {
			return err
		}
		return errors.New("trailing data")
	}
	return nil
}

func (s *JSONStream) delim(d json.Delim) error {
	t, err := s.dec.Token()
	if err != nil {
		return err
	}
	if t != d {
		return fmt.Errorf("found %v where %v was expected", t, d)
	}
	return nil
}

// boundedReader reads at most max bytes of r; one more fails with ErrTooLarge.
type boundedReader struct {
	r      io.Reader
	n, max int64
}

func (b *boundedReader) Read(p []byte) (int, error) {
	if b.n <= 0 {
		var one [1]byte
		n, err := b.r.Read(one[:])
		if n > 0 {
			return 0, fmt.Errorf("%w: more than %d bytes", ErrTooLarge, b.max)
		}
		return 0, err
	}
	if int64(len(p)) > b.n {
		p = p[:b.n]
	}
	n, err := b.r.Read(p)
	b.n -= int64(n)
	return n, err
}

// maxPath bounds one path or symlink target.
const maxPath = 4096

// ValidPath checks that p is a clean relative slash path inside the root: not empty, not ".", no
// control character (C0, DEL or C1: a name that could rewrite a terminal or a log line when it
// is shown), not absolute, no ".." component, no ".git" component (nothing may write into a
// repository's metadata), valid UTF-8.
func ValidPath(p string) error {
	switch {
	case p == "" || p == ".":
		return &PathError{p, "empty path"}
	case len(p) > maxPath:
		return &PathError{p[:64] + "…", "path too long"}
	case !utf8.ValidString(p):
		return &PathError{p, "path is not UTF-8"}
	case HasControl(p):
		return &PathError{p, "control character in path"}
	case strings.HasPrefix(p, "/"):
		return &PathError{p, "absolute path"}
	}
	for rest := p; ; {
		c, more, found := strings.Cut(rest, "/")
		if c == ".." {
			return &PathError{p, "path escapes the root (..)"}
		}
		if len(c) == 4 && strings.EqualFold(c, ".git") {
			return &PathError{p, "path inside .git"}
		}
		if !found {
			break
		}
		rest = more
	}
	if path.Clean(p) != p {
		return &PathError{p, "path is not clean"}
	}
	return nil
}

// HasControl reports whether the UTF-8 string s holds a control character: U+0000–U+001F,
// U+007F or U+0080–U+009F.
func HasControl(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < 0x20 || c == 0x7f || (c == 0xc2 && i+1 < len(s) && s[i+1] >= 0x80 && s[i+1] <= 0x9f) {
			return true
		}
	}
	return false
}

// Carriable reports whether a manifest can carry the name p (which ValidPath checks in full):
// valid UTF-8 without control characters. Build leaves other names out (Stats.Skipped).
func Carriable(p string) bool { return utf8.ValidString(p) && !HasControl(p) }

// Printable is p as Build lists it among the names it skipped: invalid UTF-8 and control
// characters replaced by '?'.
func Printable(p string) string { return untrusted.Path(p) }

// SymlinkInside reports whether a symlink at linkPath with target stays inside the root whatever
// the tree holds: the target is relative, and its ".." components all come first and climb no
// higher than the link's own directory depth. (A ".." after a name could climb out through a
// symlink to a shallower directory, so it is refused.)
func SymlinkInside(linkPath, target string) bool {
	if target == "" || strings.HasPrefix(target, "/") || strings.IndexByte(target, 0) >= 0 {
		return false
	}
	depth := strings.Count(linkPath, "/") // directories above the link
	up, named := 0, false
	for _, c := range strings.Split(target, "/") {
		switch c {
		case "", ".":
		case "..":
			if named {
				return false
			}
			up++
		default:
			named = true
		}
	}
	return up <= depth
}

// ValidateEntry checks one entry's fields.
func ValidateEntry(e Entry) error {
	if err := ValidPath(e.Path); err != nil {
		return err
	}
	if !e.Type.Valid() {
		return &PathError{e.Path, fmt.Sprintf("type %q not allowed", e.Type)}
	}
	if e.Mode > 0o777 {
		return &PathError{e.Path, fmt.Sprintf("mode %o not allowed", e.Mode)}
	}
	switch e.Type {
	case TypeFile:
		if e.Size < 0 {
			return &PathError{e.Path, "negative size"}
		}
		if len(e.SHA256) != 64 || !isLowerHex(e.SHA256) {
			return &PathError{e.Path, "invalid sha256"}
		}
		if e.Target != "" {
			return &PathError{e.Path, "file with a symlink target"}
		}
	case TypeSymlink:
		if e.Target == "" || len(e.Target) > maxPath || !Carriable(e.Target) {
			return &PathError{e.Path, fmt.Sprintf("invalid symlink target %q (empty, too long, not UTF-8 or with a control character)", e.Target)}
		}
		if e.Size != 0 || e.SHA256 != "" {
			return &PathError{e.Path, "symlink with content"}
		}
	case TypeDir:
		if e.Size != 0 || e.SHA256 != "" || e.Target != "" {
			return &PathError{e.Path, "directory with content"}
		}
	}
	return nil
}

// isLowerHex reports whether s is hex of whole bytes, in lower case.
func isLowerHex(s string) bool {
	if len(s)%2 != 0 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// Validate checks the version, the entry count, every entry, strict path order, and that no
// entry lies below a file or symlink entry.
func (m *Manifest) Validate(lim Limits) error { return m.validate(lim, false) }

// ValidateUnhashed is Validate of a manifest whose file entries carry no sha256 yet (a streamed
// plan's, whose hashes come after the content); it refuses one that does.
func (m *Manifest) ValidateUnhashed(lim Limits) error { return m.validate(lim, true) }

func (m *Manifest) validate(lim Limits, unhashed bool) error {
	lim.setDefaults()
	if m.Version != Version {
		return fmt.Errorf("manifest version %d not supported", m.Version)
	}
	if len(m.Entries) > lim.MaxEntries {
		return fmt.Errorf("manifest: %w: %d entries", ErrTooLarge, len(m.Entries))
	}
	if m.SnapshotOf != "" && (len(m.SnapshotOf) < 40 || len(m.SnapshotOf) > 64 || !isLowerHex(m.SnapshotOf)) {
		return errors.New("manifest: invalid snapshotOf commit")
	}
	if m.BaseCommit != "" && (len(m.BaseCommit) < 40 || len(m.BaseCommit) > 64 || !isLowerHex(m.BaseCommit)) {
		return errors.New("manifest: invalid base commit")
	}
	types := make(map[string]Type, len(m.Entries))
	for i, e := range m.Entries {
		if unhashed && e.Type == TypeFile {
			if e.SHA256 != "" {
				return &PathError{e.Path, "hash before the content"}
			}
			e.SHA256 = placeholderSum
		}
		if err := ValidateEntry(e); err != nil {
			return err
		}
		if i > 0 && m.Entries[i-1].Path >= e.Path {
			return &PathError{e.Path, "entries not sorted or duplicated"}
		}
		types[e.Path] = e.Type
	}
	// No entry below a file or symlink. An entry whose nearest listed ancestor is a directory is
	// fine, for that directory's own nearest listed ancestor is checked in its turn: one lookup
	// per entry when, as usual, every directory is listed.
	for _, e := range m.Entries {
		for d := path.Dir(e.Path); d != "."; d = path.Dir(d) {
			if t, ok := types[d]; ok {
				if t != TypeDir {
					return &PathError{e.Path, fmt.Sprintf("parent %q is a %s", d, t)}
				}
				break
			}
		}
	}
	return nil
}

// placeholderSum stands in for the hash an unhashed file entry does not carry yet.
var placeholderSum = strings.Repeat("0", 64)

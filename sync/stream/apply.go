package stream

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"math/bits"
	"os"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"sync"
	"syscall"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/klauspost/compress/zstd"
	"golang.org/x/sync/errgroup"
	"golang.org/x/sync/semaphore"

	"github.com/openclaw/cloudworkers/sync/manifest"
)

const (
	// applyWorkers bounds the goroutines that create staged files. File creation is bound by the
	// filesystem's latency rather than by CPU, so this is well above GOMAXPROCS.
	applyWorkers = 16
	// smallFile: files up to this size are read into memory and handed to a worker; larger ones
	// are written by the reading goroutine as they stream in.
	smallFile = 1 << maxDataShift
	// maxInFlight bounds the bytes of small files read but not written yet.
	maxInFlight = 64 << 20
)

// Apply reads an archive from r and applies it below root. It first reads the whole archive into
// a staging directory, checking every entry against the plan at its head (paths, types, sizes,
// sha256, limits, symlink containment) and the target for symlinked or mismatched parents; any
// violation, and any truncated or corrupt input, returns a *RefusedError (or the read error) with
// root untouched. Only then are deletions made and staged entries renamed into place.
//
// The staging directory mirrors the tree. It lives inside root when root exists; when root does
// not exist yet (an initial sync), it is a sibling of root that becomes root with one rename.
// Files are created by a bounded pool of goroutines, each file's content checked before it is
// written: against its entry's sha256 or, in a streamed archive, against the XXH64 that the
// sums entry at its end records with the file's sha256 (see sumsName).
func Apply(ctx context.Context, r io.Reader, root string, opts ApplyOptions) (Stats, error) {
	return ApplyParts(ctx, []io.Reader{r}, root, opts)
}

// ApplyParts is Apply for one sync carried by several archives read at once, each a part
// (Plan.Part of Plan.Parts) whose entries follow the previous part's in the whole plan. Every
// part's plan is read and the whole plan checked before anything is written; the parts are staged
// together, in parallel, and committed once, only when every part verified. A part that fails
// stops the others: each stops at its next entry, and readers that are io.Closers are closed
// (which ends a read in progress on a polled stream; a blocking read, as of a box's pipes, ends
// with the stream's next data or its end). Apply is ApplyParts of one archive.
func ApplyParts(ctx context.Context, rs []io.Reader, root string, opts ApplyOptions) (Stats, error) {
	opts.Limits.setDefaults()
	type part struct {
		zr   *zstd.Decoder
		tr   *tar.Reader
		plan *Plan
		base int
	}
	parts := make([]*part, len(rs))
	for i, r := range rs {
		zr, err := zstd.NewReader(r, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxMemory(1<<30), zstd.WithDecoderMaxWindow(128<<20))
		if err != nil {
			return Stats{}, err
		}
		defer zr.Close()
		parts[i] = &part{zr: zr, tr: tar.NewReader(zr)}
	}
	// The parts' plans are read at once: each arrives on its own channel. A refused one closes
	// the others' readers (as above; the first error is the one returned).
	var pg sync.WaitGroup
	var planErr error
	var planOnce sync.Once
	for _, p := range parts {
		pg.Go(func() {
			var err error
			if p.plan, err = readPlan(p.tr, opts); err != nil {
				planOnce.Do(func() {
					planErr = err
					closeReaders(rs)
				})
			}
		})
	}
	pg.Wait()
	if planErr != nil {
		return Stats{}, planErr
	}
	plan, err := wholePlan(len(rs), func(i int) *Plan { return parts[i].plan }, opts)
	if err != nil {
		return Stats{}, err
	}
	slices.SortFunc(parts, func(a, b *part) int { return a.plan.Part - b.plan.Part })
	for i := 1; i < len(parts); i++ {
		parts[i].base = parts[i-1].base + len(parts[i-1].plan.Entries)
	}

	cold := false
	fi, err := os.Lstat(root)
	switch {
	case errors.Is(err, os.ErrNotExist):
		cold = true
	case err != nil:
		return Stats{}, err
	case !fi.IsDir():
		return Stats{}, fmt.Errorf("apply archive: %s is not a directory", root)
	}
	stageIn := root
	if cold {
		stageIn = filepath.Dir(root)
	}
	if opts.Space != nil {
		// Refused before anything is staged: the content would not leave the reserve free.
		if err := opts.Space.check(existingDir(stageIn), spaceNeeded(plan)); err != nil {
			return Stats{}, err
		}
	}
	if cold {
		if err := os.MkdirAll(stageIn, 0o755); err != nil {
			return Stats{}, err
		}
	}
	staging, err := os.MkdirTemp(stageIn, manifest.StagingPrefix+"*")
	if err != nil {
		return Stats{}, err
	}
	defer os.RemoveAll(staging)

	s := &stager{staging: staging, fsync: opts.Fsync, inFlight: semaphore.NewWeighted(maxInFlight)}
	if plan.SumsLast {
		s.checks, s.sums = make([]uint64, len(plan.Entries)), make([]string, len(plan.Entries))
	}
	if plan.Cache != "" && cold {
		// Renaming the staging directory into place changes no file's ctime, so the stats taken
		// while staging stay valid; below an existing root every file is renamed (stat after).
		s.stats = make([]fileStat, len(plan.Entries))
	}
	pctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if len(rs) > 1 {
		// A part blocked reading its stream would not see the others fail: close the streams.
		// That ends a read in progress on a stream the runtime polls; a box's pipes are read with
		// blocking reads, which end with the next data or the stream's end.
		stop := context.AfterFunc(pctx, func() { closeReaders(rs) })
		defer stop()
	}
	stats := make([]Stats, len(parts))
	var g errgroup.Group
	var firstMu sync.Mutex
	var first error // the part that failed first: the others fail because it stopped them
	for k, p := range parts {
		g.Go(func() error {
			st, err := s.stage(pctx, p.tr, p.plan, p.base)
			// The zstd stream must end cleanly too: a truncated or corrupt tail is refused.
			if err == nil {
				if n, cerr := io.Copy(io.Discard, io.LimitReader(p.zr, 1<<20)); cerr != nil || n >= 1<<20 {
					err = refused("", "corrupt or overlong archive tail")
				}
			}
			stats[k] = st
			if err != nil {
				firstMu.Lock()
				if first == nil {
					first = err
				}
				firstMu.Unlock()
				cancel()
			}
			return err
		})
	}
	err = g.Wait()
	if first != nil {
		err = first
	}
	var st Stats
	for _, x := range stats {
		st.add(x)
	}
	if err != nil {
		return st, err
	}
	if plan.SumsLast {
		for i, e := range plan.Entries {
			if e.Type == manifest.TypeFile {
				plan.Entries[i].SHA256 = s.sums[i] // every one checked against the sums
			}
		}
	}
	if !cold {
		if err := checkTarget(root, plan); err != nil {
			return st, err
		}
	}
	if opts.Space != nil {
		// Checked again now that the content is staged (other writers may have filled the
		// filesystem meanwhile): a refusal removes the staging, which gives its room back.
		if err := opts.Space.check(staging, 0); err != nil {
			return st, err
		}
	}
	if opts.Inspect != nil {
		// Every entry is staged and verified: the caller looks at the content before any of it
		// is committed (a refusal removes the staging, leaving root untouched).
		if err := opts.Inspect(staging, plan); err != nil {
			return st, err
		}
	}
	st.Deleted = len(plan.Deletes)
	if cold {
		// Every staged file's stat was taken while staging and stays valid through the commit
		// (renaming the staging directory changes no file's ctime): the box's hash cache is
		// filled while the tree is committed, and written once the commit succeeded.
		var cache *manifest.Cache
		var pending []int
		var filled sync.WaitGroup
		if plan.Cache != "" {
			filled.Go(func() { cache, pending = cacheFromStats(plan, s.stats) })
		}
		err = commitCold(root, staging, plan, opts.Fsync)
		filled.Wait()
		if err == nil && cache != nil {
			err = saveCache(ctx, cache, root, plan, pending)
		}
		return st, err
	}
	if err := commit(ctx, root, staging, plan, opts.Fsync); err != nil {
		return st, err
	}
	if plan.Cache != "" {
		cache, pending := cacheFromStats(plan, s.stats)
		if err := saveCache(ctx, cache, root, plan, pending); err != nil {
			return st, err
		}
	}
	return st, nil
}

// existingDir is d or its nearest ancestor that exists.
func existingDir(d string) string {
	for {
		if _, err := os.Stat(d); err == nil || filepath.Dir(d) == d {
			return d
		}
		d = filepath.Dir(d)
	}
}

// closeReaders closes the readers that are io.Closers.
func closeReaders(rs []io.Reader) {
	for _, r := range rs {
		if c, ok := r.(io.Closer); ok {
			_ = c.Close()
		}
	}
}

// wholePlan checks that n part plans make one sync — parts 0..n-1 each once, of n, all streamed
// or none, deletions and the hash cache in part 0 only — and returns it, checked as a whole (the
// parts' entries in order and unique across them, the limits over all of them). One archive is
// its own whole.
func wholePlan(n int, part func(int) *Plan, opts ApplyOptions) (*Plan, error) {
	if n == 1 {
		p := part(0)
		if p.Parts > 1 || p.Part != 0 {
			return nil, refused("", "part %d of %d read alone", p.Part, p.Parts)
		}
		return p, nil
	}
	if opts.Expect != nil {
		return nil, refused("", "a sync in parts where one archive was requested")
	}
	byPart := make([]*Plan, n)
	for i := range n {
		p := part(i)
		if p.Parts != n || p.Part < 0 || p.Part >= n {
			return nil, refused("", "part %d of %d where %d parts were read", p.Part, p.Parts, n)
		}
		if byPart[p.Part] != nil {
			return nil, refused("", "part %d read twice", p.Part)
		}
		if p.SumsLast != part(0).SumsLast || (p.Part > 0 && (len(p.Deletes) > 0 || p.Cache != "")) {
			return nil, refused("", "part %d does not match part 0 (streamed, deletions, hash cache)", p.Part)
		}
		byPart[p.Part] = p
	}
	whole := &Plan{Version: PlanVersion, Deletes: byPart[0].Deletes, Cache: byPart[0].Cache, SumsLast: byPart[0].SumsLast}
	for _, p := range byPart {
		whole.Entries = append(whole.Entries, p.Entries...)
	}
	if err := ValidatePlan(whole, opts.Limits, opts.AllowEscapingSymlinks); err != nil {
		return nil, err
	}
	return whole, nil
}

// readPlan reads and checks the plan at the head of an archive.
func readPlan(tr *tar.Reader, opts ApplyOptions) (*Plan, error) {
	h, err := tr.Next()
	if err != nil {
		return nil, refused("", "read plan: %v", err)
	}
	if h.Name != headerName || h.Typeflag != tar.TypeReg || h.Size < 0 {
		return nil, refused(h.Name, "archive does not start with a plan")
	}
	if h.Size > opts.MaxPlanBytes {
		return nil, refused("", "plan of %d bytes is over the limit of %d", h.Size, opts.MaxPlanBytes)
	}
	plan, err := decodePlan(tr, opts.Limits, opts.Expect)
	if err != nil {
		return nil, err
	}
	if err := ValidatePlan(plan, opts.Limits, opts.AllowEscapingSymlinks); err != nil {
		return nil, err
	}
	if plan.Cache != "" && !opts.UpdateCache {
		return nil, refused(plan.Cache, "archive names a hash cache file")
	}
	if plan.SumsLast && opts.Expect != nil {
		return nil, refused("", "a streamed archive where a planned one was requested")
	}
	if opts.Expect != nil && !samePlan(plan, opts.Expect) {
		return nil, refused("", "archive does not carry the requested plan")
	}
	return plan, nil
}

// decodePlan decodes a plan as it reads it (manifest.JSONStream): the version first, checked
// before anything else is read, then the entries and deletions counted as they arrive, refused
// as soon as they pass lim.MaxEntries (or, with expect, the requested plan's counts) or the
// plan passes lim.MaxPlanBytes. A hostile plan costs no more than the bounds, whatever its size.
// The plan's other checks are ValidatePlan's.
func decodePlan(r io.Reader, lim Limits, expect *Plan) (*Plan, error) {
	lim.setDefaults()
	maxEntries, maxDeletes := lim.MaxEntries, lim.MaxEntries
	if expect != nil {
		maxEntries, maxDeletes = min(maxEntries, len(expect.Entries)), min(maxDeletes, len(expect.Deletes))
	}
	over := func(what string) func() error {
		return func() error {
			if expect != nil {
				return refused("", "archive does not carry the requested plan (more %s than requested)", what)
			}
			return refused("", "more than %d entries and deletions, over the limit", lim.MaxEntries)
		}
	}
	s := manifest.NewJSONStream(r, lim.MaxPlanBytes)
	var p Plan
	err := s.Object("version", func(key string) error {
		var err error
		switch key {
		case "version":
			if err := s.Value(&p.Version); err != nil {
				return err
			}
			return checkPlanVersion(p.Version)
		case "entries":
			p.Entries, err = s.Entries(maxEntries, over("entries"))
			return err
		case "deletes":
			return s.Array(func() error {
				if len(p.Deletes) >= min(maxDeletes, lim.MaxEntries-len(p.Entries)) {
					return over("deletions")()
				}
				p.Deletes = append(p.Deletes, "")
				return s.Value(&p.Deletes[len(p.Deletes)-1])
			})
		case "cache":
			return s.Value(&p.Cache)
		case "sumsLast":
			return s.Value(&p.SumsLast)
		case "part":
			return s.Value(&p.Part)
		case "parts":
			return s.Value(&p.Parts)
		}
		return fmt.Errorf("unknown field %q", key)
	})
	if err == nil {
		err = s.End()
	}
	var re *RefusedError
	switch {
	case errors.As(err, &re):
		return nil, err
	case errors.Is(err, manifest.ErrTooLarge):
		return nil, refused("", "plan over the limit of %d bytes", lim.MaxPlanBytes)
	case err != nil:
		return nil, refused("", "decode plan: %v", err)
	}
	return &p, nil
}

// stagedDirPerm is the mode the stager creates directories with, before the umask.
const stagedDirPerm = 0o755

// stager writes an archive's entries below a staging directory that mirrors the tree.
type stager struct {
	staging string
	fsync   bool

	dirs sync.Map // staged directory path -> *stagedDir: created once, looked up for every file
	// checks, for a streamed archive, receives the XXH64 of every staged file (by plan index),
	// to be checked against the archive's sums entry; sums then receives the files' sha256 from
	// that entry, once checked.
	checks []uint64
	sums   []string
	// stats, when the plan names a hash cache, receives the stat of every small staged file (by
	// plan index).
	stats []fileStat
	// inFlight bounds the content of small files read but not written yet, over all parts.
	inFlight *semaphore.Weighted
}

type stagedDir struct {
	once sync.Once
	err  error
}

// full is where the plan's path p (checked: clean, relative, no "..") is staged.
func (s *stager) full(p string) string {
	return s.staging + string(filepath.Separator) + filepath.FromSlash(p)
}

// dir creates the staged directory p (slash-separated, "." for the staging root) and its
// parents, once, from any goroutine.
func (s *stager) dir(p string) error {
	if p == "." {
		return nil
	}
	v, ok := s.dirs.Load(p)
	if !ok {
		v, _ = s.dirs.LoadOrStore(p, &stagedDir{})
	}
	d := v.(*stagedDir)
	d.once.Do(func() {
		if d.err = s.dir(path.Dir(p)); d.err == nil {
			d.err = os.Mkdir(s.full(p), stagedDirPerm)
		}
	})
	return d.err
}

var tarType = map[manifest.Type]byte{manifest.TypeFile: tar.TypeReg, manifest.TypeDir: tar.TypeDir, manifest.TypeSymlink: tar.TypeSymlink}

// stage reads one tar entry per plan entry, checks it against the plan and stages it. Small files
// are checked and written by a bounded pool of goroutines; stage returns once all are done.
//
// The plan's entries sit at index base of the whole sync's (a part of several), which is how the
// stager's per-entry sums and stats are indexed.
func (s *stager) stage(ctx context.Context, tr *tar.Reader, plan *Plan, base int) (Stats, error) {
	var st Stats
	g, gctx := errgroup.WithContext(ctx)
	// Entries are handed to the worker of their parent directory: creating entries in one
	// directory serialises on that directory's lock in the kernel (workers sharing one would
	// spin on it), while different directories proceed in parallel.
	shards := make([]chan func(*dirHandle) error, applyWorkers)
	for i := range shards {
		ch := make(chan func(*dirHandle) error, 64)
		shards[i] = ch
		g.Go(func() error {
			// The worker's files arrive directory by directory (sorted, sharded by parent): it
			// keeps the current one open and creates them relative to it.
			var dh dirHandle
			defer dh.close()
			for job := range ch {
				if err := job(&dh); err != nil {
					// Returning cancels gctx, which stops the reader (its sends and its wait
					// for in-flight room select on it); jobs left queued are dropped.
					return err
				}
			}
			return nil
		})
	}
	inFlight := s.inFlight
	send := func(p string, job func(*dirHandle) error) error {
		// FNV-1a of the parent directory's path.
		dir, h := path.Dir(p), uint32(2166136261)
		for i := 0; i < len(dir); i++ {
			h = (h ^ uint32(dir[i])) * 16777619
		}
		select {
		case shards[h%uint32(len(shards))] <- job:
			return nil
		case <-gctx.Done():
			return gctx.Err()
		}
	}
	var trailer []byte
	read := func() error {
		for j, e := range plan.Entries {
			i := base + j
			if err := gctx.Err(); err != nil {
				return err
			}
			h, err := tr.Next()
			if err != nil {
				return refused(e.Path, "archive ends before this entry: %v", err)
			}
			if h.Name != e.Path {
				return refused(h.Name, "entry out of plan (expected %q)", e.Path)
			}
			if h.Typeflag != tarType[e.Type] {
				return refused(h.Name, "entry type %q not allowed here (devices, FIFOs, sockets and hard links never are)", string(h.Typeflag))
			}
			switch e.Type {
			case manifest.TypeDir:
				st.Dirs++
				if err := send(e.Path, func(*dirHandle) error { return s.dir(e.Path) }); err != nil {
					return err
				}
			case manifest.TypeSymlink:
				if h.Linkname != e.Target {
					return refused(h.Name, "symlink target differs from the plan")
				}
				st.Symlinks++
				err := send(e.Path, func(*dirHandle) error {
					if err := s.dir(path.Dir(e.Path)); err != nil {
						return err
					}
					return os.Symlink(e.Target, s.full(e.Path))
				})
				if err != nil {
					return err
				}
			case manifest.TypeFile:
				if h.Size != e.Size {
					return refused(h.Name, "size %d differs from the plan (%d)", h.Size, e.Size)
				}
				if e.Size > smallFile {
					if err := s.stream(tr, e, i); err != nil {
						return err
					}
				} else {
					buf := getData(e.Size)
					if err := inFlight.Acquire(gctx, int64(cap(*buf))); err != nil {
						return err
					}
					data := (*buf)[:e.Size]
					if _, err := io.ReadFull(tr, data); err != nil {
						return refused(e.Path, "read content: %v", err)
					}
					err := send(e.Path, func(dh *dirHandle) error {
						defer func() {
							inFlight.Release(int64(cap(*buf)))
							putData(buf)
						}()
						return s.file(dh, e, data, i)
					})
					if err != nil {
						return err
					}
				}
				st.Files++
				st.Bytes += e.Size
			}
		}
		if plan.SumsLast {
			h, err := tr.Next()
			if err != nil {
				return refused("", "streamed archive ends without its sums: %v", err)
			}
			if h.Name != sumsName || h.Typeflag != tar.TypeReg || h.Size != int64(sumSize*st.Files) {
				return refused(h.Name, "entry out of plan (expected the sums of %d files)", st.Files)
			}
			trailer = make([]byte, h.Size)
			if _, err := io.ReadFull(tr, trailer); err != nil {
				return refused("", "read sums: %v", err)
			}
		}
		if _, err := tr.Next(); err != io.EOF {
			return refused("", "data after the last planned entry")
		}
		return nil
	}
	err := read()
	if err != nil && errors.Is(err, context.Canceled) && ctx.Err() == nil {
		err = nil // a worker failed and canceled gctx: Wait returns its error
	}
	for _, ch := range shards {
		close(ch)
	}
	shards = nil
	if werr := g.Wait(); err == nil {
		err = werr
	}
	if err == nil && plan.SumsLast {
		err = s.checkSums(plan, base, trailer)
	}
	return st, err
}

// Small files' contents are read into buffers taken from pools by size class (powers of two from
// 4 KiB to smallFile) and given back once written: a sync of a source tree goes through hundreds
// of MB of them, and allocating each anew cost the box's unpack about an eighth of its CPU in
// zeroing, page faults on fresh memory and garbage collection.
const (
	minDataShift = 12
	maxDataShift = 20 // smallFile
)

var dataPools [maxDataShift - minDataShift + 1]sync.Pool

func dataClass(n int64) int {
	if n <= 1<<minDataShift {
		return 0
	}
	return bits.Len64(uint64(n-1)) - minDataShift
}

// getData returns a buffer of at least n bytes (n at most smallFile).
func getData(n int64) *[]byte {
	c := dataClass(n)
	if b, ok := dataPools[c].Get().(*[]byte); ok {
		return b
	}
	b := make([]byte, 1<<(c+minDataShift))
	return &b
}

func putData(b *[]byte) { dataPools[dataClass(int64(cap(*b)))].Put(b) }

// checkSums compares every staged file of a streamed archive with its record in the sums at the
// archive's end (the XXH64 the sender computed over the bytes it sent) and takes the file's sha256
// from that record.
func (s *stager) checkSums(plan *Plan, base int, trailer []byte) error {
	k := 0
	for j, e := range plan.Entries {
		if e.Type != manifest.TypeFile {
			continue
		}
		sum, check := parseSum(trailer[k*sumSize : (k+1)*sumSize])
		k++
		if s.checks[base+j] != check {
			return refused(e.Path, "content does not match its checksum")
		}
		s.sums[base+j] = sum
	}
	return nil
}

// checker returns how a staged file's content is checked while it is written: for a streamed
// archive its XXH64, recorded for checkSums (the entry has no sum yet), else its sha256, compared
// with the entry's.
func (s *stager) checker(e manifest.Entry, i int) (hash.Hash, func() bool) {
	if s.checks != nil {
		h := xxhash.New()
		return h, func() bool { s.checks[i] = h.Sum64(); return true }
	}
	h := sha256.New()
	return h, func() bool { return hex.EncodeToString(h.Sum(nil)) == e.SHA256 }
}

// file checks a small file's content against its entry and writes it to staging, relative to
// its directory held open in dh.
func (s *stager) file(dh *dirHandle, e manifest.Entry, data []byte, i int) error {
	if s.checks != nil {
		s.checks[i] = xxhash.Sum64(data)
	} else if sum := sha256.Sum256(data); hex.EncodeToString(sum[:]) != e.SHA256 {
		return refused(e.Path, "content does not match its sha256")
	}
	dir := path.Dir(e.Path)
	if err := s.dir(dir); err != nil {
		return err
	}
	st, err := writeSmallIn(dh, s, dir, path.Base(e.Path), data, e.Mode, e.MTime, s.fsync, s.stats != nil)
	if s.stats != nil {
		s.stats[i] = st
	}
	return err
}

// fileStat is a staged file's stat, for the box's hash cache (ok false: stat it after the commit).
type fileStat struct {
	ok                 bool
	size, mtime, ctime int64
	ino                uint64
}

// stream copies a large file from the archive to staging, checking it while it is written.
func (s *stager) stream(r io.Reader, e manifest.Entry, i int) error {
	f, err := s.create(e)
	if err != nil {
		return err
	}
	h, matches := s.checker(e, i)
	n, err := io.CopyBuffer(io.MultiWriter(f, h), io.LimitReader(r, e.Size), make([]byte, 256<<10))
	switch {
	case err != nil:
		err = refused(e.Path, "read content: %v", err)
	case n != e.Size:
		err = refused(e.Path, "truncated content")
	case !matches():
		err = refused(e.Path, "content does not match its sha256")
	}
	return s.finish(f, e, i, err)
}

func (s *stager) create(e manifest.Entry) (*os.File, error) {
	if err := s.dir(path.Dir(e.Path)); err != nil {
		return nil, err
	}
	return os.OpenFile(s.full(e.Path), os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
}

// finish sets the file's final mode (and syncs it when asked), closes it and sets its mtime.
func (s *stager) finish(f *os.File, e manifest.Entry, i int, err error) error {
	if err == nil {
		err = f.Chmod(os.FileMode(e.Mode))
	}
	if err == nil && s.fsync {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		mt := time.Unix(0, e.MTime)
		_ = os.Chtimes(f.Name(), mt, mt)
		if s.stats != nil {
			// For the hash cache, like writeSmall's: taken last, so that its ctime is final.
			if fi, serr := os.Lstat(f.Name()); serr == nil {
				ino, ctime := manifest.StatKey(fi)
				s.stats[i] = fileStat{ok: ino != 0, size: fi.Size(), mtime: fi.ModTime().UnixNano(), ctime: ctime, ino: ino}
			}
		}
	}
	return err
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

// commitCold makes a staged tree that did not exist before real: directory modes (deepest
// first), then one rename of the staging directory to root.
func commitCold(root, staging string, plan *Plan, fsync bool) error {
	created, known := probedDirMode(staging, plan)
	if err := dirModes(staging, plan, created, known); err != nil {
		return err
	}
	if err := os.Chmod(staging, 0o755); err != nil {
		return err
	}
	if fsync {
		syncDir(staging)
	}
	if err := os.Rename(staging, root); err != nil {
		return fmt.Errorf("write %s: %w", root, err)
	}
	if fsync {
		syncDir(filepath.Dir(root))
	}
	return nil
}

// commit makes the checked plan real below an existing root: deletions (deepest first),
// directories, then files and symlinks renamed from staging (by the worker pool), then directory
// modes (deepest first).
func commit(ctx context.Context, root, staging string, plan *Plan, fsync bool) error {
	dels := slices.Clone(plan.Deletes)
	sort.Sort(sort.Reverse(sort.StringSlice(dels)))
	for _, d := range dels {
		if err := os.RemoveAll(filepath.Join(root, filepath.FromSlash(d))); err != nil {
			return fmt.Errorf("delete %q: %w", d, err)
		}
	}
	touched := map[string]bool{}
	for _, e := range plan.Entries {
		dst := filepath.Join(root, filepath.FromSlash(e.Path))
		if e.Type == manifest.TypeDir {
			if err := os.MkdirAll(dst, 0o700); err != nil {
				return fmt.Errorf("create %q: %w", e.Path, err)
			}
			_ = os.Chmod(dst, 0o700|os.FileMode(e.Mode)) // final mode once its content is in
			touched[dst] = true
			continue
		}
		if d := filepath.Dir(dst); !touched[d] {
			if err := os.MkdirAll(d, 0o755); err != nil {
				return err
			}
			touched[d] = true
		}
	}
	g, _ := errgroup.WithContext(ctx)
	g.SetLimit(applyWorkers)
	for _, e := range plan.Entries {
		if e.Type == manifest.TypeDir {
			continue
		}
		g.Go(func() error {
			if err := os.Rename(filepath.Join(staging, filepath.FromSlash(e.Path)), filepath.Join(root, filepath.FromSlash(e.Path))); err != nil {
				return fmt.Errorf("write %q: %w", e.Path, err)
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return err
	}
	if err := dirModes(root, plan, 0, false); err != nil {
		return err
	}
	if fsync {
		for d := range touched {
			syncDir(d)
		}
		syncDir(root)
	}
	return nil
}

// probedDirMode is the mode the stager's directories below staging were given, when it is the
// plain one mkdir gives (stagedDirPerm less the umask) and nothing else: probed on one of them, for
// a default ACL on the parent replaces the umask and a setgid parent adds its bit to every new
// directory. False: every directory's mode is to be set.
func probedDirMode(staging string, plan *Plan) (uint32, bool) {
	want, ok := stagedDirMode()
	if !ok {
		return 0, false
	}
	for _, e := range plan.Entries {
		if e.Type != manifest.TypeDir {
			continue
		}
		fi, err := os.Lstat(filepath.Join(staging, filepath.FromSlash(e.Path)))
		if err != nil || fi.Mode() != fs.ModeDir|fs.FileMode(want) {
			return 0, false
		}
		return want, true
	}
	return 0, false
}

// dirModes sets the final modes of the plan's directories below base, deepest first. With known
// set, every directory below base has mode created (probedDirMode), and those whose final mode it
// is are left alone: most of a tree's.
func dirModes(base string, plan *Plan, created uint32, known bool) error {
	for i := len(plan.Entries) - 1; i >= 0; i-- {
		e := plan.Entries[i]
		if e.Type == manifest.TypeDir && !(known && e.Mode == created) {
			if err := os.Chmod(filepath.Join(base, filepath.FromSlash(e.Path)), os.FileMode(e.Mode)); err != nil {
				return err
			}
		}
	}
	return nil
}

func syncDir(d string) {
	if f, err := os.Open(d); err == nil {
		_ = f.Sync()
		f.Close()
	}
}

// cacheFromStats loads the plan's hash cache file and adds the files the plan wrote whose stat
// was taken while staging (stats[i].ok), so that the next manifest of root (`openclaw worker
// manifest --cache`) does not re-hash them; it returns the indexes of the other files, which
// saveCache stats once they are in place. The cache file is not fsynced: losing it only costs
// re-hashing.
func cacheFromStats(plan *Plan, stats []fileStat) (c *manifest.Cache, pending []int) {
	c = manifest.LoadCache(plan.Cache)
	now := time.Now()
	for i, e := range plan.Entries {
		if e.Type != manifest.TypeFile {
			continue
		}
		if stats != nil && stats[i].ok {
			st := stats[i]
			c.RecordKey(e.Path, st.size, st.mtime, st.ctime, st.ino, e.SHA256, now)
			continue
		}
		pending = append(pending, i)
	}
	return c, pending
}

// saveCache records the pending files of the plan (by index) from their stat below root, now
// that they are there, and writes the cache.
func saveCache(ctx context.Context, c *manifest.Cache, root string, plan *Plan, pending []int) error {
	now := time.Now()
	g, _ := errgroup.WithContext(ctx)
	g.SetLimit(applyWorkers)
	for _, i := range pending {
		e := plan.Entries[i]
		g.Go(func() error {
			if fi, err := os.Lstat(filepath.Join(root, filepath.FromSlash(e.Path))); err == nil {
				c.Record(e.Path, fi, e.SHA256, now)
			}
			return nil
		})
	}
	_ = g.Wait()
	return c.SaveUnsynced(plan.Cache)
}

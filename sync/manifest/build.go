package manifest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/openclaw/cloudworkers/sync/gitexec"
)

// StagingPrefix starts the names of the staging directories that archive readers create inside
// a root; Build never lists them.
const StagingPrefix = ".openclaw-stage-"

// WorktreeIncludeFile names the file of gitignore-style patterns, at the repository root, that
// selects ignored-and-untracked files to sync in git mode.
const WorktreeIncludeFile = ".worktreeinclude"

// Mode selects which files of a root are part of its manifest.
type Mode string

const (
	// ModePlain lists every file, directory and symlink, minus the profile's exclusions.
	ModePlain Mode = "plain"
	// ModeGit lists tracked and untracked-but-not-ignored files, plus ignored-and-untracked files
	// matched by .worktreeinclude or the profile's includes, minus the profile's exclusions.
	ModeGit Mode = "git"
)

// Options configure Build.
type Options struct {
	Mode Mode
	// Exclude and Include are the profile's gitignore-style rules: a path matched by Exclude is left
	// out unless Include matches it too. In git mode Include also selects ignored files, like
	// .worktreeinclude.
	Exclude, Include []string
	// RulePrefix, when set, is where the listed tree sits in the tree the rules were written for
	// (a submodule's directory in its workspace): a path p is matched as RulePrefix/p.
	RulePrefix string
	// Cache, when set, is used and updated so that unchanged files are not re-hashed.
	Cache *Cache
	// Parallel bounds concurrent hashing; default 2×GOMAXPROCS.
	Parallel int
	// Forbidden are files and directories no listing may hold under any name (a hard link, a bind
	// mount), with what each is: a listing that meets one fails with a *ForbiddenError.
	Forbidden map[FileID]string
}

// FileID names a file whatever its path: its device and inode.
type FileID struct{ Dev, Ino uint64 }

// ForbiddenError is a listing's refusal of an entry in Options.Forbidden.
type ForbiddenError struct {
	Path, What string
}

func (e *ForbiddenError) Error() string {
	return fmt.Sprintf("%s is %s, which never leaves the gateway", Printable(e.Path), e.What)
}

// Stats report what Build did.
type Stats struct {
	Hashed, Cached int
	// Skipped names paths left out because no manifest can carry them: devices, FIFOs, sockets,
	// names (or symlink targets) that are not UTF-8 or hold control characters (listed with
	// those replaced by '?'), submodules.
	Skipped []string
}

// Build lists root according to opts. Symlinks are recorded, never followed.
func Build(ctx context.Context, root string, opts Options) (*Manifest, Stats, error) {
	l, err := List(ctx, root, opts)
	if err != nil {
		return nil, l.Stats(), err
	}
	return l.Hash(ctx)
}

// Listing is a tree listed but not hashed yet: every entry is known (path, type, mode, size,
// mtime, symlink target) except the files' content hashes.
type Listing struct{ b *builder }

// List lists root according to opts, like Build, without hashing any file.
func List(ctx context.Context, root string, opts Options) (*Listing, error) {
	if opts.Mode == "" {
		opts.Mode = ModePlain
	}
	if opts.Parallel <= 0 {
		opts.Parallel = 2 * runtime.GOMAXPROCS(0)
	}
	root, err := filepath.Abs(root)
	if err != nil {
		return &Listing{&builder{}}, err
	}
	b := &builder{
		root:    root,
		opts:    opts,
		exclude: ParseRules(opts.Exclude),
		include: ParseRules(opts.Include),
		dirs:    map[string]fs.FileInfo{},
	}
	switch opts.Mode {
	case ModePlain:
		err = b.walk(ctx)
	case ModeGit:
		err = b.git(ctx)
	default:
		err = fmt.Errorf("unknown manifest mode %q", opts.Mode)
	}
	if err != nil {
		return &Listing{b}, err
	}
	b.sort()
	return &Listing{b}, nil
}

// Stats reports what the listing skipped (and, after Hash, what was hashed).
func (l *Listing) Stats() Stats { return l.b.stats }

// Root is the absolute path of the listed tree.
func (l *Listing) Root() string { return l.b.root }

// Unhashed returns the listing as a sorted manifest whose file entries have no SHA256: what a
// streamed archive announces before its files are hashed on the way out (see the sync/stream
// package). It does not hash anything; the entries are a copy.
func (l *Listing) Unhashed() *Manifest {
	return &Manifest{Version: Version, Entries: slices.Clone(l.b.entries)}
}

// Hash fills in the files' hashes (from opts.Cache where still valid) and returns the manifest.
func (l *Listing) Hash(ctx context.Context) (*Manifest, Stats, error) {
	b := l.b
	if err := b.hash(ctx); err != nil {
		return nil, b.stats, err
	}
	m := &Manifest{Version: Version, Entries: slices.Clone(b.entries)}
	b.opts.Cache.Keep(m)
	return m, b.stats, nil
}

// sort orders the entries (and their infos) by path.
func (b *builder) sort() {
	idx := make([]int, len(b.entries))
	for i := range idx {
		idx[i] = i
	}
	sort.Slice(idx, func(i, j int) bool { return b.entries[idx[i]].Path < b.entries[idx[j]].Path })
	entries := make([]Entry, len(idx))
	infos := make([]fs.FileInfo, len(idx))
	for i, k := range idx {
		entries[i], infos[i] = b.entries[k], b.infos[k]
	}
	b.entries, b.infos = entries, infos
}

type builder struct {
	root             string
	opts             Options
	exclude, include *Rules
	entries          []Entry
	infos            []fs.FileInfo // parallel to entries, files only set
	dirs             map[string]fs.FileInfo
	stats            Stats
}

func (b *builder) excluded(p string, isDir bool) bool {
	p = b.rulePath(p)
	return b.exclude.Match(p, isDir) && !b.include.Match(p, isDir)
}

// rulePath is what the profile's rules see of the listed path p (Options.RulePrefix).
func (b *builder) rulePath(p string) string {
	if b.opts.RulePrefix != "" {
		return b.opts.RulePrefix + "/" + p
	}
	return p
}

// alwaysSkipped: repository metadata and our own staging directories (at any depth: a submodule's
// is next to it, and one can outlive a crash) are never synced, nor anything below them.
func alwaysSkipped(p string) bool {
	for rest := p; rest != ""; {
		var c string
		c, rest, _ = strings.Cut(rest, "/")
		if strings.EqualFold(c, ".git") || strings.HasPrefix(c, StagingPrefix) {
			return true
		}
	}
	return false
}

func (b *builder) add(p string, fi fs.FileInfo) error {
	if len(b.opts.Forbidden) > 0 {
		if id := IDOf(fi); id != (FileID{}) && b.opts.Forbidden[id] != "" {
			what := b.opts.Forbidden[id]
			return &ForbiddenError{Path: p, What: what}
		}
	}
	e := Entry{Path: p, Mode: uint32(fi.Mode().Perm())}
	switch {
	case fi.Mode().IsRegular():
		e.Type, e.Size, e.MTime = TypeFile, fi.Size(), fi.ModTime().UnixNano()
	case fi.Mode()&fs.ModeSymlink != 0:
		t, err := os.Readlink(filepath.Join(b.root, filepath.FromSlash(p)))
		if err != nil {
			return err
		}
		e.Type, e.Target, e.Mode = TypeSymlink, t, 0o777
		if !Carriable(t) {
			b.stats.Skipped = append(b.stats.Skipped, Printable(p))
			return nil
		}
	case fi.IsDir():
		e.Type = TypeDir
	default:
		b.stats.Skipped = append(b.stats.Skipped, p)
		return nil
	}
	b.entries = append(b.entries, e)
	b.infos = append(b.infos, fi)
	return nil
}

// walk lists the tree below b.root, several directories at a time (opts.Parallel): each
// directory is read and its entries lstat'ed by one goroutine, which hands its subdirectories to
// idle goroutines or walks them itself. The result does not depend on the order (sort runs
// after); the first error stops the walk.
func (b *builder) walk(ctx context.Context) error {
	fi, err := os.Lstat(b.root)
	if err != nil {
		return fmt.Errorf("walk %s: %w", b.root, err)
	}
	if !fi.IsDir() {
		return nil // like filepath.WalkDir: a root that is not a directory holds nothing
	}
	var (
		mu     sync.Mutex
		dirs   []string // directories not excluded themselves
		failed error
		wg     sync.WaitGroup
	)
	idle := make(chan struct{}, max(b.opts.Parallel-1, 0))
	fail := func(err error) {
		mu.Lock()
		if failed == nil {
			failed = err
		}
		mu.Unlock()
	}
	var visit func(rel string)
	visit = func(rel string) {
		mu.Lock()
		stop := failed != nil
		mu.Unlock()
		if stop {
			return
		}
		if err := ctx.Err(); err != nil {
			fail(err)
			return
		}
		full := b.root
		if rel != "" {
			full = filepath.Join(b.root, filepath.FromSlash(rel))
		}
		// What this directory adds, merged under the lock once.
		var local builder
		var localDirs, subdirs []string
		localInfos := map[string]fs.FileInfo{}
		local.root = b.root
		err := func() error {
			dir, err := os.Open(full)
			if err != nil {
				return err
			}
			defer dir.Close()
			// The entries are stat'ed relative to the open directory (lstatAt); their order does
			// not matter (sorted after the walk).
			des, err := dir.ReadDir(-1)
			if err != nil {
				return err
			}
			for _, d := range des {
				p := d.Name()
				if rel != "" {
					p = rel + "/" + p
				}
				if alwaysSkipped(p) {
					continue
				}
				if !Carriable(p) {
					local.stats.Skipped = append(local.stats.Skipped, Printable(p))
					continue
				}
				ex := b.excluded(p, d.IsDir())
				if d.IsDir() && ex && b.include.Empty() {
					continue
				}
				if !d.IsDir() && ex {
					continue
				}
				fi, err := lstatAt(dir, d.Name())
				if err != nil {
					return err
				}
				if d.IsDir() {
					localInfos[p] = fi
					if !ex {
						localDirs = append(localDirs, p)
					}
					subdirs = append(subdirs, p)
				} else if err := local.add(p, fi); err != nil {
					return err
				}
			}
			return nil
		}()
		if err != nil {
			fail(err)
			return
		}
		mu.Lock()
		b.entries = append(b.entries, local.entries...)
		b.infos = append(b.infos, local.infos...)
		b.stats.Skipped = append(b.stats.Skipped, local.stats.Skipped...)
		maps.Copy(b.dirs, localInfos)
		dirs = append(dirs, localDirs...)
		mu.Unlock()
		for _, sub := range subdirs {
			select {
			case idle <- struct{}{}:
				wg.Add(1)
				go func() {
					defer wg.Done()
					defer func() { <-idle }()
					visit(sub)
				}()
			default:
				visit(sub)
			}
		}
	}
	visit("")
	wg.Wait()
	if failed != nil {
		return fmt.Errorf("walk %s: %w", b.root, failed)
	}
	slices.Sort(b.stats.Skipped)
	keep := map[string]bool{}
	for _, d := range dirs {
		keep[d] = true
	}
	for _, e := range b.entries {
		for d := path.Dir(e.Path); d != "."; d = path.Dir(d) {
			keep[d] = true
		}
	}
	for d := range keep {
		if fi, ok := b.dirs[d]; ok {
			if err := b.add(d, fi); err != nil {
				return err
			}
		}
	}
	return nil
}

func (b *builder) git(ctx context.Context) error {
	out, err := gitexec.Run(ctx, b.root, "ls-files", "-z", "--cached", "--others", "--exclude-standard")
	if err != nil {
		return fmt.Errorf("list files of %s: %w", b.root, err)
	}
	paths := gitexec.SplitZ(out)
	// Ignored files come in when .worktreeinclude (its root is the listed one) or the profile's
	// Include (on rulePath) selects them.
	wti := &Rules{}
	if data, err := os.ReadFile(filepath.Join(b.root, WorktreeIncludeFile)); err == nil {
		wti = ParseRules(strings.Split(string(data), "\n"))
	}
	if !wti.Empty() || !b.include.Empty() {
		out, err := gitexec.Run(ctx, b.root, "ls-files", "-z", "--others", "--ignored", "--exclude-standard")
		if err != nil {
			return fmt.Errorf("list ignored files of %s: %w", b.root, err)
		}
		for _, p := range gitexec.SplitZ(out) {
			if wti.Match(p, false) || b.include.Match(b.rulePath(p), false) {
				paths = append(paths, p)
			}
		}
	}
	sort.Strings(paths)
	seen := map[string]bool{}
	for _, p := range paths {
		if seen[p] {
			continue
		}
		seen[p] = true
		if err := ctx.Err(); err != nil {
			return err
		}
		if !Carriable(p) {
			b.stats.Skipped = append(b.stats.Skipped, Printable(p))
			continue
		}
		if alwaysSkipped(p) || b.excluded(p, false) {
			continue
		}
		ok, err := b.realParents(p)
		if err != nil {
			return err
		}
		if !ok {
			continue // below a symlink: never followed
		}
		fi, err := os.Lstat(filepath.Join(b.root, filepath.FromSlash(p)))
		if errors.Is(err, fs.ErrNotExist) {
			continue // tracked but deleted in the worktree
		}
		if err != nil {
			return err
		}
		if fi.IsDir() { // a submodule
			b.stats.Skipped = append(b.stats.Skipped, p)
			continue
		}
		if err := b.add(p, fi); err != nil {
			return err
		}
	}
	var parents []string
	for d := range b.dirs {
		parents = append(parents, d)
	}
	sort.Strings(parents)
	for _, d := range parents {
		if fi := b.dirs[d]; fi != nil {
			if err := b.add(d, fi); err != nil {
				return err
			}
		}
	}
	return nil
}

// realParents reports whether every parent directory of p is a real directory (not a symlink),
// remembering the directories it saw.
func (b *builder) realParents(p string) (bool, error) {
	var parents []string
	for d := path.Dir(p); d != "."; d = path.Dir(d) {
		parents = append(parents, d)
	}
	for i := len(parents) - 1; i >= 0; i-- {
		d := parents[i]
		fi, seen := b.dirs[d]
		if !seen {
			var err error
			fi, err = os.Lstat(filepath.Join(b.root, filepath.FromSlash(d)))
			if errors.Is(err, fs.ErrNotExist) {
				return false, nil
			}
			if err != nil {
				return false, err
			}
			if !fi.IsDir() {
				fi = nil
			}
			b.dirs[d] = fi
		}
		if fi == nil {
			return false, nil
		}
	}
	return true, nil
}

// hash fills the SHA256 of every file entry, from the cache where it is still valid.
func (b *builder) hash(ctx context.Context) error {
	g, ctx := errgroup.WithContext(ctx)
	g.SetLimit(b.opts.Parallel)
	var cached, hashed int64
	type result struct{ cached bool }
	res := make([]result, len(b.entries))
	for i := range b.entries {
		e := &b.entries[i]
		if e.Type != TypeFile {
			continue
		}
		fi := b.infos[i]
		if sum, ok := b.opts.Cache.get(e.Path, fi); ok {
			e.SHA256 = sum
			res[i].cached = true
			continue
		}
		g.Go(func() error {
			start := time.Now()
			sum, size, err := HashFile(ctx, filepath.Join(b.root, filepath.FromSlash(e.Path)))
			if err != nil {
				return err
			}
			if size != e.Size {
				return fmt.Errorf("hash %s: file changed while listing", e.Path)
			}
			e.SHA256 = sum
			b.opts.Cache.put(e.Path, fi, sum, start)
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return err
	}
	for i, e := range b.entries {
		if e.Type == TypeFile {
			if res[i].cached {
				cached++
			} else {
				hashed++
			}
		}
	}
	b.stats.Cached, b.stats.Hashed = int(cached), int(hashed)
	return nil
}

// File is a file opened for reading by OpenFile.
type File interface {
	io.ReadCloser
	// Stat is the open file's stat; its Sys is the platform's (StatKey reads it).
	Stat() (fs.FileInfo, error)
}

// HashFile returns the hex sha256 and size of a regular file, refusing to follow a symlink.
func HashFile(ctx context.Context, file string) (string, int64, error) {
	f, err := OpenFile(file)
	if err != nil {
		return "", 0, err
	}
	defer f.Close()
	// Listed as a file, but something else now (a FIFO would read as an empty file).
	if fi, err := f.Stat(); err != nil {
		return "", 0, err
	} else if !fi.Mode().IsRegular() {
		return "", 0, fmt.Errorf("hash %s: not a regular file", file)
	}
	h := sha256.New()
	n, err := io.Copy(h, ctxReader{ctx, f})
	if err != nil {
		return "", 0, fmt.Errorf("hash %s: %w", file, err)
	}
	return hex.EncodeToString(h.Sum(nil)), n, nil
}

type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

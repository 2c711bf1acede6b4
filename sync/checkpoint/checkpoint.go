package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"

	"github.com/openclaw/cloudworkers/sync/gitsync"
	"github.com/openclaw/cloudworkers/sync/manifest"
	"github.com/openclaw/cloudworkers/sync/stream"
)

// RefPrefix holds git-mode checkpoints: refs/openclaw/checkpoints/<session>/<n>.
const RefPrefix = "refs/openclaw/checkpoints/"

// ErrNone is returned by Latest when a session has no checkpoint yet.
var ErrNone = errors.New("no checkpoint")

// Checkpoint is one recorded state of an anchor.
type Checkpoint struct {
	Session string `json:"session"`
	// Seq numbers the checkpoints of a session from 1, monotonically.
	Seq     uint64        `json:"seq"`
	Mode    manifest.Mode `json:"mode"`
	Created time.Time     `json:"created"`
	// Files counts file and symlink entries; Bytes sums file sizes.
	Files int   `json:"files"`
	Bytes int64 `json:"bytes"`

	// Git mode: the checkpoint ref, its commit, and the anchor's HEAD it was taken on (its parent).
	Ref    string `json:"ref,omitempty"`
	Commit string `json:"commit,omitempty"`
	Parent string `json:"parent,omitempty"`

	// Plain mode: the snapshot file (manifest plus this metadata).
	Snapshot string `json:"-"`
}

// Stats report what Create stored. In plain mode only blobs not already stored are written.
type Stats struct {
	NewBlobs int
	NewBytes int64
}

// Config configures a Store for one session of one anchor.
type Config struct {
	// Mode is the anchor's mode: git (a managed worktree) or plain (a gateway-owned directory).
	Mode manifest.Mode
	// Anchor is the directory checkpointed.
	Anchor string
	// Session names the session (gitsync.ValidName).
	Session string
	// DataDir holds plain-mode checkpoints in <DataDir>/checkpoints/<Session>/. Unused in git mode.
	DataDir string
	// Exclude and Include are the profile's rules, as for the base manifest.
	Exclude, Include []string
	// Cache, when set, spares re-hashing unchanged files.
	Cache *manifest.Cache
	// Now is the clock; time.Now when nil.
	Now func() time.Time
	// Limits bound a restore; stream.TrustedLimits when zero (a checkpoint is the gateway's own
	// record of its anchor).
	Limits stream.Limits
	// Keep is how many of the session's newest checkpoints Prune leaves (0: DefaultKeep).
	Keep int
}

// DefaultKeep is how many checkpoints of a session Prune leaves unless told otherwise: with the
// default cadence, the last 20 turns.
const DefaultKeep = 20

func (c *Config) setDefaults() {
	if c.Mode == "" {
		c.Mode = manifest.ModePlain
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Keep == 0 {
		c.Keep = DefaultKeep
	}
	if c.Limits == (stream.Limits{}) {
		c.Limits = stream.TrustedLimits
	}
}

// Validate reports a configuration a Store cannot use.
func (c Config) Validate() error {
	switch {
	case c.Mode != manifest.ModeGit && c.Mode != manifest.ModePlain:
		return fmt.Errorf("checkpoint: unknown mode %q", c.Mode)
	case c.Anchor == "":
		return errors.New("checkpoint: anchor is required")
	case !gitsync.ValidName(c.Session):
		return fmt.Errorf("checkpoint: invalid session name %q", c.Session)
	case c.Mode == manifest.ModePlain && c.DataDir == "":
		return errors.New("checkpoint: data dir is required in plain mode")
	case c.Keep < 0:
		return fmt.Errorf("checkpoint: keep must be at least 1 (0: the default, %d), got %d", DefaultKeep, c.Keep)
	}
	return nil
}

// Store creates, lists, prunes and restores the checkpoints of one session. Its methods are safe
// for concurrent use; checkpoints of one session are taken and pruned one at a time, also across
// Stores of the same session in this process.
type Store struct {
	cfg Config
	mu  *sync.Mutex
}

// sessionLocks holds one mutex per session's checkpoint store (by storeKey).
var sessionLocks sync.Map

func storeKey(cfg Config) string {
	if cfg.Mode == manifest.ModeGit {
		return "git\x00" + cfg.Anchor + "\x00" + cfg.Session
	}
	return "plain\x00" + filepath.Join(cfg.DataDir, "checkpoints", cfg.Session)
}

// New returns a Store for cfg.
func New(cfg Config) (*Store, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	abs, err := filepath.Abs(cfg.Anchor)
	if err != nil {
		return nil, err
	}
	cfg.Anchor = abs
	if cfg.DataDir != "" {
		if cfg.DataDir, err = filepath.Abs(cfg.DataDir); err != nil {
			return nil, err
		}
	}
	mu, _ := sessionLocks.LoadOrStore(storeKey(cfg), &sync.Mutex{})
	return &Store{cfg: cfg, mu: mu.(*sync.Mutex)}, nil
}

// Dir is where plain-mode checkpoints of the session live.
func (s *Store) Dir() string {
	return filepath.Join(s.cfg.DataDir, "checkpoints", s.cfg.Session)
}

func (s *Store) manifestOptions() manifest.Options {
	return manifest.Options{Mode: s.cfg.Mode, Exclude: s.cfg.Exclude, Include: s.cfg.Include, Cache: s.cfg.Cache}
}

// Create records the anchor's current tree as the session's next checkpoint: in git mode a commit
// of tracked plus eligible untracked files (built in a temporary index, so the anchor's own index
// is untouched) whose parent is the anchor's HEAD, on RefPrefix<session>/<n>; in plain mode a
// manifest snapshot with every file stored once by sha256. The caller decides the cadence (the
// default policy is after every turn).
func (s *Store) Create(ctx context.Context) (Checkpoint, Stats, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	all, err := s.list(ctx)
	if err != nil {
		return Checkpoint{}, Stats{}, err
	}
	var seq uint64 = 1
	if len(all) > 0 {
		seq = all[len(all)-1].Seq + 1
	}
	m, _, err := manifest.Build(ctx, s.cfg.Anchor, s.manifestOptions())
	if err != nil {
		return Checkpoint{}, Stats{}, fmt.Errorf("checkpoint %s/%d: %w", s.cfg.Session, seq, err)
	}
	cp := Checkpoint{Session: s.cfg.Session, Seq: seq, Mode: s.cfg.Mode, Created: s.cfg.Now().UTC(),
		Files: m.Files(), Bytes: m.TotalSize()}
	var st Stats
	if s.cfg.Mode == manifest.ModeGit {
		err = s.createGit(ctx, m, &cp)
	} else {
		st, err = s.createPlain(ctx, m, &cp)
	}
	if err != nil {
		return Checkpoint{}, st, fmt.Errorf("checkpoint %s/%d: %w", s.cfg.Session, seq, err)
	}
	return cp, st, nil
}

// List returns the session's checkpoints, oldest first.
func (s *Store) List(ctx context.Context) ([]Checkpoint, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.list(ctx)
}

func (s *Store) list(ctx context.Context) ([]Checkpoint, error) {
	var out []Checkpoint
	var err error
	if s.cfg.Mode == manifest.ModeGit {
		out, err = s.listGit(ctx)
	} else {
		out, err = s.listPlain()
	}
	if err != nil {
		return nil, fmt.Errorf("list checkpoints of %s: %w", s.cfg.Session, err)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Seq < out[j].Seq })
	return out, nil
}

// Prune removes the session's checkpoints older than its newest Config.Keep and returns them,
// oldest first: in git mode their refs (the commits go with git's own garbage collection), in
// plain mode their snapshots, then every stored blob that no remaining snapshot holds. The newest
// checkpoint is never removed.
func (s *Store) Prune(ctx context.Context) ([]Checkpoint, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	old, err := s.prune(ctx)
	if err != nil {
		return nil, fmt.Errorf("prune checkpoints of %s: %w", s.cfg.Session, err)
	}
	return old, nil
}

func (s *Store) prune(ctx context.Context) ([]Checkpoint, error) {
	if s.cfg.Mode == manifest.ModeGit {
		all, err := s.list(ctx)
		if err != nil {
			return nil, err
		}
		old := all[:max(len(all)-s.cfg.Keep, 0)]
		return old, s.pruneGit(ctx, old)
	}
	// Plain: the snapshots are read once, for their numbers and the blobs the kept ones hold.
	snaps, err := s.snapshots()
	if err != nil {
		return nil, err
	}
	n := max(len(snaps)-s.cfg.Keep, 0)
	old := make([]Checkpoint, n)
	for i, snap := range snaps[:n] {
		old[i] = snap.Checkpoint
	}
	return old, s.prunePlain(ctx, snaps[:n], snaps[n:])
}

// Latest returns the newest checkpoint, or ErrNone.
func (s *Store) Latest(ctx context.Context) (Checkpoint, error) {
	all, err := s.List(ctx)
	if err != nil {
		return Checkpoint{}, err
	}
	if len(all) == 0 {
		return Checkpoint{}, fmt.Errorf("session %s: %w", s.cfg.Session, ErrNone)
	}
	return all[len(all)-1], nil
}

// Restore makes target hold exactly the checkpoint's tree: files are written temp-then-rename
// after every one was checked against the checkpoint's sha256, and paths the checkpoint does not
// hold are deleted, except what the profile's rules exclude. `.git` is never touched; in git mode, when target is a git worktree, only
// files its git-mode manifest lists (tracked and eligible untracked) can be deleted, so ignored
// build output stays. HEAD and the index of a target repository are not moved: cp.Parent is the
// commit the checkpoint was taken on, for a caller that wants `git reset --soft` to it.
func (s *Store) Restore(ctx context.Context, cp Checkpoint, target string) (stream.Stats, error) {
	if cp.Session != s.cfg.Session || cp.Mode != s.cfg.Mode || cp.Seq == 0 {
		return stream.Stats{}, fmt.Errorf("restore: checkpoint %s/%d (%s) is not one of this store", cp.Session, cp.Seq, cp.Mode)
	}
	var st stream.Stats
	var err error
	if s.cfg.Mode == manifest.ModeGit {
		st, err = s.restoreGit(ctx, cp, target)
	} else {
		st, err = s.restorePlain(ctx, cp, target)
	}
	if err != nil {
		return st, fmt.Errorf("restore checkpoint %s/%d into %s: %w", cp.Session, cp.Seq, target, err)
	}
	return st, nil
}

// apply turns target's tree into want, reading file contents from source. The archive goes
// through stream.Apply, so nothing is written before every file was checked.
func (s *Store) apply(ctx context.Context, target string, targetMode manifest.Mode, want *manifest.Manifest, source func(manifest.Entry) string) (stream.Stats, error) {
	cur := &manifest.Manifest{Version: manifest.Version}
	if fi, err := os.Lstat(target); err == nil && fi.IsDir() {
		// The profile's rules apply: what they leave out (build output…) is neither listed nor deleted.
		cur, _, err = manifest.Build(ctx, target, manifest.Options{Mode: targetMode, Exclude: s.cfg.Exclude, Include: s.cfg.Include})
		if err != nil {
			return stream.Stats{}, fmt.Errorf("manifest of %s: %w", target, err)
		}
	}
	plan := stream.PlanFor(cur, want)
	if plan.Empty() {
		return stream.Stats{}, nil
	}
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		_, err := stream.WriteFrom(ctx, pw, plan, source)
		pw.CloseWithError(err)
		done <- err
	}()
	// Symlinks stay inside target: a checkpoint holds what workers wrote, and a link out of the
	// tree is refused (naming it) before anything is written. One that target holds already, as
	// the user's workspace may (/usr/lib/…), is in no plan, so it is kept.
	st, err := stream.Apply(ctx, pr, target, stream.ApplyOptions{Limits: s.cfg.Limits, Expect: &plan, Fsync: true})
	pr.CloseWithError(errors.New("restore: reader done"))
	werr := <-done
	if err != nil {
		if werr != nil && !errors.Is(werr, io.ErrClosedPipe) {
			return st, fmt.Errorf("%w (reading the checkpoint: %v)", err, werr)
		}
		return st, err
	}
	return st, nil
}

package checkpoint

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/openclaw/cloudworkers/internal/atomicfile"
	"github.com/openclaw/cloudworkers/sync/manifest"
	"github.com/openclaw/cloudworkers/sync/stream"
)

// snapshot is the file <Dir>/<seq>.json of a plain-mode checkpoint.
type snapshot struct {
	Checkpoint
	Manifest *manifest.Manifest `json:"manifest"`
}

// maxSnapshotBytes bounds a snapshot file read back.
const maxSnapshotBytes = 512 << 20

func (s *Store) blobPath(sum string) string {
	return filepath.Join(s.Dir(), "blobs", sum[:2], sum)
}

func (s *Store) snapshotPath(seq uint64) string {
	return filepath.Join(s.Dir(), strconv.FormatUint(seq, 10)+".json")
}

// createPlain stores every file of m not stored yet under its sha256, then the snapshot. A file
// that changed since m was built fails the checkpoint with stream.ErrChanged.
func (s *Store) createPlain(ctx context.Context, m *manifest.Manifest, cp *Checkpoint) (Stats, error) {
	var st Stats
	if err := os.MkdirAll(filepath.Join(s.Dir(), "blobs"), 0o700); err != nil {
		return st, err
	}
	seen := map[string]bool{}
	for _, e := range m.Entries {
		if e.Type != manifest.TypeFile || seen[e.SHA256] {
			continue
		}
		seen[e.SHA256] = true
		if err := ctx.Err(); err != nil {
			return st, err
		}
		if _, err := os.Stat(s.blobPath(e.SHA256)); err == nil {
			continue
		}
		if err := s.storeBlob(filepath.Join(s.cfg.Anchor, filepath.FromSlash(e.Path)), e); err != nil {
			return st, err
		}
		st.NewBlobs++
		st.NewBytes += e.Size
	}
	cp.Snapshot = s.snapshotPath(cp.Seq)
	b, err := json.Marshal(snapshot{Checkpoint: *cp, Manifest: m})
	if err != nil {
		return st, err
	}
	return st, writeOnce(cp.Snapshot, b)
}

// storeBlob copies file into the blob store temp-then-fsync-then-rename, checking its content
// against e while copying.
func (s *Store) storeBlob(file string, e manifest.Entry) error {
	dst := s.blobPath(e.SHA256)
	if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
		return err
	}
	in, err := os.OpenFile(file, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return err
	}
	defer in.Close()
	// The blob is read-only once stored; a copy that does not match e is never renamed into place.
	return atomicfile.WriteFunc(dst, 0o400, func(w io.Writer) error {
		h := sha256.New()
		n, err := io.Copy(io.MultiWriter(w, h), io.LimitReader(in, e.Size+1))
		if err != nil {
			return fmt.Errorf("store %s: %w", e.Path, err)
		}
		if n != e.Size || hex.EncodeToString(h.Sum(nil)) != e.SHA256 {
			return fmt.Errorf("store %s: %w", e.Path, stream.ErrChanged)
		}
		return nil
	})
}

// writeOnce writes file temp-then-fsync and links it into place, failing if it exists.
func writeOnce(file string, b []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(file), ".tmp-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	_, err = tmp.Write(b)
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if err := os.Link(tmp.Name(), file); err != nil {
		return fmt.Errorf("create %s: %w", filepath.Base(file), err)
	}
	return syncDir(filepath.Dir(file))
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

func (s *Store) listPlain() ([]Checkpoint, error) {
	snaps, err := s.snapshots()
	out := make([]Checkpoint, len(snaps))
	for i, snap := range snaps {
		out[i] = snap.Checkpoint
	}
	return out, err
}

// snapshots reads the session's snapshots, oldest first.
func (s *Store) snapshots() ([]*snapshot, error) {
	ents, err := os.ReadDir(s.Dir())
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []*snapshot
	for _, de := range ents {
		name, ok := strings.CutSuffix(de.Name(), ".json")
		if !ok || !de.Type().IsRegular() {
			continue
		}
		seq, err := strconv.ParseUint(name, 10, 64)
		if err != nil || seq == 0 || strconv.FormatUint(seq, 10) != name {
			continue
		}
		snap, err := s.readSnapshot(seq)
		if err != nil {
			return nil, err
		}
		out = append(out, snap)
	}
	slices.SortFunc(out, func(a, b *snapshot) int { return cmp.Compare(a.Seq, b.Seq) })
	return out, nil
}

// prunePlain removes the old checkpoints' snapshots, then sweeps the blob store: a blob that none
// of the kept snapshots holds goes (also one left by an earlier prune or checkpoint that stopped
// half way), as do temporary files of interrupted copies.
func (s *Store) prunePlain(ctx context.Context, old, kept []*snapshot) error {
	for _, cp := range old {
		if err := os.Remove(s.snapshotPath(cp.Seq)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	if len(old) > 0 {
		if err := syncDir(s.Dir()); err != nil {
			return err
		}
	}
	held := map[string]bool{}
	for _, snap := range kept {
		for _, e := range snap.Manifest.Entries {
			if e.Type == manifest.TypeFile {
				held[e.SHA256] = true
			}
		}
	}
	subs, err := os.ReadDir(filepath.Join(s.Dir(), "blobs"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, sub := range subs {
		if !sub.IsDir() || len(sub.Name()) != 2 {
			continue
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		dir := filepath.Join(s.Dir(), "blobs", sub.Name())
		blobs, err := os.ReadDir(dir)
		if err != nil {
			return err
		}
		for _, b := range blobs {
			name := b.Name()
			stored := len(name) == 64 && strings.HasPrefix(name, sub.Name())
			if (stored && !held[name]) || strings.HasPrefix(name, ".") {
				if err := os.Remove(filepath.Join(dir, name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
					return err
				}
			}
		}
	}
	return nil
}

func (s *Store) readSnapshot(seq uint64) (*snapshot, error) {
	file := s.snapshotPath(seq)
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxSnapshotBytes+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxSnapshotBytes {
		return nil, fmt.Errorf("snapshot %s over %d bytes", file, maxSnapshotBytes)
	}
	var raw struct {
		Checkpoint
		Manifest json.RawMessage `json:"manifest"`
	}
	if err := json.Unmarshal(b, &raw); err != nil {
		return nil, fmt.Errorf("snapshot %s: %w", file, err)
	}
	m, err := manifest.DecodeBytes(raw.Manifest, manifest.TrustedLimits)
	if err != nil {
		return nil, fmt.Errorf("snapshot %s: %w", file, err)
	}
	if raw.Seq != seq || raw.Session != s.cfg.Session || raw.Mode != manifest.ModePlain {
		return nil, fmt.Errorf("snapshot %s does not describe %s/%d", file, s.cfg.Session, seq)
	}
	raw.Checkpoint.Snapshot = file
	return &snapshot{Checkpoint: raw.Checkpoint, Manifest: m}, nil
}

func (s *Store) restorePlain(ctx context.Context, cp Checkpoint, target string) (stream.Stats, error) {
	snap, err := s.readSnapshot(cp.Seq)
	if err != nil {
		return stream.Stats{}, err
	}
	// Every blob must be there before anything is written (Apply re-checks each one's sha256).
	var missing []string
	for _, e := range snap.Manifest.Entries {
		if e.Type == manifest.TypeFile {
			if _, err := os.Stat(s.blobPath(e.SHA256)); err != nil {
				missing = append(missing, e.Path)
			}
		}
	}
	if len(missing) > 0 {
		return stream.Stats{}, fmt.Errorf("%d blobs missing from the store (first: %s)", len(missing), missing[0])
	}
	return s.apply(ctx, target, manifest.ModePlain, snap.Manifest, func(e manifest.Entry) string {
		return s.blobPath(e.SHA256)
	})
}

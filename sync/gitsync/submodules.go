package gitsync

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/openclaw/cloudworkers/sync/gitexec"
	"github.com/openclaw/cloudworkers/sync/manifest"
	"github.com/openclaw/cloudworkers/sync/stream"
)

// Submodule is a submodule (gitlink) of an anchor's base commit.
type Submodule struct {
	// Path is slash-separated, relative to the anchor.
	Path string `json:"path"`
	// Commit is the submodule commit the base records.
	Commit string `json:"commit"`
}

// Submodules lists the submodules of the anchor's base commit, by path.
func (a *Anchor) Submodules(ctx context.Context) ([]Submodule, error) {
	out, err := gitexec.Run(ctx, a.Dir, "ls-tree", "-r", "-z", "--full-tree", a.Base)
	if err != nil {
		return nil, fmt.Errorf("list submodules of %s: %w", short(a.Base), err)
	}
	var subs []Submodule
	for _, rec := range bytes.Split(out, []byte{0}) {
		// "<mode> SP <type> SP <object> TAB <path>"
		meta, p, ok := bytes.Cut(rec, []byte{'\t'})
		f := strings.Fields(string(meta))
		if !ok || len(f) != 3 || f[0] != "160000" {
			continue
		}
		subs = append(subs, Submodule{Path: string(p), Commit: f[2]})
	}
	return subs, nil
}

// populateSubmodules fills each submodule's directory in the new anchor with the files of the
// commit the base records for it, taken from the user's checkout of that submodule (the
// submodule's directory in repo, which must be a repository holding that commit): no network, no
// credentials. The anchor's git sees the directory as a submodule that is not checked out (no
// .git in it): nothing in it is listed, committed or reported by git. A submodule that is not
// checked out in repo, or lacks that commit, stays empty (the sync reports it as not synced);
// submodules of submodules are not filled.
func (a *Anchor) populateSubmodules(ctx context.Context) error {
	subs, err := a.Submodules(ctx)
	if err != nil {
		return err
	}
	for _, s := range subs {
		if err := a.populate(ctx, s); err != nil {
			return fmt.Errorf("submodule %s: %w", s.Path, err)
		}
	}
	return nil
}

func (a *Anchor) populate(ctx context.Context, s Submodule) error {
	if manifest.ValidPath(s.Path) != nil || !realParents(a.Dir, s.Path) || !realParents(a.Repo, s.Path) {
		return nil
	}
	src := filepath.Join(a.Repo, filepath.FromSlash(s.Path))
	// The user's checkout of the submodule must be a repository of its own (git would otherwise
	// answer for the superproject) that holds the recorded commit.
	top, err := gitexec.Line(ctx, src, "rev-parse", "--show-toplevel")
	if err != nil || !sameDir(top, src) {
		return nil
	}
	if _, err := gitexec.Line(ctx, src, "rev-parse", "--verify", "-q", s.Commit+"^{commit}"); err != nil {
		return nil
	}
	dst := filepath.Join(a.Dir, filepath.FromSlash(s.Path))
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return err
	}
	tmp, err := os.MkdirTemp("", "openclaw-submodule-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	env := []string{"GIT_INDEX_FILE=" + filepath.Join(tmp, "index")}
	if _, err := gitexec.RunEnv(ctx, src, env, nil, "read-tree", s.Commit); err != nil {
		return err
	}
	if _, err := gitexec.RunEnv(ctx, src, env, nil, "--work-tree="+dst, "checkout-index", "-a", "-f"); err != nil {
		return err
	}
	return nil
}

// sameDir reports whether two paths name the same directory.
func sameDir(a, b string) bool {
	fa, errA := os.Stat(a)
	fb, errB := os.Stat(b)
	return errA == nil && errB == nil && os.SameFile(fa, fb)
}

// PopulatedSubmodules returns the anchor's submodules whose directory holds files (as
// CreateAnchor filled them), without a repository of their own.
func (a *Anchor) PopulatedSubmodules(ctx context.Context) ([]Submodule, error) {
	subs, err := a.Submodules(ctx)
	if err != nil {
		return nil, err
	}
	var out []Submodule
	for _, s := range subs {
		dir := filepath.Join(a.Dir, filepath.FromSlash(s.Path))
		if _, err := os.Lstat(filepath.Join(dir, ".git")); err == nil {
			continue
		}
		if des, err := os.ReadDir(dir); err == nil && len(des) > 0 && realParents(a.Dir, s.Path) {
			out = append(out, s)
		}
	}
	return out, nil
}

// SubmoduleCacheName names the hash cache files of a submodule's sync (the gateway's and the
// box's), from its path: one per submodule, beside the workspace's own.
func SubmoduleCacheName(path string) string {
	sum := sha256.Sum256([]byte(path))
	return "sub-" + hex.EncodeToString(sum[:6]) + ".sync-cache.json"
}

// PushSubmodules sends the anchor's filled submodules to their places in the box's workspace
// boxWS, each as a tree of its own (plain mode: the directory is mirrored, what the box added in
// it is removed), after the workspace itself was sent. The box's git sees them as submodules that
// are not checked out, so they are read-only in effect: the worker cannot commit in them, and
// what it changes in them does not come back. cacheDir holds the gateway's hash caches; the box's
// go beside boxWS.
func PushSubmodules(ctx context.Context, r stream.Remote, a *Anchor, boxWS, cacheDir string) ([]Submodule, error) {
	subs, err := a.PopulatedSubmodules(ctx)
	if err != nil {
		return nil, err
	}
	for _, s := range subs {
		name := SubmoduleCacheName(s.Path)
		cacheFile := filepath.Join(cacheDir, name)
		cache := manifest.LoadCache(cacheFile)
		_, err := stream.PushTree(ctx, r, filepath.Join(a.Dir, filepath.FromSlash(s.Path)), boxWS+"/"+s.Path, stream.TreeOptions{
			Cache: cache, Manifest: stream.ManifestOptions{Mode: manifest.ModePlain, CacheFile: boxWS + "." + name}})
		if err != nil {
			return nil, fmt.Errorf("submodule %s: %w", s.Path, err)
		}
		_ = cache.Save(cacheFile)
	}
	return subs, nil
}

package gitsync

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/openclaw/cloudworkers/internal/atomicfile"
	"github.com/openclaw/cloudworkers/sync/gitexec"
	"github.com/openclaw/cloudworkers/sync/manifest"
	"github.com/openclaw/cloudworkers/sync/stream"
)

// Submodule is a submodule (gitlink) of a commit of the anchor.
type Submodule struct {
	// Path is slash-separated, relative to the anchor.
	Path string `json:"path"`
	// Commit is the submodule commit the superproject's commit records.
	Commit string `json:"commit"`
}

// Submodules lists the submodules recorded by commit (a revision of the anchor), by path.
func (a *Anchor) Submodules(ctx context.Context, commit string) ([]Submodule, error) {
	out, err := gitexec.Run(ctx, a.Dir, "ls-tree", "-r", "-z", "--full-tree", commit)
	if err != nil {
		return nil, fmt.Errorf("list submodules of %s: %w", short(commit), err)
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

// filledFile records, beside the anchor, which commit each filled submodule directory holds.
func (a *Anchor) filledFile() string { return a.Dir + ".submodules.json" }

func (a *Anchor) loadFilled() map[string]string {
	m := map[string]string{}
	if b, err := os.ReadFile(a.filledFile()); err == nil {
		_ = json.Unmarshal(b, &m)
	}
	return m
}

func (a *Anchor) saveFilled(m map[string]string) error {
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	return atomicfile.Write(a.filledFile(), b, 0o600)
}

// anchorLocks serialises, per anchor directory, what changes its submodule copies: fills,
// adoptions, and the pushes that read them.
var anchorLocks sync.Map

func (a *Anchor) lockSubmodules() func() {
	mu, _ := anchorLocks.LoadOrStore(filepath.Clean(a.Dir), &sync.Mutex{})
	mu.(*sync.Mutex).Lock()
	return mu.(*sync.Mutex).Unlock
}

// sourceFile records, beside the anchor, the user's checkout it was made from: once a session's
// workspace is the anchor itself, that is where the submodules' checkouts still are.
func (a *Anchor) sourceFile() string { return a.Dir + ".source" }

// userCheckout is the user's checkout the submodules are read from: the anchor's Repo unless that
// is the anchor itself, else the one recorded at its creation, else the repository's main
// worktree; "" when none is a checkout of this repository.
func (a *Anchor) userCheckout(ctx context.Context) string {
	var candidates []string
	if !SameDir(a.Repo, a.Dir) {
		candidates = append(candidates, a.Repo)
	}
	if b, err := os.ReadFile(a.sourceFile()); err == nil {
		candidates = append(candidates, strings.TrimSpace(string(b)))
	}
	if out, err := gitexec.Run(ctx, a.Dir, "worktree", "list", "--porcelain"); err == nil {
		first, _, _ := strings.Cut(string(out), "\n")
		if p, ok := strings.CutPrefix(first, "worktree "); ok {
			candidates = append(candidates, p)
		}
	}
	common, err := gitexec.Line(ctx, a.Dir, "rev-parse", "--path-format=absolute", "--git-common-dir")
	if err != nil {
		return ""
	}
	for _, c := range candidates {
		if c == "" || SameDir(c, a.Dir) {
			continue
		}
		// A checkout (its own top level) of the same repository.
		top, err := gitexec.Line(ctx, c, "rev-parse", "--show-toplevel")
		if err != nil || !SameDir(top, c) {
			continue
		}
		if cc, err := gitexec.Line(ctx, c, "rev-parse", "--path-format=absolute", "--git-common-dir"); err == nil && SameDir(cc, common) {
			return c
		}
	}
	return ""
}

// copyDir is the directory of the submodule at p in the anchor when it can hold a copy of ours: a
// valid path below real directories, a directory (or, with missingOK, nothing yet), without a
// checkout of its own (.git) — a symlink, a file or a checkout there is not ours to replace.
func (a *Anchor) copyDir(p string, missingOK bool) (string, bool) {
	if manifest.ValidPath(p) != nil || !realParents(a.Dir, p) {
		return "", false
	}
	dir := filepath.Join(a.Dir, filepath.FromSlash(p))
	fi, err := os.Lstat(dir)
	if err != nil {
		return dir, missingOK && errors.Is(err, os.ErrNotExist)
	}
	if !fi.IsDir() {
		return "", false
	}
	if _, err := os.Lstat(filepath.Join(dir, ".git")); err == nil {
		return "", false
	}
	return dir, true
}

// nonEmpty reports whether dir is a directory holding something.
func nonEmpty(dir string) bool {
	des, err := os.ReadDir(dir)
	return err == nil && len(des) > 0
}

// FillSubmodules brings the directory of each submodule that the anchor's HEAD records to the
// files of the recorded commit, taken from the user's checkout of that submodule (its directory in
// the user's checkout, userCheckout, which must be a repository of its own holding that commit):
// no network, no credentials, nothing of the user's changed. A directory already filled at that
// commit is left as it is. The files are checked out into a staging directory beside the anchor
// and renamed into place, so an interrupted fill leaves no half tree (and is redone next time). Without a .git
// inside, the anchor's git — and the box's — sees a submodule that is not checked out: nothing in
// it is listed, reported by `git status` or committed. A submodule whose commit the user's
// checkout cannot give is left empty (emptied if it held another commit's files; it is then
// reported as not synced); one that a checkout of its own (.git) occupies is left alone;
// submodules of submodules are not filled. It returns the submodules filled.
func (a *Anchor) FillSubmodules(ctx context.Context) ([]Submodule, error) {
	defer a.lockSubmodules()()
	return a.fillSubmodules(ctx)
}

func (a *Anchor) fillSubmodules(ctx context.Context) ([]Submodule, error) {
	// Staging directories of fills that a crash interrupted (none is in use: the lock is held).
	left, _ := filepath.Glob(filepath.Join(filepath.Dir(a.Dir), "."+filepath.Base(a.Dir)+".fill-*"))
	for _, d := range left {
		_ = os.RemoveAll(d)
	}
	subs, err := a.Submodules(ctx, "HEAD")
	if err != nil {
		return nil, err
	}
	was := a.loadFilled()
	now := map[string]string{}
	var out []Submodule
	user := a.userCheckout(ctx)
	for _, s := range subs {
		dst, ok := a.copyDir(s.Path, true)
		if !ok {
			continue
		}
		rec := was[s.Path]
		switch {
		case rec == s.Commit && nonEmpty(dst):
			now[s.Path] = s.Commit
			out = append(out, s)
			continue
		case rec == "" && nonEmpty(dst):
			continue // files that no fill of ours put there: left alone
		}
		ok, err := a.fill(ctx, user, s, dst, was)
		if err != nil {
			return nil, fmt.Errorf("submodule %s: %w", s.Path, err)
		}
		if ok {
			now[s.Path] = s.Commit
			out = append(out, s)
		} else if rec != "" {
			// Our copy of another commit, which can no longer be given: not sent as this one.
			if err := emptyDir(dst); err != nil {
				return nil, err
			}
		}
	}
	return out, a.saveFilled(now)
}

// fill checks s.Commit out of the user's checkout of the submodule (below user, the user's
// checkout of the repository: userCheckout) into dst, replacing what dst held (empty, or a copy of ours); false when that checkout
// cannot give it. The files are checked out into a staging directory beside the anchor (outside
// the worktree), recorded as pending, then renamed into place.
func (a *Anchor) fill(ctx context.Context, user string, s Submodule, dst string, was map[string]string) (bool, error) {
	if user == "" || !realParents(user, s.Path) {
		return false, nil
	}
	src := filepath.Join(user, filepath.FromSlash(s.Path))
	// The user's checkout of the submodule must be a repository of its own (git would otherwise
	// answer for the superproject) that holds the recorded commit.
	top, err := gitexec.Line(ctx, src, "rev-parse", "--show-toplevel")
	if err != nil || !SameDir(top, src) {
		return false, nil
	}
	// No network: LFS files stay pointers, and a partial clone does not fetch what it lacks.
	noNet := []string{"GIT_LFS_SKIP_SMUDGE=1", "GIT_NO_LAZY_FETCH=1"}
	if _, err := gitexec.RunEnv(ctx, src, noNet, nil, "rev-parse", "--verify", "-q", s.Commit+"^{commit}"); err != nil {
		return false, nil
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return false, err
	}
	tmp, err := os.MkdirTemp(filepath.Dir(a.Dir), "."+filepath.Base(a.Dir)+".fill-")
	if err != nil {
		return false, err
	}
	defer os.RemoveAll(tmp)
	tree := filepath.Join(tmp, "tree")
	if err := os.Mkdir(tree, 0o755); err != nil {
		return false, err
	}
	// A temporary index: the user's own is not read or written.
	env := append([]string{"GIT_INDEX_FILE=" + filepath.Join(tmp, "index")}, noNet...)
	// A checkout that cannot give every file (a partial clone missing some) gives nothing: the
	// submodule is reported as not synced rather than failing the sync.
	if _, err := gitexec.RunEnv(ctx, src, env, nil, "read-tree", s.Commit); err != nil {
		return false, nil
	}
	if _, err := gitexec.RunEnv(ctx, src, env, nil, "--work-tree="+tree, "checkout-index", "-a", "-f"); err != nil {
		return false, nil
	}
	// Pending: should this stop after the rename, the directory is known to be a copy of ours.
	was[s.Path] = "pending"
	if err := a.saveFilled(was); err != nil {
		return false, err
	}
	if err := os.RemoveAll(dst); err != nil {
		return false, err
	}
	return true, os.Rename(tree, dst)
}

// emptyDir removes what dir holds, keeping dir.
func emptyDir(dir string) error {
	des, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	for _, de := range des {
		if err := os.RemoveAll(filepath.Join(dir, de.Name())); err != nil {
			return err
		}
	}
	return nil
}

// setAsideReplaced moves the filled submodule directories whose gitlink tip no longer has (the
// worker turned the submodule into plain files, or removed it) to a directory beside the anchor:
// they are a copy of ours, and a fast-forward would refuse to write over them. restore puts them
// back (the fast-forward failed); done drops them and their records.
func (a *Anchor) setAsideReplaced(ctx context.Context, tip string) (restore, done func() error, err error) {
	nothing := func() error { return nil }
	was := a.loadFilled()
	if len(was) == 0 {
		return nothing, nothing, nil
	}
	// Only directories that are submodules now (a record can be stale: an adoption that stopped
	// after its fast-forward) and are not in tip.
	gone := map[string]bool{}
	now, err := a.Submodules(ctx, "HEAD")
	if err != nil {
		return nil, nil, err
	}
	for _, s := range now {
		gone[s.Path] = true
	}
	keep, err := a.Submodules(ctx, tip)
	if err != nil {
		return nil, nil, err
	}
	for _, s := range keep {
		delete(gone, s.Path)
	}
	aside, err := os.MkdirTemp(filepath.Dir(a.Dir), "."+filepath.Base(a.Dir)+".aside-")
	if err != nil {
		return nil, nil, err
	}
	type moved struct{ path, from, to string }
	var ms []moved
	restore = func() error {
		var errs []error
		for _, m := range ms {
			if err := os.Rename(m.to, m.from); err != nil {
				errs = append(errs, fmt.Errorf("put back %s: %w (the copy is kept in %s)", m.from, err, m.to))
			}
		}
		if len(errs) == 0 {
			return os.RemoveAll(aside)
		}
		return errors.Join(errs...)
	}
	for p := range was {
		dst, ok := a.copyDir(p, false)
		if !gone[p] || !ok {
			continue
		}
		to := filepath.Join(aside, fmt.Sprint(len(ms)))
		if err := os.Rename(dst, to); err != nil {
			return nil, nil, errors.Join(err, restore())
		}
		ms = append(ms, moved{p, dst, to})
	}
	done = func() error {
		for _, m := range ms {
			delete(was, m.path)
		}
		return errors.Join(a.saveFilled(was), os.RemoveAll(aside))
	}
	return restore, done, nil
}

// sameDir reports whether two paths name the same directory.
func SameDir(a, b string) bool {
	fa, errA := os.Stat(a)
	fb, errB := os.Stat(b)
	return errA == nil && errB == nil && os.SameFile(fa, fb)
}

// SubmoduleCacheName names the hash cache files of a submodule's sync (the gateway's and the
// box's), from its path: one per submodule, beside the workspace's own.
func SubmoduleCacheName(path string) string {
	sum := sha256.Sum256([]byte(path))
	return "sub-" + hex.EncodeToString(sum[:6]) + ".sync-cache.json"
}

// PushSubmodules brings the anchor's submodules to their recorded commits (FillSubmodules) and
// sends each one to its place in the box's workspace boxWS, as a tree of its own (plain mode: the
// directory is mirrored, what the box added in it is removed), after the workspace itself was
// sent. A submodule whose path the profile's rules exclude (exclude, unless include) is not sent;
// inside one, the rules apply to its files' paths in the workspace (RulePrefix).
// The box's git sees them as submodules that are not checked out, so they are read-only in
// effect: the worker cannot commit in them with `git add`, and what it changes in them does not
// come back. cacheDir holds the gateway's hash caches; the box's go beside boxWS. It returns the
// submodules sent and, with their paths below the workspace's root, what their listings left out.
func PushSubmodules(ctx context.Context, r stream.Remote, a *Anchor, boxWS, cacheDir string, exclude, include []string) (sent []Submodule, skipped []string, err error) {
	defer a.lockSubmodules()()
	subs, err := a.fillSubmodules(ctx)
	if err != nil {
		return nil, nil, err
	}
	excl, incl := manifest.ParseRules(exclude), manifest.ParseRules(include)
	for _, s := range subs {
		if excl.Match(s.Path, true) && !incl.Match(s.Path, true) {
			continue
		}
		name := SubmoduleCacheName(s.Path)
		cacheFile := filepath.Join(cacheDir, name)
		cache := manifest.LoadCache(cacheFile)
		res, err := stream.PushTree(ctx, r, filepath.Join(a.Dir, filepath.FromSlash(s.Path)), boxWS+"/"+s.Path, stream.TreeOptions{
			Cache: cache, Manifest: submoduleManifest(boxWS+"."+name, exclude, include, s.Path)})
		if err != nil {
			return nil, nil, fmt.Errorf("submodule %s: %w", s.Path, err)
		}
		_ = cache.Save(cacheFile)
		sent = append(sent, s)
		for _, p := range res.Skipped {
			skipped = append(skipped, s.Path+"/"+p)
		}
	}
	return sent, skipped, nil
}

// submoduleManifest selects a submodule's files on both sides: the profile's rules on their paths
// in the workspace. Without rules there is no prefix to send either (a box installed by an earlier
// gateway knows no --rule-prefix).
func submoduleManifest(cacheFile string, exclude, include []string, path string) stream.ManifestOptions {
	mo := stream.ManifestOptions{Mode: manifest.ModePlain, CacheFile: cacheFile, Exclude: exclude, Include: include}
	if len(exclude)+len(include) > 0 {
		mo.RulePrefix = path
	}
	return mo
}

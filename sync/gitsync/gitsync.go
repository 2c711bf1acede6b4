// Package gitsync keeps a git workspace's anchor — a managed worktree on its own branch — and adopts
// the commits a worker made, as a bundle, by fast-forward only.
package gitsync

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/openclaw/cloudworkers/internal/atomicfile"
	"github.com/openclaw/cloudworkers/internal/untrusted"
	"github.com/openclaw/cloudworkers/sync/gitexec"
	"github.com/openclaw/cloudworkers/sync/manifest"
)

// BranchPrefix names managed branches: openclaw/<name>.
const BranchPrefix = "openclaw/"

// ResultRefPrefix stores adopted worker results: refs/openclaw/worker-results/<session>.
const ResultRefPrefix = "refs/openclaw/worker-results/"

// RefsRoot holds every ref the gateway writes for a session in a repository:
// refs/openclaw/<kind>/<name>[/…] (worker results, checkpoints, dispatch snapshots).
const RefsRoot = "refs/openclaw/"

// SessionOfRef returns the session name of a ref under RefsRoot, and whether ref is one.
func SessionOfRef(ref string) (string, bool) {
	rest, ok := strings.CutPrefix(ref, RefsRoot)
	if !ok {
		return "", false
	}
	_, rest, ok = strings.Cut(rest, "/") // the kind
	if !ok {
		return "", false
	}
	name, _, _ := strings.Cut(rest, "/")
	return name, name != ""
}

var nameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$`)

// ValidName reports whether s can name an anchor or a session in refs and paths.
func ValidName(s string) bool {
	return nameRE.MatchString(s) && !strings.Contains(s, "..") && !strings.HasSuffix(s, ".lock")
}

// Anchor is a managed worktree: Dir, on branch Branch, created at Base, of the repository Repo.
type Anchor struct {
	Repo, Dir, Name, Branch, Base string
	// Head is the user's HEAD when the anchor was made by CreateWorkingAnchor; Snapshot says Base
	// is the snapshot commit of their uncommitted work on top of it (else Base is Head).
	Head     string
	Snapshot bool
}

// Fingerprint identifies a repository by its common git directory.
func Fingerprint(ctx context.Context, repo string) (string, error) {
	dir, err := gitexec.Line(ctx, repo, "rev-parse", "--path-format=absolute", "--git-common-dir")
	if err != nil {
		return "", err
	}
	h := sha256.Sum256([]byte(filepath.Clean(dir)))
	return hex.EncodeToString(h[:8]), nil
}

// CreateAnchor adds the managed worktree <dataDir>/worktrees/<fingerprint>/<name> of repo on a new
// branch openclaw/<name> at base (HEAD when empty), and copies in the ignored-and-untracked files
// that .worktreeinclude selects (never through a symlinked directory), and fills its submodules
// at the commits base records, from the user's checkouts of them (FillSubmodules). The user's
// checkout is not touched.
func CreateAnchor(ctx context.Context, repo, dataDir, name, base string) (*Anchor, error) {
	if !ValidName(name) {
		return nil, fmt.Errorf("invalid anchor name %q", name)
	}
	if base == "" {
		base = "HEAD"
	}
	commit, err := gitexec.Line(ctx, repo, "rev-parse", "--verify", base+"^{commit}")
	if err != nil {
		return nil, fmt.Errorf("resolve base %s: %w", base, err)
	}
	fp, err := Fingerprint(ctx, repo)
	if err != nil {
		return nil, err
	}
	a := &Anchor{Repo: repo, Name: name, Branch: BranchPrefix + name, Base: commit,
		Dir: filepath.Join(dataDir, "worktrees", fp, name)}
	if err := os.MkdirAll(filepath.Dir(a.Dir), 0o700); err != nil {
		return nil, err
	}
	if _, err := gitexec.Run(ctx, repo, "worktree", "add", "-q", "-b", a.Branch, a.Dir, commit); err != nil {
		return nil, fmt.Errorf("create managed worktree: %w", err)
	}
	if err := copyIncluded(ctx, repo, a.Dir); err != nil {
		return nil, err
	}
	// A record left by an earlier anchor of that name (removed since) says nothing of this one;
	// where the user's checkout is, for its submodules, once the session works in the anchor.
	if err := os.Remove(a.filledFile()); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	src, err := gitexec.Line(ctx, repo, "rev-parse", "--show-toplevel")
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(a.sourceFile(), []byte(src+"\n"), 0o600); err != nil {
		return nil, err
	}
	if _, err := a.FillSubmodules(ctx); err != nil {
		return nil, err
	}
	return a, nil
}

// copyIncluded copies repo's ignored-and-untracked files matched by its .worktreeinclude into dst.
func copyIncluded(ctx context.Context, repo, dst string) error {
	data, err := os.ReadFile(filepath.Join(repo, manifest.WorktreeIncludeFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	rules := manifest.ParseRules(strings.Split(string(data), "\n"))
	out, err := gitexec.Run(ctx, repo, "ls-files", "-z", "--others", "--ignored", "--exclude-standard")
	if err != nil {
		return err
	}
	for _, p := range bytes.Split(out, []byte{0}) {
		rel := string(p)
		if rel == "" || !rules.Match(rel, false) || manifest.ValidPath(rel) != nil {
			continue
		}
		if !realParents(repo, rel) {
			continue
		}
		src := filepath.Join(repo, filepath.FromSlash(rel))
		fi, err := os.Lstat(src)
		if err != nil {
			continue
		}
		to := filepath.Join(dst, filepath.FromSlash(rel))
		if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
			return err
		}
		switch {
		case fi.Mode()&os.ModeSymlink != 0:
			t, err := os.Readlink(src)
			if err != nil {
				return err
			}
			if err := os.Symlink(t, to); err != nil {
				return err
			}
		case fi.Mode().IsRegular():
			if err := copyFile(src, to, fi.Mode().Perm()); err != nil {
				return err
			}
		}
	}
	return nil
}

func realParents(root, rel string) bool {
	d := filepath.Dir(filepath.FromSlash(rel))
	for d != "." {
		fi, err := os.Lstat(filepath.Join(root, d))
		if err != nil || !fi.IsDir() {
			return false
		}
		d = filepath.Dir(d)
	}
	return true
}

func copyFile(src, dst string, mode os.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// Manifest builds the anchor's git-mode manifest, recording the base commit.
func (a *Anchor) Manifest(ctx context.Context, opts manifest.Options) (*manifest.Manifest, error) {
	opts.Mode = manifest.ModeGit
	m, _, err := manifest.Build(ctx, a.Dir, opts)
	if err != nil {
		return nil, err
	}
	m.BaseCommit = a.Base
	return m, nil
}

// BasePack writes to file (temp, fsync, rename) a pack of exactly the base commit, its tree and
// every tree and blob under it — none of its ancestors, so its size does not depend on the length
// of the history. BoxRepoCommand makes a shallow repository on the box from it.
func (a *Anchor) BasePack(ctx context.Context, file string) error {
	err := atomicfile.WriteFunc(file, 0o600, func(w io.Writer) error { return a.writeBasePack(ctx, w) })
	if err != nil {
		return fmt.Errorf("pack base %s: %w", short(a.Base), err)
	}
	return nil
}

// writeBasePack streams `git rev-list --objects --no-walk <base>` (the commit, then every object
// of its tree with its path, which pack-objects uses to pick deltas) into `git pack-objects`.
func (a *Anchor) writeBasePack(ctx context.Context, w io.Writer) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	pr, pw := io.Pipe()
	listed := make(chan error, 1)
	go func() {
		err := gitexec.Stream(ctx, a.Dir, nil, pw, "rev-list", "--objects", "--no-walk", a.Base+"^{commit}")
		pw.CloseWithError(err)
		listed <- err
	}()
	err := gitexec.Stream(ctx, a.Dir, pr, w, "pack-objects", "--stdout", "-q")
	// pack-objects stopped (done or failed): rev-list must not wait on a reader that is gone.
	pr.CloseWithError(io.ErrClosedPipe)
	cancel()
	if lerr := <-listed; err == nil {
		err = lerr
	}
	return err
}

// BoxRepoCommand is the shell command that turns dir on the box (already holding the synced files)
// into a shallow repository on branch openclaw/<name> whose HEAD is base, its only commit, from
// the pack at packPath (see BasePack): the pack is indexed, base is recorded in .git/shallow so
// git never looks for its parents, the index is reset to base and the files are left as synced,
// so uncommitted changes stay uncommitted. The pack is removed. There is no remote and no
// credential.
func BoxRepoCommand(dir, packPath, name, base string, author Identity) string {
	q := untrusted.Quote
	initRepo := "git init -q"
	if len(base) == 64 {
		initRepo += " --object-format=sha256"
	}
	var identity []string
	if author.Name != "" {
		identity = []string{"git config user.name " + q(author.Name), "git config user.email " + q(author.Email)}
	}
	return strings.Join(append([]string{
		"set -e",
		"cd " + q(dir),
		initRepo,
		"git index-pack --stdin < " + q(packPath) + " > /dev/null",
		"printf '%s\\n' " + q(base) + ` > "$(git rev-parse --git-path shallow)"`,
		"git update-ref " + q("refs/heads/"+BranchPrefix+name) + " " + q(base),
		"git symbolic-ref HEAD " + q("refs/heads/"+BranchPrefix+name),
		"git reset -q",
		"rm -f " + q(packPath),
	}, identity...), "\n")
}

// BoxBundleCommand is the shell command that writes, on stdout, the bundle of the commits made
// on the box in dir since base (`git bundle create - <base>..HEAD`), for Adopt. It prints
// nothing and succeeds when HEAD is still base (git refuses an empty bundle).
func BoxBundleCommand(dir, base string) string {
	q := untrusted.Quote
	return strings.Join([]string{
		"set -e",
		"cd " + q(dir),
		`if [ "$(git rev-parse HEAD)" = ` + q(base) + " ]; then exit 0; fi",
		"git bundle create -q - " + q(base+"..HEAD"),
	}, "\n")
}

// DivergedError stops an adoption whose tip does not descend from what the anchor holds; nothing
// was changed.
type DivergedError struct {
	Base, Tip, Branch string
	Reason            string
}

func (e *DivergedError) Error() string {
	return fmt.Sprintf("worker result %s cannot fast-forward %s (base %s): %s; nothing was changed",
		short(e.Tip), e.Branch, short(e.Base), e.Reason)
}

func short(s string) string {
	if len(s) > 12 {
		return s[:12]
	}
	return s
}

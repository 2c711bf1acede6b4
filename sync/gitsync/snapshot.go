package gitsync

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/openclaw/cloudworkers/sync/gitexec"
	"github.com/openclaw/cloudworkers/sync/manifest"
)

// SnapshotMessage is the message of the commit that carries a checkout's uncommitted work.
const SnapshotMessage = "openclaw: working tree at dispatch"

// SnapshotRefPrefix keeps each session's snapshot commit named (refs/openclaw/dispatch-snapshots/<name>),
// so that listings of what a worker made leave it out.
const SnapshotRefPrefix = "refs/openclaw/dispatch-snapshots/"

// Identity signs a snapshot commit (author and committer).
type Identity struct {
	Name, Email string
}

// DefaultIdentity signs snapshot commits when the gateway configuration names nobody.
var DefaultIdentity = Identity{Name: "OpenClaw", Email: "openclaw@openclaw.invalid"}

// Validate refuses a name or address git would mangle or reject.
func (id Identity) Validate() error {
	for _, f := range []struct{ name, v string }{{"name", id.Name}, {"email", id.Email}} {
		if strings.ContainsAny(f.v, "<>\n\r\x00") {
			return fmt.Errorf("%s %q must not hold '<', '>' or control characters", f.name, f.v)
		}
	}
	return nil
}

func (id Identity) orDefault() Identity {
	if id.Name == "" {
		id.Name = DefaultIdentity.Name
	}
	if id.Email == "" {
		id.Email = DefaultIdentity.Email
	}
	return id
}

// SnapshotOptions select what of a checkout's uncommitted work a snapshot carries.
type SnapshotOptions struct {
	// Exclude and Include are the profile's rules (manifest.Options): a path Exclude matches
	// (and Include does not) keeps its committed state.
	Exclude, Include []string
	Author           Identity
	// TempDir holds the temporary index (never the user's git directory).
	TempDir string
}

// Snapshot is the commit on top of head that holds the uncommitted tracked changes (staged or
// not, deletions included) and the untracked files that are not ignored of the checkout at repo,
// within the profile's rules, or head itself when there are none. The user's checkout, index,
// stash and refs are not written: the tree is built in a temporary index (GIT_INDEX_FILE) outside
// the repository, and only objects are added to it. Ignored files (those .worktreeinclude names
// too) never enter the commit; submodules keep the commits head records; files below a symlinked
// directory are left out.
func Snapshot(ctx context.Context, repo, head string, opts SnapshotOptions) (commit string, changed []string, err error) {
	top, err := gitexec.Line(ctx, repo, "rev-parse", "--show-toplevel")
	if err != nil {
		return "", nil, err
	}
	exclude, include := manifest.ParseRules(opts.Exclude), manifest.ParseRules(opts.Include)
	eligible := func(p string) bool {
		return p != "" && manifest.Carriable(p) && manifest.ValidPath(p) == nil && !skippedAlways(p) &&
			!(exclude.Match(p, false) && !include.Match(p, false))
	}
	// Tracked paths whose working-tree state differs from head (the real index is only read:
	// gitexec sets GIT_OPTIONAL_LOCKS=0, so no stat refresh is written back).
	diff, err := gitexec.Run(ctx, top, "diff-index", "-z", "--name-only", "--no-renames", "--ignore-submodules=all", head, "--")
	if err != nil {
		return "", nil, fmt.Errorf("list uncommitted changes: %w", err)
	}
	untracked, err := gitexec.Run(ctx, top, "ls-files", "-z", "--others", "--exclude-standard")
	if err != nil {
		return "", nil, fmt.Errorf("list untracked files: %w", err)
	}
	var add, remove bytes.Buffer
	for _, p := range append(gitexec.SplitZ(diff), gitexec.SplitZ(untracked)...) {
		if !eligible(p) {
			continue
		}
		buf := &remove
		if fi, err := os.Lstat(filepath.Join(top, filepath.FromSlash(p))); err == nil && realParents(top, p) &&
			(fi.Mode().IsRegular() || fi.Mode()&os.ModeSymlink != 0) {
			buf = &add
		} else if err == nil && fi.IsDir() {
			continue // a submodule, or a directory where a file was: the committed state stays
		}
		buf.WriteString(p)
		buf.WriteByte(0)
		changed = append(changed, p)
	}
	if len(changed) == 0 {
		return head, nil, nil
	}
	tmp, err := os.MkdirTemp(opts.TempDir, ".snapshot-index-")
	if err != nil {
		return "", nil, err
	}
	defer os.RemoveAll(tmp)
	env := []string{"GIT_INDEX_FILE=" + filepath.Join(tmp, "index")}
	if _, err := gitexec.RunEnv(ctx, top, env, nil, "read-tree", head); err != nil {
		return "", nil, err
	}
	if add.Len() > 0 {
		if _, err := gitexec.RunEnv(ctx, top, env, add.Bytes(), "update-index", "--add", "--replace", "-z", "--stdin"); err != nil {
			return "", nil, fmt.Errorf("snapshot the working tree: %w", err)
		}
	}
	if remove.Len() > 0 {
		if _, err := gitexec.RunEnv(ctx, top, env, remove.Bytes(), "update-index", "--force-remove", "-z", "--stdin"); err != nil {
			return "", nil, fmt.Errorf("snapshot the working tree: %w", err)
		}
	}
	tree, err := gitexec.RunEnv(ctx, top, env, nil, "write-tree")
	if err != nil {
		return "", nil, err
	}
	headTree, err := gitexec.Line(ctx, top, "rev-parse", head+"^{tree}")
	if err != nil {
		return "", nil, err
	}
	if strings.TrimSpace(string(tree)) == headTree {
		return head, nil, nil // only changes git does not record (a mode git ignores, a racy stat)
	}
	id := opts.Author.orDefault()
	if err := id.Validate(); err != nil {
		return "", nil, fmt.Errorf("snapshot author: %w", err)
	}
	cenv := append(env, "GIT_AUTHOR_NAME="+id.Name, "GIT_AUTHOR_EMAIL="+id.Email,
		"GIT_COMMITTER_NAME="+id.Name, "GIT_COMMITTER_EMAIL="+id.Email)
	out, err := gitexec.RunEnv(ctx, top, cenv, nil, "commit-tree", strings.TrimSpace(string(tree)), "-p", head, "-m", SnapshotMessage)
	if err != nil {
		return "", nil, fmt.Errorf("snapshot commit: %w", err)
	}
	return strings.TrimSpace(string(out)), changed, nil
}

// skippedAlways: repository metadata and sync staging directories, at any depth (as manifest
// leaves them out).
func skippedAlways(p string) bool {
	for _, c := range strings.Split(p, "/") {
		if strings.EqualFold(c, ".git") || strings.HasPrefix(c, manifest.StagingPrefix) {
			return true
		}
	}
	return false
}

// CreateWorkingAnchor is CreateAnchor at the user's HEAD plus a snapshot of their uncommitted
// work (Snapshot): the managed branch starts at the snapshot commit, which becomes the anchor's
// Base (so the worker's commits build on it and adoption's ancestry check holds), named by
// SnapshotRefPrefix+name. A clean checkout gives an anchor at HEAD, with no snapshot commit.
func CreateWorkingAnchor(ctx context.Context, repo, dataDir, name string, opts SnapshotOptions) (*Anchor, error) {
	if !ValidName(name) {
		return nil, fmt.Errorf("invalid anchor name %q", name)
	}
	head, err := gitexec.Line(ctx, repo, "rev-parse", "--verify", "HEAD^{commit}")
	if err != nil {
		return nil, fmt.Errorf("resolve HEAD: %w", err)
	}
	if opts.TempDir == "" {
		opts.TempDir = dataDir
	}
	if err := os.MkdirAll(opts.TempDir, 0o700); err != nil {
		return nil, err
	}
	base, changed, err := Snapshot(ctx, repo, head, opts)
	if err != nil {
		return nil, err
	}
	if len(changed) > 0 {
		if _, err := gitexec.Run(ctx, repo, "update-ref", "-m", "openclaw: snapshot at dispatch", SnapshotRefPrefix+name, base); err != nil {
			return nil, err
		}
	}
	a, err := CreateAnchor(ctx, repo, dataDir, name, base)
	if err != nil {
		if len(changed) > 0 {
			_, _ = gitexec.Run(ctx, repo, "update-ref", "-d", SnapshotRefPrefix+name, base)
		}
		return nil, err
	}
	a.Head, a.Snapshot = head, len(changed) > 0
	return a, nil
}

package checkpoint

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/openclaw/cloudworkers/sync/gitexec"
	"github.com/openclaw/cloudworkers/sync/gitsync"
	"github.com/openclaw/cloudworkers/sync/manifest"
	"github.com/openclaw/cloudworkers/sync/stream"
)

// identity signs checkpoint commits, so that a repository without a configured user still works.
var identity = []string{
	"GIT_AUTHOR_NAME=OpenClaw checkpoint", "GIT_AUTHOR_EMAIL=checkpoint@openclaw.invalid",
	"GIT_COMMITTER_NAME=OpenClaw checkpoint", "GIT_COMMITTER_EMAIL=checkpoint@openclaw.invalid",
}

func (s *Store) refFor(seq uint64) string {
	return fmt.Sprintf("%s%s/%d", RefPrefix, s.cfg.Session, seq)
}

// tempIndex returns GIT_INDEX_FILE for a fresh index file next to the repository's own, and a
// cleanup; the anchor's index is never read or written.
func (s *Store) tempIndex(ctx context.Context) ([]string, func(), error) {
	gitDir, err := gitexec.Line(ctx, s.cfg.Anchor, "rev-parse", "--path-format=absolute", "--git-dir")
	if err != nil {
		return nil, nil, err
	}
	f, err := os.CreateTemp(gitDir, "openclaw-checkpoint-index-*")
	if err != nil {
		return nil, nil, err
	}
	name := f.Name()
	f.Close()
	os.Remove(name) // git refuses an empty file as an index; it creates it
	cleanup := func() { os.Remove(name); os.Remove(name + ".lock") }
	return []string{"GIT_INDEX_FILE=" + name}, cleanup, nil
}

// createGit commits the manifest's files and symlinks, as they are in the anchor now, with the
// anchor's HEAD as parent, and creates the checkpoint ref (refusing to move an existing one).
func (s *Store) createGit(ctx context.Context, m *manifest.Manifest, cp *Checkpoint) error {
	env, cleanup, err := s.tempIndex(ctx)
	if err != nil {
		return err
	}
	defer cleanup()
	var paths bytes.Buffer
	for _, e := range m.Entries {
		if e.Type != manifest.TypeDir {
			paths.WriteString(e.Path)
			paths.WriteByte(0)
		}
	}
	dir := s.cfg.Anchor
	// The anchor holds what workers wrote (their .gitattributes too): no clean filter runs.
	g, err := gitexec.NewUntrusted(ctx, dir)
	if err != nil {
		return err
	}
	if _, err := g.RunEnv(ctx, env, nil, "read-tree", "--empty"); err != nil {
		return err
	}
	// update-index hashes what it is given whether or not .gitignore matches it: the manifest
	// already chose (tracked, untracked, .worktreeinclude, profile rules).
	if _, err := g.RunEnv(ctx, env, paths.Bytes(), "update-index", "--add", "-z", "--stdin"); err != nil {
		return err
	}
	tree, err := g.RunEnv(ctx, env, nil, "write-tree")
	if err != nil {
		return err
	}
	args := []string{"commit-tree", strings.TrimSpace(string(tree)),
		"-m", fmt.Sprintf("openclaw checkpoint %s/%d\n\n%d files, %d bytes", cp.Session, cp.Seq, cp.Files, cp.Bytes)}
	if head, err := gitexec.Line(ctx, dir, "rev-parse", "--verify", "-q", "HEAD^{commit}"); err == nil && head != "" {
		cp.Parent = head
		args = append(args, "-p", head)
	}
	date := cp.Created.Format(time.RFC3339)
	cenv := append(append([]string{}, env...), identity...)
	cenv = append(cenv, "GIT_AUTHOR_DATE="+date, "GIT_COMMITTER_DATE="+date)
	commit, err := g.RunEnv(ctx, cenv, nil, args...)
	if err != nil {
		return err
	}
	cp.Commit = strings.TrimSpace(string(commit))
	cp.Ref = s.refFor(cp.Seq)
	// An empty old value: the ref must not exist yet (another store instance took this number).
	if _, err := gitexec.Run(ctx, dir, "update-ref", "-m", "openclaw checkpoint", cp.Ref, cp.Commit, ""); err != nil {
		return err
	}
	return nil
}

// pruneGit deletes the checkpoints' refs in one transaction, each only if it still points at its
// commit.
func (s *Store) pruneGit(ctx context.Context, old []Checkpoint) error {
	if len(old) == 0 {
		return nil
	}
	var in bytes.Buffer
	for _, cp := range old {
		fmt.Fprintf(&in, "delete %s %s\n", cp.Ref, cp.Commit)
	}
	_, err := gitexec.RunEnv(ctx, s.cfg.Anchor, nil, in.Bytes(), "update-ref", "--stdin")
	return err
}

func (s *Store) listGit(ctx context.Context) ([]Checkpoint, error) {
	prefix := RefPrefix + s.cfg.Session + "/"
	out, err := gitexec.Run(ctx, s.cfg.Anchor, "for-each-ref",
		"--format=%(refname)%00%(objectname)%00%(parent)%00%(committerdate:unix)", prefix)
	if err != nil {
		return nil, err
	}
	var cps []Checkpoint
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Split(sc.Text(), "\x00")
		if len(f) != 4 {
			continue
		}
		seq, err := strconv.ParseUint(strings.TrimPrefix(f[0], prefix), 10, 64)
		if err != nil || seq == 0 {
			continue // not ours
		}
		parent, _, _ := strings.Cut(f[2], " ")
		unix, _ := strconv.ParseInt(f[3], 10, 64)
		cps = append(cps, Checkpoint{Session: s.cfg.Session, Seq: seq, Mode: manifest.ModeGit,
			Created: time.Unix(unix, 0).UTC(), Ref: f[0], Commit: f[1], Parent: parent})
	}
	return cps, nil
}

// restoreGit checks the checkpoint's tree out into a temporary directory with a temporary index,
// then mirrors it into target.
func (s *Store) restoreGit(ctx context.Context, cp Checkpoint, target string) (stream.Stats, error) {
	commit, err := gitexec.Line(ctx, s.cfg.Anchor, "rev-parse", "--verify", cp.Ref+"^{commit}")
	if err != nil {
		return stream.Stats{}, err
	}
	if cp.Commit != "" && commit != cp.Commit {
		return stream.Stats{}, fmt.Errorf("ref %s is at %s, not %s", cp.Ref, commit, cp.Commit)
	}
	tmp, err := os.MkdirTemp("", "openclaw-restore-")
	if err != nil {
		return stream.Stats{}, err
	}
	defer os.RemoveAll(tmp)
	tree := filepath.Join(tmp, "tree")
	if err := os.Mkdir(tree, 0o700); err != nil {
		return stream.Stats{}, err
	}
	// The checkpoint holds what workers wrote (their .gitattributes too): no smudge filter runs.
	g, err := gitexec.NewUntrusted(ctx, s.cfg.Anchor)
	if err != nil {
		return stream.Stats{}, err
	}
	env := []string{"GIT_INDEX_FILE=" + filepath.Join(tmp, "index")}
	if _, err := g.RunEnv(ctx, env, nil, "read-tree", commit); err != nil {
		return stream.Stats{}, err
	}
	if _, err := g.RunEnv(ctx, env, nil, "--work-tree="+tree, "checkout-index", "-a", "-f"); err != nil {
		return stream.Stats{}, err
	}
	want, _, err := manifest.Build(ctx, tree, manifest.Options{Mode: manifest.ModePlain})
	if err != nil {
		return stream.Stats{}, err
	}
	mode := manifest.ModePlain
	if top, err := gitexec.Line(ctx, target, "rev-parse", "--show-toplevel"); err == nil && gitsync.SameDir(top, target) {
		mode = manifest.ModeGit
	}
	return s.apply(ctx, target, mode, want, func(e manifest.Entry) string {
		return filepath.Join(tree, filepath.FromSlash(e.Path))
	})
}

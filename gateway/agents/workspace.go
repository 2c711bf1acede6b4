package agents

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/openclaw/cloudworkers/sync/gitexec"
)

// Bounds of a fork.
const (
	// MaxForkFiles bounds the entries a plain fork (or a git fork's untracked files) copies.
	MaxForkFiles = 200_000
	// MaxForkBytes bounds the bytes a fork copies outside git objects.
	MaxForkBytes = 8 << 30
)

// forkIdentity commits a git fork's uncommitted changes.
var forkIdentity = []string{
	"GIT_AUTHOR_NAME=OpenClaw fork", "GIT_AUTHOR_EMAIL=fork@openclaw.invalid",
	"GIT_COMMITTER_NAME=OpenClaw fork", "GIT_COMMITTER_EMAIL=fork@openclaw.invalid",
}

// isGit reports whether dir is the top of a git work tree.
func isGit(ctx context.Context, dir string) bool {
	top, err := gitexec.Line(ctx, dir, "rev-parse", "--show-toplevel")
	if err != nil {
		return false
	}
	a, _ := filepath.EvalSymlinks(top)
	b, _ := filepath.EvalSymlinks(dir)
	return a != "" && a == b
}

// fork makes dst a copy of src as it is now. Git mode: a clone at src's current commit on the
// branch openclaw-fork, with src's uncommitted and untracked (not ignored) files committed on top
// as one snapshot commit, so the child's worker starts from exactly what the parent sees. Plain
// mode: the files (regular files, directories and symlinks; nothing else).
func fork(ctx context.Context, src, dst string) (mode string, err error) {
	if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
		return "", err
	}
	if !isGit(ctx, src) {
		if err := os.MkdirAll(dst, 0o755); err != nil {
			return "", err
		}
		b := &budget{}
		return "plain", copyTree(ctx, src, dst, b, nil)
	}
	head, err := gitexec.Line(ctx, src, "rev-parse", "--verify", "HEAD^{commit}")
	if err != nil {
		return "", fmt.Errorf("fork %s: the repository has no commit to fork from: %w", src, err)
	}
	if _, err := gitexec.Run(ctx, filepath.Dir(dst), "clone", "--quiet", "--no-checkout", "--no-hardlinks", "--", src, dst); err != nil {
		return "", fmt.Errorf("fork %s: %w", src, err)
	}
	if _, err := gitexec.Run(ctx, dst, "checkout", "--quiet", "-B", "openclaw-fork", head); err != nil {
		return "", fmt.Errorf("fork %s: %w", src, err)
	}
	// Uncommitted changes to tracked files (staged or not), as a binary diff against HEAD.
	diff, err := gitexec.Run(ctx, src, "diff", "--binary", "--no-ext-diff", "--no-textconv", "HEAD")
	if err != nil {
		return "", fmt.Errorf("fork %s: uncommitted changes: %w", src, err)
	}
	if len(bytes.TrimSpace(diff)) > 0 {
		if _, err := gitexec.RunInput(ctx, dst, diff, "apply", "--binary", "--whitespace=nowarn", "-"); err != nil {
			return "", fmt.Errorf("fork %s: apply uncommitted changes: %w", src, err)
		}
	}
	// Untracked files that are not ignored.
	out, err := gitexec.Run(ctx, src, "ls-files", "--others", "--exclude-standard", "-z")
	if err != nil {
		return "", fmt.Errorf("fork %s: untracked files: %w", src, err)
	}
	var untracked []string
	for _, p := range strings.Split(string(out), "\x00") {
		if p != "" {
			untracked = append(untracked, p)
		}
	}
	b := &budget{}
	for _, rel := range untracked {
		if err := copyOne(ctx, filepath.Join(src, rel), filepath.Join(dst, rel), b); err != nil {
			return "", fmt.Errorf("fork %s: %w", src, err)
		}
	}
	if status, _ := gitexec.Run(ctx, dst, "status", "--porcelain"); len(bytes.TrimSpace(status)) > 0 {
		if _, err := gitexec.Run(ctx, dst, "add", "-A"); err != nil {
			return "", err
		}
		if _, err := gitexec.RunEnv(ctx, dst, forkIdentity, nil, "commit", "--quiet", "--no-verify", "--no-gpg-sign",
			"-m", "openclaw: the parent's uncommitted changes at fork time"); err != nil {
			return "", fmt.Errorf("fork %s: commit uncommitted changes: %w", src, err)
		}
	}
	return "git", nil
}

type budget struct {
	files int
	bytes int64
}

func (b *budget) take(n int64) error {
	b.files++
	b.bytes += n
	if b.files > MaxForkFiles {
		return fmt.Errorf("the workspace has more than %d entries to fork", MaxForkFiles)
	}
	if b.bytes > MaxForkBytes {
		return fmt.Errorf("the workspace has more than %d bytes to fork", int64(MaxForkBytes))
	}
	return nil
}

// copyTree copies src's tree into dst; skip names top-level entries left out.
func copyTree(ctx context.Context, src, dst string, b *budget, skip map[string]bool) error {
	return filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		rel, err := filepath.Rel(src, path)
		if err != nil || rel == "." {
			return err
		}
		if skip[rel] {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		return copyOne(ctx, path, filepath.Join(dst, rel), b)
	})
}

// copyOne copies one directory (itself only), regular file or symlink; other types are skipped.
func copyOne(_ context.Context, src, dst string, b *budget) error {
	fi, err := os.Lstat(src)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	switch {
	case fi.IsDir():
		if err := b.take(0); err != nil {
			return err
		}
		return os.MkdirAll(dst, fi.Mode().Perm()|0o700)
	case fi.Mode()&fs.ModeSymlink != 0:
		if err := b.take(0); err != nil {
			return err
		}
		target, err := os.Readlink(src)
		if err != nil {
			return err
		}
		return os.Symlink(target, dst)
	case fi.Mode().IsRegular():
		if err := b.take(fi.Size()); err != nil {
			return err
		}
		in, err := os.Open(src)
		if err != nil {
			return err
		}
		defer in.Close()
		out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, fi.Mode().Perm()|0o600)
		if err != nil {
			return err
		}
		if _, err := io.Copy(out, in); err != nil {
			out.Close()
			return err
		}
		return out.Close()
	}
	return nil
}

var errNoWorkspace = errors.New("the parent has no workspace to fork; spawn with workspace \"empty\"")

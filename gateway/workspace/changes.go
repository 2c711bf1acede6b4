package workspace

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/openclaw/cloudworkers/gateway/placement"
	"github.com/openclaw/cloudworkers/gateway/store"
	"github.com/openclaw/cloudworkers/internal/capbuf"
	"github.com/openclaw/cloudworkers/providers"
	"github.com/openclaw/cloudworkers/sync/gitexec"
	"github.com/openclaw/cloudworkers/sync/gitsync"
	"github.com/openclaw/cloudworkers/sync/manifest"
)

// Bounds of GET /sessions/:id/changes and its diffs.
const (
	MaxChangedCommits = 200
	MaxChangedFiles   = 1000
	// MaxDiffBytes bounds one commit's diff (and each listing's git output).
	MaxDiffBytes = 1 << 20
)

// Changes is what a session's worker brought back to its anchor: the commits on its managed
// branch that no other branch or tag has (nor the snapshot of the user's uncommitted work made
// at dispatch), the files they touch, and the uncommitted files of the
// anchor (work that came back outside commits).
type Changes struct {
	Mode        string        `json:"mode"`
	Branch      string        `json:"branch,omitempty"`
	AnchorDir   string        `json:"anchorDir,omitempty"`
	Commits     []Commit      `json:"commits"`
	Files       []ChangedFile `json:"files"`
	Uncommitted []ChangedFile `json:"uncommitted"`
	// Truncated says a list was cut at its bound.
	Truncated bool `json:"truncated,omitempty"`
}

// Commit is one commit of a managed branch.
type Commit struct {
	ID      string `json:"id"`
	Author  string `json:"author"`
	At      string `json:"at"`
	Subject string `json:"subject"`
}

// ChangedFile is a path with its git status letters (A, M, D, ?? …).
type ChangedFile struct {
	Status string `json:"status"`
	Path   string `json:"path"`
}

// Changes lists what came back to a session's anchor. A session never dispatched, or in plain
// mode, has no commits (plain mode lists no files either: its results are the anchor itself).
func (w *Service) Changes(ctx context.Context, sessionID string) (Changes, error) {
	p, err := w.cfg.Placements.Get(ctx, sessionID)
	if err != nil {
		return Changes{}, err
	}
	out := Changes{Mode: p.SyncMode, AnchorDir: p.AnchorDir, Commits: []Commit{}, Files: []ChangedFile{}, Uncommitted: []ChangedFile{}}
	if manifest.Mode(p.SyncMode) != manifest.ModeGit || p.AnchorDir == "" {
		return out, nil
	}
	out.Branch = placement.Branch(sessionID)
	ref := "refs/heads/" + out.Branch
	// The anchor holds the worker's commits and files: git runs there with no filter, hook or
	// fsmonitor that a worker's .gitattributes or files could name.
	g, err := gitexec.NewUntrusted(ctx, p.AnchorDir)
	if err != nil {
		return out, err
	}
	log, _, err := capped(ctx, g, "log", "--no-show-signature", "--format=%H%x1f%an%x1f%aI%x1f%s", "-n", itoa(MaxChangedCommits+1),
		ref, "--not", "--exclude="+gitsync.BranchPrefix+"*", "--branches", "--tags", "--glob="+gitsync.SnapshotRefPrefix+"*")
	if err != nil {
		return out, err
	}
	for _, line := range strings.Split(strings.TrimSpace(string(log)), "\n") {
		f := strings.Split(line, "\x1f")
		if len(f) != 4 {
			continue
		}
		if len(out.Commits) == MaxChangedCommits {
			out.Truncated = true
			break
		}
		out.Commits = append(out.Commits, Commit{ID: f[0], Author: f[1], At: f[2], Subject: f[3]})
	}
	if n := len(out.Commits); n > 0 && !out.Truncated {
		// --no-ext-diff and --no-textconv: a worker's .gitattributes runs nothing here.
		diff, cut, err := capped(ctx, g, "diff", "--no-ext-diff", "--no-textconv", "--no-renames", "--name-status", "-z",
			out.Commits[n-1].ID+"^", ref)
		if err == nil {
			out.Files, out.Truncated = nameStatus(diff, out.Truncated || cut)
		}
	}
	st, cut, err := capped(ctx, g, "status", "--porcelain=v1", "-z", "--untracked-files=all", "--ignore-submodules=all")
	if err != nil {
		return out, err
	}
	out.Truncated = out.Truncated || cut
	for _, rec := range bytes.Split(st, []byte{0}) {
		if len(rec) < 4 {
			continue
		}
		if len(out.Uncommitted) == MaxChangedFiles {
			out.Truncated = true
			break
		}
		out.Uncommitted = append(out.Uncommitted, ChangedFile{Status: strings.TrimSpace(string(rec[:2])), Path: string(rec[3:])})
	}
	return out, nil
}

// Diff is one commit of a session's managed branch as `git show` prints it (no external diff or
// textconv driver), cut at MaxDiffBytes. The commit must be one Changes lists: any other id is
// refused, so the route shows nothing but what the worker brought back.
func (w *Service) Diff(ctx context.Context, sessionID, commit string) (text string, truncated bool, err error) {
	if len(commit) != 40 || strings.Trim(commit, "0123456789abcdef") != "" {
		return "", false, providers.Fieldf("commit", "must be a full 40-digit commit id, got %.50q", commit)
	}
	ch, err := w.Changes(ctx, sessionID)
	if err != nil {
		return "", false, err
	}
	if !slices.ContainsFunc(ch.Commits, func(c Commit) bool { return c.ID == commit }) {
		return "", false, fmt.Errorf("commit %s is not on session %s's managed branch: %w", commit, sessionID, store.ErrNotFound)
	}
	g, err := gitexec.NewUntrusted(ctx, ch.AnchorDir)
	if err != nil {
		return "", false, err
	}
	b, cut, err := capped(ctx, g, "show", "--no-ext-diff", "--no-textconv", "--no-color", "--format=fuller", "--stat", "-p", commit)
	return string(b), cut, err
}

// capped runs git and keeps at most MaxDiffBytes of its output.
func capped(ctx context.Context, g *gitexec.Untrusted, args ...string) ([]byte, bool, error) {
	w := capbuf.New(MaxDiffBytes)
	err := g.Stream(ctx, nil, w, args...)
	return w.Bytes(), w.Truncated, err
}

// nameStatus parses `git diff --name-status -z` (status NUL path NUL …), up to MaxChangedFiles.
func nameStatus(b []byte, truncated bool) ([]ChangedFile, bool) {
	out := []ChangedFile{}
	f := bytes.Split(bytes.TrimSuffix(b, []byte{0}), []byte{0})
	for i := 0; i+1 < len(f); i += 2 {
		if len(out) == MaxChangedFiles {
			return out, true
		}
		out = append(out, ChangedFile{Status: string(f[i]), Path: string(f[i+1])})
	}
	return out, truncated
}

func itoa(n int) string { return strconv.Itoa(n) }

package sessions

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"

	"github.com/openclaw/cloudworkers/gateway/store"
	"github.com/openclaw/cloudworkers/providers"
	"github.com/openclaw/cloudworkers/sync/gitexec"
)

// SetTitle renames a session.
func (s *Store) SetTitle(ctx context.Context, id, title string) error {
	if len(title) > MaxTitleLen {
		return providers.Fieldf("title", "longer than %d bytes", MaxTitleLen)
	}
	res, err := s.db.W.ExecContext(ctx, `UPDATE sessions SET title=?, updated_at=? WHERE id=?`, title, store.FormatTime(s.now()), id)
	if err != nil {
		return fmt.Errorf("set title of session %s: %w", id, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return notFound(id)
	}
	s.Notify(ChangeSessionUpdated, id)
	return nil
}

// SetWorkspace points a session at another workspace directory (for example the gateway-owned
// anchor holding a worker's results after pull-back).
func (s *Store) SetWorkspace(ctx context.Context, id, dir string) error {
	res, err := s.db.W.ExecContext(ctx, `UPDATE sessions SET workspace=?, updated_at=? WHERE id=?`, dir, store.FormatTime(s.now()), id)
	if err != nil {
		return fmt.Errorf("set workspace of session %s: %w", id, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return notFound(id)
	}
	s.Notify(ChangeSessionUpdated, id)
	return nil
}

// CheckWorkspace refuses a workspace a session cannot run in, before anything is written or leased:
// a path that is not absolute and clean, that does not exist or is not a directory, and — when git
// is set (the user asked for git mode) — one that is not inside a git work tree. The error is a
// *providers.FieldError naming "workspace" (or "git").
func CheckWorkspace(ctx context.Context, dir string, git bool) error {
	if dir == "" {
		if git {
			return providers.Fieldf("workspace", "is required with git")
		}
		return nil
	}
	if !filepath.IsAbs(dir) || filepath.Clean(dir) != dir {
		return providers.Fieldf("workspace", "must be a clean absolute path, got %q", dir)
	}
	fi, err := os.Stat(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return providers.Fieldf("workspace", "%s does not exist (a session never creates its user's workspace)", dir)
	case err != nil:
		return providers.Fieldf("workspace", "%s cannot be read: %v", dir, err)
	case !fi.IsDir():
		return providers.Fieldf("workspace", "%s is not a directory", dir)
	}
	if git {
		if err := gitWorkTree(ctx, dir); err != nil {
			if strings.Contains(err.Error(), "not a git repository") {
				// git's own words add nothing but a second sentence
				return providers.Fieldf("git", "workspace %s is not a git work tree (run git init there, or leave out --git)", dir)
			}
			return providers.Fieldf("git", "workspace %s is not a git work tree: %v", dir, err)
		}
	}
	return nil
}

// gitWorkTree reports (as nil) that dir is inside a git work tree, with the same isolated
// configuration the dispatch uses to decide the sync mode; otherwise git's bounded reason.
func gitWorkTree(ctx context.Context, dir string) error {
	cmd := exec.CommandContext(ctx, "git", append(slices.Clone(gitexec.SafeConfig), "-C", dir, "rev-parse", "--is-inside-work-tree")...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.TempDir(), "GIT_CONFIG_NOSYSTEM=1"}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err == nil && strings.TrimSpace(string(out)) == "true" {
		return nil
	}
	msg := strings.Join(strings.Fields(stderr.String()), " ")
	if len(msg) > 300 {
		msg = msg[:300] + "…"
	}
	switch {
	case msg != "":
		return errors.New(msg)
	case err != nil:
		return err
	}
	return errors.New("it is inside a git directory but not in a work tree")
}

// Roots confines the directories a workspace may name. A workspace from any door (API, CLI, UI,
// MCP, the agent tools, OCC) must resolve — symlinks followed, ".." cleaned — inside one of the
// allowed roots, and may never be, contain or lie inside the gateway's data dir (whose tokens,
// credentials key and database a worker would otherwise receive), nor be "/", the operator's
// home, or any of the system directories below. The zero value allows every directory but those.
type Roots struct {
	allowed []string
	dataDir string
	home    string
	owned   []string
}

// systemDirs may never be a workspace; a workspace may not lie inside the ones marked true either.
var systemDirs = map[string]bool{"/": false, "/root": false, "/etc": true, "/proc": true, "/sys": true, "/dev": true, "/boot": true}

// OwnedWorkspaceAreas are the data dir's subdirectories that hold workspaces the gateway made itself
// (forks of spawned agents, OCC agents' workspaces, pull-back anchors, the managed git worktrees a
// pull-back leaves a git session in): a session's stored workspace may lie there, a path from a
// door never.
var OwnedWorkspaceAreas = []string{"agents", "workspaces", "anchors", "worktrees", filepath.Join("occ", "workspaces")}

// NewRoots resolves the allowed roots (field names the config key of the list, for errors) and the
// data dir. A root must be an absolute path to an existing directory.
func NewRoots(field string, allowed []string, dataDir, home string) (Roots, error) {
	r := Roots{}
	for i, root := range allowed {
		f := fmt.Sprintf("%s[%d]", field, i)
		if !filepath.IsAbs(root) {
			return Roots{}, providers.Fieldf(f, "must be an absolute path, got %q", root)
		}
		res, err := filepath.EvalSymlinks(filepath.Clean(root))
		if err != nil {
			return Roots{}, providers.Fieldf(f, "%s: %v", root, err)
		}
		if fi, err := os.Stat(res); err != nil || !fi.IsDir() {
			return Roots{}, providers.Fieldf(f, "%s is not a directory", root)
		}
		r.allowed = append(r.allowed, res)
	}
	if dataDir != "" {
		res, err := filepath.EvalSymlinks(filepath.Clean(dataDir))
		if err != nil {
			return Roots{}, fmt.Errorf("data dir %s: %w", dataDir, err)
		}
		r.dataDir = res
		for _, a := range OwnedWorkspaceAreas {
			r.owned = append(r.owned, filepath.Join(res, a))
		}
	}
	if home != "" {
		if res, err := filepath.EvalSymlinks(filepath.Clean(home)); err == nil {
			r.home = res
		} else {
			r.home = filepath.Clean(home)
		}
	}
	return r, nil
}

// Narrow returns r confined further to allowed (a narrower token's roots): a workspace must then
// lie inside one of r's roots and one of these. None leaves r as it is.
func (r Roots) Narrow(field string, allowed []string) (Roots, error) {
	if len(allowed) == 0 {
		return r, nil
	}
	n, err := NewRoots(field, allowed, "", "")
	if err != nil {
		return Roots{}, err
	}
	out := r
	out.allowed = nil
	for _, a := range n.allowed {
		if len(r.allowed) == 0 || slices.ContainsFunc(r.allowed, func(root string) bool { return within(a, root) }) {
			out.allowed = append(out.allowed, a)
			continue
		}
		for _, root := range r.allowed {
			if within(root, a) {
				out.allowed = append(out.allowed, root)
			}
		}
	}
	if len(out.allowed) == 0 {
		return Roots{}, providers.Fieldf(field, "no directory of %v lies inside the gateway's workspaces.roots %v", allowed, r.allowed)
	}
	return out, nil
}

// Allowed lists the resolved roots (none: every directory but the refused ones).
func (r Roots) Allowed() []string { return slices.Clone(r.allowed) }

// Start is where a folder browser starts: the operator's home when it lies inside the roots (the
// default root is the home), else the first root.
func (r Roots) Start() string {
	if r.home != "" && r.inside(r.home) {
		return r.home
	}
	if len(r.allowed) > 0 {
		return r.allowed[0]
	}
	return "/"
}

// Browse checks a directory a folder browser may list (the New Session page choosing a cwd) and
// returns it with symlinks resolved. It must lie inside the roots, never be or lie inside the data
// dir or one of the system directories a workspace may not lie in. Unlike Check, the operator's
// home and a directory that holds the data dir may be listed: a workspace is chosen inside them.
func (r Roots) Browse(field, dir string) (string, error) {
	if !filepath.IsAbs(dir) {
		return "", providers.Fieldf(field, "must be an absolute path, got %q", dir)
	}
	res, err := filepath.EvalSymlinks(filepath.Clean(dir))
	if err != nil {
		return "", providers.Fieldf(field, "%s cannot be resolved: %v", dir, err)
	}
	for sys, inside := range systemDirs {
		if inside && within(res, sys) {
			return "", providers.Fieldf(field, "%s is refused: it is or lies inside %s", dir, sys)
		}
	}
	if r.dataDir != "" && within(res, r.dataDir) {
		return "", providers.Fieldf(field, "%s is refused: it is or lies inside the gateway's data dir", dir)
	}
	if !r.inside(res) {
		return "", providers.Fieldf(field, "%s is refused: it lies outside the workspace roots %v (config workspaces.roots)", dir, r.allowed)
	}
	return res, nil
}

// inside reports whether a resolved directory lies inside one of the roots (all, when none is set).
func (r Roots) inside(res string) bool {
	return len(r.allowed) == 0 || slices.ContainsFunc(r.allowed, func(root string) bool { return within(res, root) })
}

// Check refuses a workspace named by a door: the error is a *providers.FieldError naming field
// and the rule that refused it. A directory that does not exist yet is judged by its nearest
// existing parent.
func (r Roots) Check(field, dir string) error { return r.check(field, dir, false) }

// CheckStored is Check for a session's recorded workspace, which may also lie in one of the data
// dir's areas of gateway-made workspaces (OwnedWorkspaceAreas).
func (r Roots) CheckStored(field, dir string) error { return r.check(field, dir, true) }

func (r Roots) check(field, dir string, stored bool) error {
	if !filepath.IsAbs(dir) {
		return providers.Fieldf(field, "must be an absolute path, got %q", dir)
	}
	res, err := resolveExisting(filepath.Clean(dir))
	if err != nil {
		return providers.Fieldf(field, "%s cannot be resolved: %v", dir, err)
	}
	name := dir
	if res != filepath.Clean(dir) {
		name = fmt.Sprintf("%s (resolved: %s)", dir, res)
	}
	for sys, inside := range systemDirs {
		if res == sys || (inside && within(res, sys)) {
			return providers.Fieldf(field, "%s is refused: a workspace may not be %s%s", name, sys, map[bool]string{true: " or lie inside it"}[inside])
		}
	}
	if r.home != "" && res == r.home {
		return providers.Fieldf(field, "%s is refused: a workspace may not be the operator's home directory (it holds ~/.ssh and other credentials); name a project directory inside it", name)
	}
	if r.dataDir != "" {
		owned := stored && slices.ContainsFunc(r.owned, func(a string) bool { return within(res, a) && res != a })
		switch {
		case owned:
			return nil
		case within(res, r.dataDir):
			return providers.Fieldf(field, "%s is refused: it is or lies inside the gateway's data dir %s (its tokens, credentials key and database never leave the gateway)", name, r.dataDir)
		case within(r.dataDir, res):
			return providers.Fieldf(field, "%s is refused: it contains the gateway's data dir %s (its tokens, credentials key and database never leave the gateway)", name, r.dataDir)
		}
	}
	if len(r.allowed) > 0 && !slices.ContainsFunc(r.allowed, func(root string) bool { return within(res, root) }) {
		return providers.Fieldf(field, "%s is refused: it lies outside the workspace roots %v (config workspaces.roots)", name, r.allowed)
	}
	return nil
}

// within reports whether path is dir or lies inside it (both clean and absolute).
func within(path, dir string) bool {
	if path == dir || dir == "/" {
		return true
	}
	return strings.HasPrefix(path, dir+string(filepath.Separator))
}

// resolveExisting resolves symlinks in dir's longest existing prefix and appends the rest.
func resolveExisting(dir string) (string, error) {
	rest := ""
	for p := dir; ; p = filepath.Dir(p) {
		res, err := filepath.EvalSymlinks(p)
		if err == nil {
			return filepath.Join(res, rest), nil
		}
		if !errors.Is(err, fs.ErrNotExist) || p == filepath.Dir(p) {
			return "", err
		}
		rest = filepath.Join(filepath.Base(p), rest)
	}
}

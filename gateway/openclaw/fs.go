package openclaw

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// The folder browser of the New Session page: fs.listDir lists the directories a session's cwd may
// name, and worktrees.branches says whether the chosen one is a git checkout. Both take
// operator.admin, as naming a cwd does (OpenClaw asks only operator.write for fs.listDir: the
// names of the operator's directories are not for a narrower token here).
const (
	// maxListScan bounds the directory entries one fs.listDir reads; maxListEntries the
	// directories it returns.
	maxListScan    = 10000
	maxListEntries = 2000
)

type fsListDirParams struct {
	Path   string `json:"path"`
	NodeID string `json:"nodeId"`
}

type dirEntry struct {
	Name   string `json:"name"`
	Path   string `json:"path"`
	Hidden bool   `json:"hidden,omitempty"`
}

// fsListDir lists the subdirectories of one directory inside workspaces.roots (the start, by
// default: the operator's home). A symlink is listed only when it leads to a directory the browser
// may list; the data dir, system directories and anything outside the roots are neither listed
// nor listable.
func (c *conn) fsListDir(f inFrame) (any, *errorShape) {
	var p fsListDirParams
	if err := decodeParams(f.Method, f.Params, &p); err != nil {
		return nil, err
	}
	if p.NodeID != "" {
		return nil, errf(CodeInvalidRequest, fmt.Sprintf("fs.listDir: this gateway has no nodes (nodeId %.64q)", p.NodeID))
	}
	roots := c.srv.cfg.Sessions.Roots()
	dir := p.Path
	if dir == "" {
		dir = roots.Start()
	}
	res, err := roots.Browse("path", dir)
	if err != nil {
		return nil, errf(CodeInvalidRequest, fmt.Sprintf("fs.listDir: %v", err))
	}
	entries, err := listDirs(res, func(path string) bool { _, err := roots.Browse("path", path); return err == nil })
	if err != nil {
		var pe *os.PathError
		if errors.As(err, &pe) {
			err = pe.Err
		}
		return nil, errf(CodeInvalidRequest, fmt.Sprintf("fs.listDir: %s: %v", res, err))
	}
	out := map[string]any{"path": res, "home": roots.Start(), "entries": entries}
	if parent := filepath.Dir(res); parent != res {
		if pres, err := roots.Browse("path", parent); err == nil {
			out["parent"] = pres
		}
	}
	return out, nil
}

// listDirs returns the subdirectories of dir that may be listed, visible ones first, by name.
func listDirs(dir string, listable func(string) bool) ([]dirEntry, error) {
	d, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	entries := []dirEntry{}
	for scanned := 0; scanned < maxListScan && len(entries) < maxListEntries; {
		batch, err := d.ReadDir(256)
		scanned += len(batch)
		for _, de := range batch {
			path := filepath.Join(dir, de.Name())
			isDir := de.IsDir()
			if de.Type()&os.ModeSymlink != 0 {
				fi, err := os.Stat(path)
				isDir = err == nil && fi.IsDir()
			}
			if !isDir || !listable(path) || len(entries) >= maxListEntries {
				continue
			}
			entries = append(entries, dirEntry{Name: de.Name(), Path: path, Hidden: strings.HasPrefix(de.Name(), ".")})
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
	}
	sort.Slice(entries, func(i, j int) bool {
		if entries[i].Hidden != entries[j].Hidden {
			return !entries[i].Hidden
		}
		return entries[i].Name < entries[j].Name
	})
	return entries, nil
}

type branchesParams struct {
	RepoRoot                string `json:"repoRoot"`
	IncludeRepositoryStatus bool   `json:"includeRepositoryStatus"`
}

// worktreesBranches says whether a directory the browser may list is a git checkout. It does not
// list branches (branchesUnavailable): a session starts on the checkout as it is.
func (c *conn) worktreesBranches(f inFrame) (any, *errorShape) {
	var p branchesParams
	if err := decodeParams(f.Method, f.Params, &p); err != nil {
		return nil, err
	}
	res, err := c.srv.cfg.Sessions.Roots().Browse("repoRoot", p.RepoRoot)
	if err != nil {
		return nil, errf(CodeInvalidRequest, fmt.Sprintf("worktrees.branches: %v", err))
	}
	status := "not_git"
	if _, err := os.Lstat(filepath.Join(res, ".git")); err == nil {
		status = "git"
	}
	out := map[string]any{"branches": []any{}, "branchesUnavailable": true}
	if p.IncludeRepositoryStatus {
		out["repositoryStatus"] = status
	}
	return out, nil
}

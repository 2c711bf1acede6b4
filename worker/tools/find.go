package tools

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"github.com/openclaw/cloudworkers/protocol"
)

const (
	defaultFindLimit = 1000
	defaultLsLimit   = 500
)

type findTool struct{ s *Set }

var _ Tool = (*findTool)(nil)

func (t *findTool) Name() string { return "find" }

func (t *findTool) Schema() protocol.Tool {
	return schema("find", fmt.Sprintf("Find files and directories by glob pattern. A pattern without '/' matches the "+
		"base name ('*.go'); one with '/' matches the path relative to the search directory ('src/**/*_test.go'). "+
		"Supports *, ?, [...], ** and {a,b}. Skips .git, node_modules and .gitignore'd paths. Directories end in '/'. "+
		"Returns at most limit results (default %d).", defaultFindLimit),
		`{"type":"object","properties":{`+
			`"pattern":{"type":"string","description":"Glob pattern, e.g. '*.ts', '**/*.json' or 'src/**/*.spec.ts'"},`+
			`"path":{"type":"string","description":"Directory to search in (default: the workspace)"},`+
			`"limit":{"type":"integer","minimum":1,"description":"Maximum number of results (default 1000)"}},`+
			`"required":["pattern"]}`)
}

func (t *findTool) Run(ctx context.Context, args json.RawMessage) (Result, error) {
	var a struct {
		Pattern string `json:"pattern"`
		Path    string `json:"path"`
		Limit   optInt `json:"limit"`
	}
	if err := decodeArgs(args, &a); err != nil {
		return invalidArgs("find", err), nil
	}
	if a.Pattern == "" {
		return invalidArgs("find", errors.New("pattern is required")), nil
	}
	if _, err := path.Match(strings.ReplaceAll(a.Pattern, "**", "*"), ""); err != nil {
		return invalidArgs("find", fmt.Errorf("bad glob pattern %q: %v", a.Pattern, err)), nil
	}
	limit := a.Limit.or(defaultFindLimit)
	if limit < 1 {
		return invalidArgs("find", fmt.Errorf("limit must be >= 1, got %d", limit)), nil
	}
	root, bad := t.s.resolveDir("find", a.Path)
	if bad != nil {
		return *bad, nil
	}
	ig := newIgnorer(t.s.cfg.Workspace)
	var found []string
	limitHit := false
	stop := errors.New("stop")
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if p == root {
				return err
			}
			return nil
		}
		if cerr := ctx.Err(); cerr != nil {
			return cerr
		}
		if p == root {
			return nil
		}
		if ig.ignored(p, d.IsDir()) {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		rel, _ := filepath.Rel(root, p)
		rel = filepath.ToSlash(rel)
		if globMatchesPath(a.Pattern, rel) {
			if len(found) >= limit {
				limitHit = true
				return stop
			}
			if d.IsDir() {
				rel += "/"
			}
			found = append(found, rel)
		}
		return nil
	})
	if err != nil && !errors.Is(err, stop) {
		if ctx.Err() != nil {
			return errorf("find: %v", ctx.Err()), nil
		}
		return t.s.pathErr("find", a.Path, err), nil
	}
	details := map[string]any{"count": len(found), "limitReached": limitHit}
	if len(found) == 0 {
		return withDetails(textResult("No files found matching pattern"), details), nil
	}
	out, cut := limitText(strings.Join(found, "\n"), t.s.cfg.MaxOutputBytes)
	details["truncated"] = cut
	if limitHit {
		out += fmt.Sprintf("\n\n[%d results limit reached; use limit=%d for more, or refine the pattern]", limit, limit*2)
	}
	return withDetails(textResult(out), details), nil
}

type lsTool struct{ s *Set }

var _ Tool = (*lsTool)(nil)

func (t *lsTool) Name() string { return "ls" }

func (t *lsTool) Schema() protocol.Tool {
	return schema("ls", fmt.Sprintf("List a directory: entries sorted alphabetically, dotfiles included, directories "+
		"with a trailing '/'. Returns at most limit entries (default %d).", defaultLsLimit),
		`{"type":"object","properties":{`+
			`"path":{"type":"string","description":"Directory to list (default: the workspace)"},`+
			`"limit":{"type":"integer","minimum":1,"description":"Maximum number of entries (default 500)"}}}`)
}

func (t *lsTool) Run(ctx context.Context, args json.RawMessage) (Result, error) {
	var a struct {
		Path  string `json:"path"`
		Limit optInt `json:"limit"`
	}
	if err := decodeArgs(args, &a); err != nil {
		return invalidArgs("ls", err), nil
	}
	limit := a.Limit.or(defaultLsLimit)
	if limit < 1 {
		return invalidArgs("ls", fmt.Errorf("limit must be >= 1, got %d", limit)), nil
	}
	dir, bad := t.s.resolveDir("ls", a.Path)
	if bad != nil {
		return *bad, nil
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return t.s.pathErr("ls", a.Path, err), nil
	}
	names := make([]string, 0, len(entries))
	for _, e := range entries {
		name := e.Name()
		isDir := e.IsDir()
		if e.Type()&fs.ModeSymlink != 0 {
			if fi, err := os.Stat(filepath.Join(dir, name)); err == nil && fi.IsDir() {
				isDir = true
			}
		}
		if isDir {
			name += "/"
		}
		names = append(names, name)
	}
	slices.SortFunc(names, func(x, y string) int {
		if c := strings.Compare(strings.ToLower(x), strings.ToLower(y)); c != 0 {
			return c
		}
		return strings.Compare(x, y)
	})
	details := map[string]any{"path": t.s.display(dir), "count": len(names), "limitReached": len(names) > limit}
	if len(names) == 0 {
		return withDetails(textResult("(empty directory)"), details), nil
	}
	shown := names[:min(limit, len(names))]
	out, _ := limitText(strings.Join(shown, "\n"), t.s.cfg.MaxOutputBytes)
	if len(names) > limit {
		out += fmt.Sprintf("\n\n[%d more entries; limit of %d reached; use limit=%d for more]", len(names)-limit, limit, len(names))
	}
	return withDetails(textResult(out), details), nil
}

package tools

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/openclaw/cloudworkers/protocol"
)

const (
	defaultGrepLimit = 100
	// grepMaxLineLen cuts long matching lines in the output.
	grepMaxLineLen = 500
	// grepMaxFileBytes skips files larger than this.
	grepMaxFileBytes = 50 << 20
)

type grepTool struct{ s *Set }

var _ Tool = (*grepTool)(nil)

func (t *grepTool) Name() string { return "grep" }

func (t *grepTool) Schema() protocol.Tool {
	return schema("grep", fmt.Sprintf("Search file contents for a pattern (RE2 regular expression, or literal text). "+
		"Skips .git, node_modules, binary files and paths ignored by .gitignore. Output lines are path:line: text "+
		"(context lines path-line- text). Returns at most limit matches (default %d) and %s.", defaultGrepLimit, formatSize(t.s.cfg.MaxOutputBytes)),
		`{"type":"object","properties":{`+
			`"pattern":{"type":"string","description":"Search pattern (regular expression, or literal text with literal=true)"},`+
			`"path":{"type":"string","description":"Directory or file to search (default: the workspace)"},`+
			`"glob":{"type":"string","description":"Only search files matching this glob, e.g. '*.go' or 'src/**/*.ts'"},`+
			`"ignoreCase":{"type":"boolean","description":"Case-insensitive search"},`+
			`"literal":{"type":"boolean","description":"Treat pattern as literal text, not a regular expression"},`+
			`"context":{"type":"integer","minimum":0,"description":"Lines of context before and after each match"},`+
			`"limit":{"type":"integer","minimum":1,"description":"Maximum number of matches (default 100)"}},`+
			`"required":["pattern"]}`)
}

var errGrepDone = errors.New("grep: done")

func (t *grepTool) Run(ctx context.Context, args json.RawMessage) (Result, error) {
	var a struct {
		Pattern    *string `json:"pattern"`
		Path       string  `json:"path"`
		Glob       string  `json:"glob"`
		IgnoreCase optBool `json:"ignoreCase"`
		Literal    optBool `json:"literal"`
		Context    optInt  `json:"context"`
		Limit      optInt  `json:"limit"`
	}
	if err := decodeArgs(args, &a); err != nil {
		return invalidArgs("grep", err), nil
	}
	if a.Pattern == nil || *a.Pattern == "" {
		return invalidArgs("grep", errors.New("pattern is required")), nil
	}
	limit := a.Limit.or(defaultGrepLimit)
	ctxLines := a.Context.or(0)
	if limit < 1 || ctxLines < 0 {
		return invalidArgs("grep", errors.New("limit must be >= 1 and context >= 0")), nil
	}
	ctxLines = min(ctxLines, 50)
	expr := *a.Pattern
	if a.Literal {
		expr = regexp.QuoteMeta(expr)
	}
	if a.IgnoreCase {
		expr = "(?i)" + expr
	}
	re, err := regexp.Compile(expr)
	if err != nil {
		return errorf("grep: invalid regular expression: %v (set literal=true to search for the text as is)", err), nil
	}
	root, err := t.s.resolve(a.Path)
	if err != nil {
		return t.s.pathErr("grep", a.Path, err), nil
	}
	fi, err := os.Stat(root)
	if err != nil {
		return t.s.pathErr("grep", a.Path, err), nil
	}

	g := &grepRun{re: re, ctxLines: ctxLines, limit: limit, maxBytes: t.s.cfg.MaxOutputBytes}
	ig := newIgnorer(t.s.cfg.Workspace)
	show := func(abs string) string {
		if !fi.IsDir() {
			return t.s.display(abs)
		}
		rel, _ := filepath.Rel(root, abs)
		return filepath.ToSlash(rel)
	}
	walkErr := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if p == root {
				return err
			}
			return nil // unreadable entry: skip
		}
		if cerr := ctx.Err(); cerr != nil {
			return cerr
		}
		if p != root && ig.ignored(p, d.IsDir()) {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if d.IsDir() || !d.Type().IsRegular() {
			return nil
		}
		if a.Glob != "" && p != root && !globMatchesPath(a.Glob, show(p)) {
			return nil
		}
		return g.file(p, show(p))
	})
	if walkErr != nil && !errors.Is(walkErr, errGrepDone) {
		if ctx.Err() != nil {
			return errorf("grep: %v", ctx.Err()), nil
		}
		return t.s.pathErr("grep", a.Path, walkErr), nil
	}
	details := map[string]any{"matches": g.matches, "files": g.files, "limitReached": g.limitHit, "truncated": g.bytesHit}
	if g.matches == 0 {
		return withDetails(textResult("No matches found"), details), nil
	}
	out := strings.TrimRight(g.out.String(), "\n")
	switch {
	case g.limitHit:
		out += fmt.Sprintf("\n\n[%d matches limit reached; use limit=%d for more, or refine the pattern]", limit, limit*2)
	case g.bytesHit:
		out += fmt.Sprintf("\n\n[output limit of %s reached after %d matches; refine the pattern or use path/glob]", formatSize(g.maxBytes), g.matches)
	}
	return withDetails(textResult(out), details), nil
}

type grepRun struct {
	re       *regexp.Regexp
	ctxLines int
	limit    int
	maxBytes int
	out      bytes.Buffer
	matches  int
	files    int
	limitHit bool
	bytesHit bool
}

func (g *grepRun) emit(s string) error {
	if g.out.Len()+len(s) > g.maxBytes {
		g.bytesHit = true
		return errGrepDone
	}
	g.out.WriteString(s)
	return nil
}

func cutLine(b []byte) string {
	if len(b) > grepMaxLineLen {
		return string(b[:runeStart(b, grepMaxLineLen)]) + "… [truncated]"
	}
	return string(b)
}

// file searches one file; errGrepDone stops the walk.
func (g *grepRun) file(abs, shown string) error {
	f, err := os.Open(abs)
	if err != nil {
		return nil
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil || fi.Size() > grepMaxFileBytes {
		return nil
	}
	r := bufio.NewReaderSize(f, 64<<10)
	if head, _ := r.Peek(8000); isBinary(head) {
		return nil
	}
	type held struct {
		n    int
		text string
	}
	var (
		before    []held // the last ctxLines lines, for context
		after     int    // context lines still to print after a match
		lastShown int    // the last line number printed in this file
		buf       []byte
		lineNo    int
		found     bool
	)
	for {
		var full int
		var rerr error
		buf, full, rerr = readLine(r, 64<<10, buf)
		if full == 0 {
			break
		}
		lineNo++
		line, _ := trimEOL(buf, full, rerr == nil)
		if g.re.Match(line) {
			if !found {
				found = true
				g.files++
			}
			if g.matches >= g.limit {
				g.limitHit = true
				return errGrepDone
			}
			first := lineNo
			if len(before) > 0 {
				first = before[0].n
			}
			if g.ctxLines > 0 && lastShown > 0 && first > lastShown+1 {
				if err := g.emit("--\n"); err != nil {
					return err
				}
			}
			for _, h := range before {
				if err := g.emit(fmt.Sprintf("%s-%d- %s\n", shown, h.n, h.text)); err != nil {
					return err
				}
			}
			before = before[:0]
			if err := g.emit(fmt.Sprintf("%s:%d: %s\n", shown, lineNo, cutLine(line))); err != nil {
				return err
			}
			g.matches++
			lastShown, after = lineNo, g.ctxLines
		} else if after > 0 {
			if err := g.emit(fmt.Sprintf("%s-%d- %s\n", shown, lineNo, cutLine(line))); err != nil {
				return err
			}
			lastShown = lineNo
			after--
		} else if g.ctxLines > 0 {
			before = append(before, held{lineNo, cutLine(line)})
			if len(before) > g.ctxLines {
				before = before[1:]
			}
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			return nil
		}
	}
	return nil
}

package tools

import (
	"bufio"
	"bytes"
	"os"
	"path"
	"path/filepath"
	"strings"
)

// maxBraceExpansions bounds the patterns one {a,b} glob expands to.
const maxBraceExpansions = 256

// matchGlob reports whether the slash-separated name matches pattern: '*', '?' and '[...]' within
// one path segment, '**' across any number of segments, and '{a,b}' alternatives.
func matchGlob(pattern, name string) bool {
	nameSegs := strings.Split(name, "/")
	for _, p := range expandBraces(pattern, 0) {
		if matchSegs(strings.Split(p, "/"), nameSegs) {
			return true
		}
	}
	return false
}

func matchSegs(pat, name []string) bool {
	for len(pat) > 0 {
		if pat[0] == "**" {
			for len(pat) > 1 && pat[1] == "**" {
				pat = pat[1:]
			}
			for i := 0; i <= len(name); i++ {
				if matchSegs(pat[1:], name[i:]) {
					return true
				}
			}
			return false
		}
		if len(name) == 0 {
			return false
		}
		if ok, err := path.Match(pat[0], name[0]); err != nil || !ok {
			return false
		}
		pat, name = pat[1:], name[1:]
	}
	return len(name) == 0
}

// expandBraces expands the first top-level {a,b,...} group of p, recursively.
func expandBraces(p string, depth int) []string {
	open := strings.IndexByte(p, '{')
	if open < 0 || depth > 8 {
		return []string{p}
	}
	level, close := 0, -1
	var commas []int
	for i := open; i < len(p) && close < 0; i++ {
		switch p[i] {
		case '{':
			level++
		case '}':
			level--
			if level == 0 {
				close = i
			}
		case ',':
			if level == 1 {
				commas = append(commas, i)
			}
		}
	}
	if close < 0 || len(commas) == 0 {
		return []string{p}
	}
	var out []string
	prev := open + 1
	for _, c := range append(commas, close) {
		for _, e := range expandBraces(p[:open]+p[prev:c]+p[close+1:], depth+1) {
			if len(out) < maxBraceExpansions {
				out = append(out, e)
			}
		}
		prev = c + 1
	}
	return out
}

// globMatchesPath applies a find/grep glob: a pattern with a '/' matches the path relative to
// the search root, any other pattern the base name.
func globMatchesPath(pattern, rel string) bool {
	if strings.Contains(pattern, "/") {
		return matchGlob(strings.TrimPrefix(pattern, "./"), rel) || matchGlob(pattern, rel)
	}
	return matchGlob(pattern, path.Base(rel))
}

// alwaysSkipped are directories never walked.
var alwaysSkipped = map[string]bool{".git": true, "node_modules": true}

type ignoreRule struct {
	pattern  string
	negate   bool
	dirOnly  bool
	anchored bool
}

func (r ignoreRule) match(rel string, isDir bool) bool {
	if r.dirOnly && !isDir {
		return false
	}
	if r.anchored {
		return matchGlob(r.pattern, rel)
	}
	return matchGlob(r.pattern, path.Base(rel))
}

func parseGitignore(data []byte) []ignoreRule {
	var rules []ignoreRule
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		line := strings.TrimRight(sc.Text(), " \t\r")
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		var r ignoreRule
		if strings.HasPrefix(line, "!") {
			r.negate, line = true, line[1:]
		}
		line = strings.TrimPrefix(line, `\`)
		if strings.HasSuffix(line, "/") {
			r.dirOnly, line = true, strings.TrimRight(line, "/")
		}
		if strings.Contains(line, "/") {
			r.anchored, line = true, strings.TrimPrefix(line, "/")
		}
		if line == "" {
			continue
		}
		r.pattern = line
		rules = append(rules, r)
	}
	return rules
}

// ignorer answers whether a path under root is ignored by .gitignore files from root down, or is
// one of the always-skipped directories. It belongs to one walk.
type ignorer struct {
	root  string
	cache map[string][]ignoreRule
}

func newIgnorer(root string) *ignorer {
	return &ignorer{root: root, cache: map[string][]ignoreRule{}}
}

func (ig *ignorer) rules(dir string) []ignoreRule {
	if r, ok := ig.cache[dir]; ok {
		return r
	}
	var rules []ignoreRule
	if data, err := os.ReadFile(filepath.Join(dir, ".gitignore")); err == nil && len(data) < 1<<20 {
		rules = parseGitignore(data)
	}
	ig.cache[dir] = rules
	return rules
}

func (ig *ignorer) ignored(abs string, isDir bool) bool {
	if isDir && alwaysSkipped[filepath.Base(abs)] {
		return true
	}
	rel, err := filepath.Rel(ig.root, abs)
	if err != nil || !within(ig.root, abs) || rel == "." {
		return false
	}
	parts := strings.Split(filepath.ToSlash(rel), "/")
	ignored := false
	dir := ig.root
	for i := range parts {
		sub := strings.Join(parts[i:], "/")
		for _, r := range ig.rules(dir) {
			if r.match(sub, isDir) {
				ignored = !r.negate
			}
		}
		dir = filepath.Join(dir, parts[i])
	}
	return ignored
}

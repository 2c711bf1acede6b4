package manifest

import (
	"path"
	"regexp"
	"strings"
)

// Rules is a list of gitignore-style patterns (as in .gitignore and .worktreeinclude): blank lines
// and "#" comments are ignored, "!" negates, a trailing "/" matches directories only, a pattern with
// a "/" elsewhere is anchored at the root, "*", "?", "[…]" and "**" glob. The last matching pattern
// wins; a path is matched when it or one of its parent directories is.
type Rules struct {
	pats []pattern
}

type pattern struct {
	re      *regexp.Regexp
	negate  bool
	dirOnly bool
	base    bool // matched against the base name only
}

// ParseRules parses patterns, one per element (lines of a file, or profile settings).
func ParseRules(lines []string) *Rules {
	r := &Rules{}
	for _, l := range lines {
		l = strings.TrimRight(l, "\r")
		if strings.HasSuffix(l, " ") && !strings.HasSuffix(l, `\ `) {
			l = strings.TrimRight(l, " ")
		}
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		var p pattern
		if strings.HasPrefix(l, "!") {
			p.negate, l = true, l[1:]
		} else if strings.HasPrefix(l, `\!`) || strings.HasPrefix(l, `\#`) {
			l = l[1:]
		}
		if strings.HasSuffix(l, "/") {
			p.dirOnly, l = true, strings.TrimRight(l, "/")
		}
		if l == "" {
			continue
		}
		if !strings.Contains(l, "/") {
			p.base = true
		}
		l = strings.TrimPrefix(l, "/")
		re, err := regexp.Compile(globToRegexp(l))
		if err != nil {
			continue // a malformed pattern matches nothing, as in git
		}
		p.re = re
		r.pats = append(r.pats, p)
	}
	return r
}

// Empty reports whether there are no patterns.
func (r *Rules) Empty() bool { return r == nil || len(r.pats) == 0 }

// matchSelf applies the patterns to p itself; ok is false when none matches.
func (r *Rules) matchSelf(p string, isDir bool) (matched, ok bool) {
	base := path.Base(p)
	for i := len(r.pats) - 1; i >= 0; i-- {
		pt := r.pats[i]
		if pt.dirOnly && !isDir {
			continue
		}
		s := p
		if pt.base {
			s = base
		}
		if pt.re.MatchString(s) {
			return !pt.negate, true
		}
	}
	return false, false
}

// Match reports whether p (slash-separated, relative) is matched, itself or through a parent
// directory.
func (r *Rules) Match(p string, isDir bool) bool {
	if r.Empty() {
		return false
	}
	// A matched parent directory matches everything below it.
	for i := 0; i < len(p); i++ {
		if p[i] == '/' {
			if m, ok := r.matchSelf(p[:i], true); ok && m {
				return true
			}
		}
	}
	m, _ := r.matchSelf(p, isDir)
	return m
}

// MatchSelf reports whether p itself is matched, ignoring its parents (for walks that already
// decided about the parents).
func (r *Rules) MatchSelf(p string, isDir bool) bool {
	if r.Empty() {
		return false
	}
	m, _ := r.matchSelf(p, isDir)
	return m
}

func globToRegexp(g string) string {
	var b strings.Builder
	b.WriteString("^")
	for i := 0; i < len(g); i++ {
		c := g[i]
		switch {
		case c == '*' && i+1 < len(g) && g[i+1] == '*':
			i++
			if i+1 < len(g) && g[i+1] == '/' {
				i++
				b.WriteString("(?:.*/)?")
			} else {
				b.WriteString(".*")
			}
		case c == '*':
			b.WriteString("[^/]*")
		case c == '?':
			b.WriteString("[^/]")
		case c == '[':
			end := strings.IndexByte(g[i+1:], ']')
			if end < 0 {
				b.WriteString(`\[`)
				continue
			}
			class := g[i+1 : i+1+end]
			i += end + 1
			if strings.HasPrefix(class, "!") {
				class = "^" + class[1:]
			}
			class = strings.ReplaceAll(class, `\`, `\\`)
			class = strings.ReplaceAll(class, `[`, `\[`)
			b.WriteString("[" + class + "]")
		case c == '\\' && i+1 < len(g):
			i++
			b.WriteString(regexp.QuoteMeta(string(g[i])))
		default:
			b.WriteString(regexp.QuoteMeta(string(c)))
		}
	}
	b.WriteString("$")
	return b.String()
}

// Package secretscan finds credentials in what a worker brought back — the gateway's own
// credential values (exact, base64 and URL-encoded) and common credential shapes — and names each
// hit by path, line and rule, never by the secret itself.
package secretscan

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"math"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"

	"github.com/openclaw/cloudworkers/sync/manifest"
)

// KnownRulePrefix names the rule of a hit on a credential value the gateway holds:
// "gateway-credential:<name>".
const KnownRulePrefix = "gateway-credential:"

// minKnownLen: a held value shorter than this is not searched for (it would match by chance).
const minKnownLen = 8

// Finding is one hit: where, and which rule. It never holds the matched text.
type Finding struct {
	Path string `json:"path"`
	Line int    `json:"line"`
	Rule string `json:"rule"`
}

func (f Finding) String() string { return fmt.Sprintf("%s:%d %s", f.Path, f.Line, f.Rule) }

// Allow lets one rule's hits in one path through (a known false positive).
type Allow struct {
	Rule, Path string
}

// ParseAllow reads RULE:PATH (the rule's name has no ':'; the path is the rest).
func ParseAllow(s string) (Allow, error) {
	rule, path, ok := strings.Cut(s, ":")
	if !ok || rule == "" || path == "" {
		return Allow{}, fmt.Errorf("allowed secret %q must be RULE:PATH (a rule and a path a refusal named)", s)
	}
	if !validRule(rule) && rule != "gateway-credential" {
		return Allow{}, fmt.Errorf("allowed secret %q: unknown rule %q (rules: %s, %s<name>)", s, rule, strings.Join(RuleNames(), ", "), KnownRulePrefix)
	}
	// gateway-credential:<name>:PATH — the credential's name is part of the rule.
	if rule == "gateway-credential" {
		name, p, ok := strings.Cut(path, ":")
		if !ok || name == "" || p == "" {
			return Allow{}, fmt.Errorf("allowed secret %q must be %s<name>:PATH", s, KnownRulePrefix)
		}
		rule, path = KnownRulePrefix+name, p
	}
	return Allow{Rule: rule, Path: path}, nil
}

func (a Allow) String() string { return a.Rule + ":" + a.Path }

// MaxFindings bounds the findings of one scan (of a file, a blob at all its paths, a tree or a set
// of commits): content a box sent cannot make the gateway hold more (a blob of secret-shaped
// lines at thousands of paths would be millions). Past it, the scan stops; one finding already
// refuses the adoption.
const MaxFindings = 1000

// Add appends hits to found up to MaxFindings and reports whether there is room for more.
func Add(found []Finding, hits ...Finding) ([]Finding, bool) {
	found = append(found, hits[:min(len(hits), max(0, MaxFindings-len(found)))]...)
	return found, len(found) < MaxFindings
}

// FoundError stops an adoption that would bring back a secret; nothing was adopted.
type FoundError struct {
	Findings []Finding
}

func (e *FoundError) Error() string {
	shown := e.Findings
	if len(shown) > 10 {
		shown = shown[:10]
	}
	parts := make([]string, len(shown))
	for i, f := range shown {
		parts[i] = f.String()
	}
	more, count := "", strconv.Itoa(len(e.Findings))
	if len(e.Findings) > len(shown) {
		more = fmt.Sprintf(" and %d more", len(e.Findings)-len(shown))
	}
	if len(e.Findings) >= MaxFindings {
		count, more = "at least "+count, more+" (the scan stopped there)"
	}
	return fmt.Sprintf("secret scan: what the worker brought back holds %s likely secret(s): %s%s; nothing was adopted "+
		"(remove them on the box, or let a known false positive through with `openclaw session pullback SESSION --allow-secret RULE:PATH`)",
		count, strings.Join(parts, ", "), more)
}

// rule is a credential shape: re matches it; group, when > 0, is the submatch whose entropy
// must reach minEntropy.
type rule struct {
	name       string
	re         *regexp.Regexp
	group      int
	minEntropy float64
}

// rules: a small set in the spirit of gitleaks' (whose library is not among this module's
// dependencies): the shapes providers document for their keys, private key blocks, and an
// assignment of a high-entropy value to a name that says it is secret.
var rules = []rule{
	{name: "aws-access-key-id", re: regexp.MustCompile(`\b(?:AKIA|ASIA|ABIA|ACCA|A3T[A-Z0-9])[A-Z2-7]{16}\b`)},
	{name: "github-token", re: regexp.MustCompile(`\b(?:gh[pousr]_[A-Za-z0-9]{36,255}|github_pat_[A-Za-z0-9_]{82})\b`)},
	{name: "private-key", re: regexp.MustCompile(`-----BEGIN[ A-Z0-9_-]{0,100}PRIVATE KEY(?: BLOCK)?-----`)},
	{name: "slack-token", re: regexp.MustCompile(`\bxox[baprse]-[0-9A-Za-z-]{10,250}`)},
	{name: "slack-webhook", re: regexp.MustCompile(`https://hooks\.slack\.com/(?:services|workflows)/[A-Za-z0-9+/]{43,56}`)},
	{name: "anthropic-api-key", re: regexp.MustCompile(`\bsk-ant-(?:api|admin)[0-9]{2}-[A-Za-z0-9_-]{80,120}`)},
	{name: "openai-api-key", re: regexp.MustCompile(`\bsk-(?:(?:proj|svcacct|admin)-[A-Za-z0-9_-]{40,200}|[A-Za-z0-9]{20}T3BlbkFJ[A-Za-z0-9]{20})`)},
	{name: "generic-secret", group: 1, minEntropy: 3.5, re: regexp.MustCompile(
		`(?i)(?:secret|token|passw(?:or)?d|api[_-]?key|access[_-]?key|auth[_-]?key|private[_-]?key|credential)[a-z0-9_.-]*["']?\s*(?::=|=|:)\s*["'` + "`" + `]?([A-Za-z0-9+/_.=~-]{20,200})`)},
}

func validRule(name string) bool {
	for _, r := range rules {
		if r.name == name {
			return true
		}
	}
	return false
}

// RuleNames lists the pattern rules.
func RuleNames() []string {
	names := make([]string, len(rules))
	for i, r := range rules {
		names[i] = r.name
	}
	return names
}

// needle is one encoding of a held credential value.
type needle struct {
	rule string
	b    []byte
}

// Scanner scans content for the credential values it was given and for the pattern rules.
type Scanner struct {
	needles []needle
	overlap int
	allow   map[Allow]bool
}

// New returns a scanner for the credential values held by the gateway (name → value) that
// lets the allowed hits through.
func New(values map[string]string, allow []Allow) *Scanner {
	s := &Scanner{overlap: 512, allow: map[Allow]bool{}}
	for _, a := range allow {
		s.allow[a] = true
	}
	names := make([]string, 0, len(values))
	for n := range values {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, name := range names {
		v := values[name]
		if len(v) < minKnownLen {
			continue
		}
		seen := map[string]bool{}
		for _, enc := range encodings(v) {
			if len(enc) < minKnownLen || seen[enc] {
				continue
			}
			seen[enc] = true
			s.needles = append(s.needles, needle{rule: KnownRulePrefix + name, b: []byte(enc)})
			s.overlap = max(s.overlap, len(enc))
		}
	}
	return s
}

// encodings are the forms of v searched for: itself, URL-encoded (query and path escaping),
// and base64 (standard and URL alphabets) at each of the three alignments v can have inside a
// longer encoded text (only the characters that depend on v alone).
func encodings(v string) []string {
	out := []string{v, url.QueryEscape(v), url.PathEscape(v)}
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.URLEncoding} {
		for i := range 3 {
			b := enc.EncodeToString(append(make([]byte, i), v...))
			from, to := (8*i+5)/6, 8*(i+len(v))/6
			if to > from {
				out = append(out, b[from:to])
			}
		}
	}
	return out
}

// ScanReader scans one file's content, line by line (a line longer than the read buffer in
// windows that overlap by the longest needle), and returns its hits that are not allowed.
func (s *Scanner) ScanReader(path string, r io.Reader) ([]Finding, error) {
	return s.ScanShared([]string{path}, r)
}

// ScanShared is ScanReader for content found at several paths (one blob in several places of a
// tree): each hit is reported, or allowed, at each path.
func (s *Scanner) ScanShared(paths []string, r io.Reader) ([]Finding, error) {
	hits, err := s.scan(r)
	var found []Finding
	for _, p := range paths {
		for _, h := range hits {
			if f := (Finding{Path: p, Line: h.line, Rule: h.rule}); !s.allow[Allow{Rule: f.Rule, Path: p}] {
				var room bool
				if found, room = Add(found, f); !room {
					return found, err
				}
			}
		}
	}
	return found, err
}

// ScanText scans a text held in memory (a commit message, a symlink's target), naming its hits
// by where.
func (s *Scanner) ScanText(where string, text []byte) []Finding {
	f, _ := s.ScanReader(where, bytes.NewReader(text))
	return f
}

type hit struct {
	line int
	rule string
}

func (s *Scanner) scan(r io.Reader) ([]hit, error) {
	br := bufio.NewReaderSize(r, 64<<10)
	var found []hit
	seen := map[hit]bool{}
	line := 1
	var carry []byte // the tail of a long line's previous window
	for {
		b, err := br.ReadSlice('\n')
		if len(b) > 0 {
			window := append(carry, b...)
			for _, rule := range s.scanLine(window) {
				if h := (hit{line, rule}); !seen[h] {
					seen[h] = true
					found = append(found, h)
				}
			}
			if len(found) >= MaxFindings {
				return found, nil // the caller drains or closes what is left
			}
			carry = carry[:0]
			if errors.Is(err, bufio.ErrBufferFull) {
				// the line goes on: its next window starts with this one's tail
				carry = append(carry, window[max(0, len(window)-s.overlap):]...)
			} else {
				line++
			}
		}
		switch {
		case err == nil, errors.Is(err, bufio.ErrBufferFull):
			continue
		case errors.Is(err, io.EOF):
			return found, nil
		default:
			return found, err
		}
	}
}

// scanLine returns the rules that match b.
func (s *Scanner) scanLine(b []byte) []string {
	var out []string
	for _, n := range s.needles {
		if bytes.Contains(b, n.b) {
			out = append(out, n.rule)
		}
	}
	for _, r := range rules {
		if r.group == 0 {
			if r.re.Match(b) {
				out = append(out, r.name)
			}
			continue
		}
		for _, m := range r.re.FindAllSubmatchIndex(b, -1) {
			if v := b[m[2*r.group]:m[2*r.group+1]]; entropy(v) >= r.minEntropy && mixed(v) {
				out = append(out, r.name)
				break
			}
		}
	}
	return out
}

// entropy is the Shannon entropy of b in bits per byte.
func entropy(b []byte) float64 {
	var counts [256]int
	for _, c := range b {
		counts[c]++
	}
	h := 0.0
	for _, n := range counts {
		if n > 0 {
			p := float64(n) / float64(len(b))
			h -= p * math.Log2(p)
		}
	}
	return h
}

// mixed: a generated secret has digits and letters; a word or a path rarely does both.
func mixed(b []byte) bool {
	var digit, letter bool
	for _, c := range b {
		switch {
		case c >= '0' && c <= '9':
			digit = true
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z':
			letter = true
		}
	}
	return digit && letter
}

// ScanTree scans the files (their content) and symlinks (their targets) of entries below root
// — a staging directory that mirrors the tree a plan writes — naming hits by the entries' paths.
// Nothing is followed: a file is opened with O_NOFOLLOW.
func (s *Scanner) ScanTree(root string, entries []manifest.Entry) ([]Finding, error) {
	var found []Finding
	for _, e := range entries {
		switch e.Type {
		case manifest.TypeSymlink:
			var room bool
			if found, room = Add(found, s.ScanText(e.Path, []byte(e.Target))...); !room {
				return found, nil
			}
		case manifest.TypeFile:
			f, err := os.OpenFile(filepath.Join(root, filepath.FromSlash(e.Path)), os.O_RDONLY|syscall.O_NOFOLLOW, 0)
			if err != nil {
				return found, fmt.Errorf("secret scan %s: %w", e.Path, err)
			}
			hits, err := s.ScanReader(e.Path, f)
			f.Close()
			var room bool
			found, room = Add(found, hits...)
			if err != nil {
				return found, fmt.Errorf("secret scan %s: %w", e.Path, err)
			}
			if !room {
				return found, nil
			}
		}
	}
	return found, nil
}

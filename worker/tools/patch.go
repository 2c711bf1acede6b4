package tools

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"

	"github.com/openclaw/cloudworkers/internal/atomicfile"
	"github.com/openclaw/cloudworkers/protocol"
)

type patchTool struct{ s *Set }

var _ Tool = (*patchTool)(nil)

func (t *patchTool) Name() string { return "apply_patch" }

func (t *patchTool) Schema() protocol.Tool {
	return schema("apply_patch", `Apply a patch to files in the workspace, all or nothing. The input uses this format:
*** Begin Patch
*** Add File: path/new.txt
+first line of the new file
*** Delete File: path/old.txt
*** Update File: path/file.go
*** Move to: path/renamed.go   (optional)
@@ func example()              (optional context line to find first)
 unchanged context line
-removed line
+added line
*** End of File                (optional: the hunk ends at the end of the file)
*** End Patch
Give about 3 lines of context around each change. If any hunk does not match, no file is changed.`,
		`{"type":"object","properties":{`+
			`"input":{"type":"string","description":"The entire patch, from *** Begin Patch to *** End Patch"}},`+
			`"required":["input"]}`)
}

type patchOp struct {
	kind   string // Add, Delete, Update
	path   string
	moveTo string
	lines  []string // Add: the file's lines
	hunks  []hunk
}

type hunk struct {
	header   string // text after "@@ "
	old, new []string
	ctx      []int // for each line of new: its index in old when it is a context line, else -1
	eof      bool
}

func (h hunk) name(i int) string {
	if h.header != "" {
		return fmt.Sprintf("hunk %d (@@ %s)", i+1, h.header)
	}
	return fmt.Sprintf("hunk %d", i+1)
}

// PatchError is a patch that cannot be parsed or applied.
type PatchError struct {
	Line int // 1-based line of the patch, when parsing
	Msg  string
}

func (e *PatchError) Error() string {
	if e.Line > 0 {
		return fmt.Sprintf("line %d: %s", e.Line, e.Msg)
	}
	return e.Msg
}

// parsePatch parses the Codex apply_patch format.
func parsePatch(input string) ([]patchOp, error) {
	lines := strings.Split(strings.ReplaceAll(strings.TrimSpace(input), "\r\n", "\n"), "\n")
	// Tolerate the patch wrapped in a shell heredoc: <<'EOF' ... EOF.
	if len(lines) >= 2 && strings.HasPrefix(strings.TrimSpace(lines[0]), "<<") {
		lines = lines[1 : len(lines)-1]
	}
	if len(lines) == 0 || strings.TrimSpace(lines[0]) != "*** Begin Patch" {
		return nil, &PatchError{Line: 1, Msg: "the first line must be '*** Begin Patch'"}
	}
	if strings.TrimSpace(lines[len(lines)-1]) != "*** End Patch" {
		return nil, &PatchError{Line: len(lines), Msg: "the last line must be '*** End Patch'"}
	}
	var ops []patchOp
	body := lines[1 : len(lines)-1]
	isHeader := func(l string) bool {
		return strings.HasPrefix(l, "*** Add File: ") || strings.HasPrefix(l, "*** Delete File: ") ||
			strings.HasPrefix(l, "*** Update File: ") || strings.TrimSpace(l) == "*** End Patch"
	}
	for i := 0; i < len(body); {
		l := body[i]
		lineNo := i + 2
		switch {
		case strings.HasPrefix(l, "*** Add File: "):
			op := patchOp{kind: "Add", path: strings.TrimSpace(strings.TrimPrefix(l, "*** Add File: "))}
			i++
			for ; i < len(body) && !isHeader(body[i]); i++ {
				if !strings.HasPrefix(body[i], "+") {
					return nil, &PatchError{Line: i + 2, Msg: fmt.Sprintf("Add File %s: every line must start with '+', got %q", op.path, body[i])}
				}
				op.lines = append(op.lines, body[i][1:])
			}
			ops = append(ops, op)
		case strings.HasPrefix(l, "*** Delete File: "):
			ops = append(ops, patchOp{kind: "Delete", path: strings.TrimSpace(strings.TrimPrefix(l, "*** Delete File: "))})
			i++
		case strings.HasPrefix(l, "*** Update File: "):
			op := patchOp{kind: "Update", path: strings.TrimSpace(strings.TrimPrefix(l, "*** Update File: "))}
			i++
			if i < len(body) && strings.HasPrefix(body[i], "*** Move to: ") {
				op.moveTo = strings.TrimSpace(strings.TrimPrefix(body[i], "*** Move to: "))
				i++
			}
			var cur *hunk
			for ; i < len(body) && !isHeader(body[i]); i++ {
				hl := body[i]
				switch {
				case hl == "@@" || strings.HasPrefix(hl, "@@ "):
					op.hunks = append(op.hunks, hunk{header: strings.TrimSpace(strings.TrimPrefix(hl, "@@"))})
					cur = &op.hunks[len(op.hunks)-1]
					continue
				case strings.TrimSpace(hl) == "*** End of File":
					if cur == nil {
						return nil, &PatchError{Line: i + 2, Msg: fmt.Sprintf("Update File %s: '*** End of File' outside a hunk", op.path)}
					}
					cur.eof = true
					continue
				}
				if cur == nil { // the first hunk may omit its @@ line
					op.hunks = append(op.hunks, hunk{})
					cur = &op.hunks[len(op.hunks)-1]
				}
				switch {
				case hl == "" || hl[0] == ' ':
					text := strings.TrimPrefix(hl, " ")
					cur.ctx = append(cur.ctx, len(cur.old))
					cur.old, cur.new = append(cur.old, text), append(cur.new, text)
				case hl[0] == '-':
					cur.old = append(cur.old, hl[1:])
				case hl[0] == '+':
					cur.ctx = append(cur.ctx, -1)
					cur.new = append(cur.new, hl[1:])
				default:
					return nil, &PatchError{Line: i + 2, Msg: fmt.Sprintf("Update File %s: expected a line starting with ' ', '-', '+' or '@@', got %q", op.path, hl)}
				}
			}
			if len(op.hunks) == 0 && op.moveTo == "" {
				return nil, &PatchError{Line: lineNo, Msg: fmt.Sprintf("Update File %s: no hunks", op.path)}
			}
			ops = append(ops, op)
		case strings.TrimSpace(l) == "":
			i++
		default:
			return nil, &PatchError{Line: lineNo, Msg: fmt.Sprintf("expected '*** Add File: ', '*** Delete File: ' or '*** Update File: ', got %q", l)}
		}
		if len(ops) > 0 && ops[len(ops)-1].path == "" {
			return nil, &PatchError{Line: lineNo, Msg: "missing file path"}
		}
	}
	if len(ops) == 0 {
		return nil, &PatchError{Msg: "the patch holds no file operations"}
	}
	return ops, nil
}

// applyHunks applies the hunks of one Update to content.
func applyHunks(content string, hunks []hunk) (string, error) {
	lines := strings.Split(content, "\n")
	if len(lines) > 0 && lines[len(lines)-1] == "" {
		lines = lines[:len(lines)-1]
	}
	type repl struct {
		at, n int
		with  []string
	}
	var repls []repl
	cursor := 0
	for i, h := range hunks {
		if h.header != "" {
			idx := seekLines(lines, []string{h.header}, cursor, false)
			if idx < 0 {
				return "", fmt.Errorf("%s: context line %q not found", h.name(i), h.header)
			}
			cursor = idx + 1
		}
		if len(h.old) == 0 {
			repls = append(repls, repl{at: len(lines), with: h.new})
			continue
		}
		old, with := h.old, h.new
		idx := seekLines(lines, old, cursor, h.eof)
		if idx < 0 && old[len(old)-1] == "" {
			old = old[:len(old)-1]
			if len(with) > 0 && with[len(with)-1] == "" {
				with = with[:len(with)-1]
			}
			idx = seekLines(lines, old, cursor, h.eof)
		}
		if idx < 0 {
			return "", fmt.Errorf("%s did not match; expected these lines (from line %d on):\n%s", h.name(i), cursor+1,
				limitLines(old, 20))
		}
		// Context lines keep the file's text (the match may have ignored whitespace).
		with = append([]string(nil), with...)
		for j := range with {
			if k := h.ctx[j]; k >= 0 && k < len(old) {
				with[j] = lines[idx+k]
			}
		}
		repls = append(repls, repl{at: idx, n: len(old), with: with})
		cursor = idx + len(old)
	}
	for i := len(repls) - 1; i >= 0; i-- {
		r := repls[i]
		tail := append(append([]string(nil), r.with...), lines[r.at+r.n:]...)
		lines = append(lines[:r.at], tail...)
	}
	if len(lines) == 0 {
		return "", nil
	}
	return strings.Join(lines, "\n") + "\n", nil
}

func limitLines(l []string, n int) string {
	var b strings.Builder
	for i, s := range l {
		if i == n {
			fmt.Fprintf(&b, "  [... %d more lines]\n", len(l)-n)
			break
		}
		b.WriteString("  " + s + "\n")
	}
	return strings.TrimRight(b.String(), "\n")
}

// seekLines finds pat in lines at or after start: exactly, then ignoring trailing whitespace,
// then ignoring surrounding whitespace. With eof it first tries the end of the file.
func seekLines(lines, pat []string, start int, eof bool) int {
	if len(pat) > len(lines) {
		return -1
	}
	eqs := []func(a, b string) bool{
		func(a, b string) bool { return a == b },
		func(a, b string) bool { return strings.TrimRight(a, " \t\r") == strings.TrimRight(b, " \t\r") },
		func(a, b string) bool { return strings.TrimSpace(a) == strings.TrimSpace(b) },
	}
	for _, eq := range eqs {
		match := func(at int) bool {
			for j, p := range pat {
				if !eq(lines[at+j], p) {
					return false
				}
			}
			return true
		}
		if eof {
			if at := len(lines) - len(pat); at >= start && match(at) {
				return at
			}
		}
		for at := start; at+len(pat) <= len(lines); at++ {
			if match(at) {
				return at
			}
		}
	}
	return -1
}

// vfile is the patched state of one path.
type vfile struct {
	orig, content string
	existed       bool
	exists        bool
}

func (t *patchTool) Run(ctx context.Context, args json.RawMessage) (Result, error) {
	var a struct {
		Input *string `json:"input"`
		Patch *string `json:"patch"` // accepted alias
	}
	if err := decodeArgs(args, &a); err != nil {
		return invalidArgs("apply_patch", err), nil
	}
	if a.Input == nil {
		a.Input = a.Patch
	}
	if a.Input == nil || strings.TrimSpace(*a.Input) == "" {
		return invalidArgs("apply_patch", errors.New("input is required")), nil
	}
	ops, err := parsePatch(*a.Input)
	if err != nil {
		return errorf("apply_patch: invalid patch: %v. No file was changed.", err), nil
	}
	// Resolve every path first so nothing happens when one is refused.
	var paths []string
	resolved := map[string]string{}
	for _, op := range ops {
		for _, p := range []string{op.path, op.moveTo} {
			if p == "" {
				continue
			}
			abs, err := t.s.resolve(p)
			if err != nil {
				return errorf("apply_patch: %v. No file was changed.", err), nil
			}
			resolved[p] = abs
			paths = append(paths, abs)
		}
	}
	unlock := lockFiles(paths...)
	defer unlock()

	state := map[string]*vfile{}
	var order []string
	load := func(abs string) (*vfile, error) {
		if f, ok := state[abs]; ok {
			return f, nil
		}
		f := &vfile{}
		b, err := os.ReadFile(abs)
		switch {
		case err == nil:
			f.orig, f.content, f.existed, f.exists = string(b), string(b), true, true
		case errors.Is(err, fs.ErrNotExist):
		default:
			return nil, err
		}
		state[abs] = f
		order = append(order, abs)
		return f, nil
	}
	var summary []string
	fail := func(format string, a ...any) (Result, error) {
		return errorf("apply_patch: "+format+". No file was changed.", a...), nil
	}
	for _, op := range ops {
		abs := resolved[op.path]
		f, err := load(abs)
		if err != nil {
			return fail("%s %s: %v", op.kind, op.path, err)
		}
		switch op.kind {
		case "Add":
			if fi, err := os.Stat(abs); err == nil && fi.IsDir() {
				return fail("Add File %s: is a directory", op.path)
			}
			f.content, f.exists = "", true
			if len(op.lines) > 0 {
				f.content = strings.Join(op.lines, "\n") + "\n"
			}
			summary = append(summary, "A "+t.s.display(abs))
		case "Delete":
			if !f.exists {
				return fail("Delete File %s: file not found", op.path)
			}
			f.content, f.exists = "", false
			summary = append(summary, "D "+t.s.display(abs))
		case "Update":
			if !f.exists {
				return fail("Update File %s: file not found", op.path)
			}
			next, err := applyHunks(f.content, op.hunks)
			if err != nil {
				return fail("Update File %s: %v", op.path, err)
			}
			if op.moveTo == "" {
				f.content = next
				summary = append(summary, "M "+t.s.display(abs))
				break
			}
			dst := resolved[op.moveTo]
			g, err := load(dst)
			if err != nil {
				return fail("Move to %s: %v", op.moveTo, err)
			}
			f.content, f.exists = "", false
			g.content, g.exists = next, true
			summary = append(summary, "M "+t.s.display(dst))
		}
	}
	if err := ctx.Err(); err != nil {
		return fail("%v", err)
	}
	if err := commitFiles(state, order); err != nil {
		return errorf("apply_patch: %v", err), nil
	}
	return withDetails(textResult("Success. Updated the following files:\n"+strings.Join(summary, "\n")),
		map[string]any{"files": summary}), nil
}

// commitFiles writes the patched state: every new content is staged in a temp file first, then
// renamed into place, then deletions run. A failure while renaming restores what was replaced.
func commitFiles(state map[string]*vfile, order []string) error {
	staged := map[string]*atomicfile.Staged{}
	cleanup := func() {
		for _, st := range staged {
			st.Discard()
		}
	}
	for _, abs := range order {
		f := state[abs]
		if !f.exists || (f.existed && f.content == f.orig) {
			continue
		}
		st, err := stageFile(abs, []byte(f.content), 0o644)
		if err != nil {
			cleanup()
			return fmt.Errorf("write %s: %w. No file was changed", abs, err)
		}
		staged[abs] = st
	}
	var done []string
	rollback := func() {
		for _, abs := range done {
			f := state[abs]
			if f.existed {
				_ = writeFileAtomic(abs, []byte(f.orig), 0o644)
			} else {
				os.Remove(abs)
			}
		}
	}
	for _, abs := range order {
		st, ok := staged[abs]
		if !ok {
			continue
		}
		if err := st.Commit(); err != nil {
			cleanup()
			rollback()
			return fmt.Errorf("write %s: %w; changes were rolled back", abs, err)
		}
		delete(staged, abs)
		done = append(done, abs)
	}
	for _, abs := range order {
		f := state[abs]
		if f.existed && !f.exists {
			if err := os.Remove(abs); err != nil && !errors.Is(err, fs.ErrNotExist) {
				rollback()
				return fmt.Errorf("delete %s: %w; changes were rolled back", abs, err)
			}
			done = append(done, abs)
		}
	}
	return nil
}

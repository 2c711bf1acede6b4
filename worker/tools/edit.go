package tools

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/openclaw/cloudworkers/protocol"
)

type editTool struct{ s *Set }

var _ Tool = (*editTool)(nil)

func (t *editTool) Name() string { return "edit" }

func (t *editTool) Schema() protocol.Tool {
	return schema("edit", "Edit a file by replacing exact text. Each oldText must match the current file exactly "+
		"(including whitespace) and exactly once, unless replaceAll is set. Edits apply in order, each to the result "+
		"of the previous one, and all or nothing: if any edit fails the file is left unchanged.",
		`{"type":"object","properties":{`+
			`"path":{"type":"string","description":"Path to the file to edit (relative to the workspace, or absolute inside it)"},`+
			`"edits":{"type":"array","minItems":1,"description":"Replacements to apply in order","items":{"type":"object","properties":{`+
			`"oldText":{"type":"string","description":"Exact text to find and replace"},`+
			`"newText":{"type":"string","description":"Text to replace it with"},`+
			`"replaceAll":{"type":"boolean","description":"Replace every occurrence instead of requiring exactly one"}},`+
			`"required":["oldText","newText"]}}},`+
			`"required":["path","edits"]}`)
}

type editSpec struct {
	OldText    *string `json:"oldText"`
	NewText    *string `json:"newText"`
	ReplaceAll optBool `json:"replaceAll"`
}

func (t *editTool) Run(ctx context.Context, args json.RawMessage) (Result, error) {
	var a struct {
		Path  string     `json:"path"`
		Edits []editSpec `json:"edits"`
		// The single-edit shape of older upstream versions.
		OldText    *string `json:"oldText"`
		NewText    *string `json:"newText"`
		ReplaceAll optBool `json:"replaceAll"`
	}
	if err := decodeArgs(args, &a); err != nil {
		return invalidArgs("edit", err), nil
	}
	if len(a.Edits) == 0 && a.OldText != nil {
		a.Edits = []editSpec{{OldText: a.OldText, NewText: a.NewText, ReplaceAll: a.ReplaceAll}}
	}
	switch {
	case a.Path == "":
		return invalidArgs("edit", errors.New("path is required")), nil
	case len(a.Edits) == 0:
		return invalidArgs("edit", errors.New("edits must hold at least one {oldText, newText}")), nil
	}
	for i, e := range a.Edits {
		switch {
		case e.OldText == nil || e.NewText == nil:
			return invalidArgs("edit", fmt.Errorf("edits[%d]: oldText and newText are required", i)), nil
		case *e.OldText == "":
			return invalidArgs("edit", fmt.Errorf("edits[%d]: oldText must not be empty", i)), nil
		}
	}
	abs, unlock, bad := t.s.lockPath(ctx, "edit", a.Path)
	if bad != nil {
		return *bad, nil
	}
	defer unlock()
	raw, err := os.ReadFile(abs)
	if err != nil {
		return t.s.pathErr("edit", a.Path, err), nil
	}
	shown := t.s.display(abs)
	content := string(raw)
	crlf := strings.Contains(content, "\r\n")
	total := 0
	firstLine := 0
	for i, e := range a.Edits {
		oldText, newText := *e.OldText, *e.NewText
		n := strings.Count(content, oldText)
		if n == 0 && crlf && !strings.Contains(oldText, "\r\n") {
			// The model saw LF line endings; match and write in the file's CRLF.
			oldText = strings.ReplaceAll(oldText, "\n", "\r\n")
			newText = strings.ReplaceAll(newText, "\n", "\r\n")
			n = strings.Count(content, oldText)
		}
		prefix := ""
		if len(a.Edits) > 1 {
			prefix = fmt.Sprintf("edits[%d]: ", i)
		}
		switch {
		case n == 0:
			return errorf("edit: %soldText not found in %s (0 matches); it must match exactly, including whitespace and indentation. The file is unchanged.", prefix, shown), nil
		case n > 1 && !bool(e.ReplaceAll):
			return errorf("edit: %soldText matches %d times in %s; add surrounding context to make it unique, or set replaceAll. The file is unchanged.", prefix, n, shown), nil
		}
		idx := strings.Index(content, oldText)
		if line := strings.Count(content[:idx], "\n") + 1; firstLine == 0 || line < firstLine {
			firstLine = line
		}
		if e.ReplaceAll {
			content = strings.ReplaceAll(content, oldText, newText)
		} else {
			content = content[:idx] + newText + content[idx+len(oldText):]
		}
		total += n
	}
	if content == string(raw) {
		return errorf("edit: the edits leave %s unchanged (newText equals oldText)", shown), nil
	}
	if err := writeFileAtomic(abs, []byte(content), 0o644); err != nil {
		return t.s.pathErr("edit", a.Path, err), nil
	}
	return withDetails(textResult(fmt.Sprintf("Successfully replaced %d occurrence(s) in %s (%d edit(s)).", total, shown, len(a.Edits))),
		map[string]any{"path": shown, "replacements": total, "edits": len(a.Edits), "firstChangedLine": firstLine}), nil
}

package tools

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/openclaw/cloudworkers/protocol"
)

type writeTool struct{ s *Set }

var _ Tool = (*writeTool)(nil)

func (t *writeTool) Name() string { return "write" }

func (t *writeTool) Schema() protocol.Tool {
	return schema("write", "Write content to a file. Creates the file if it does not exist and overwrites it if it does "+
		"(or appends with append=true). Parent directories are created.",
		`{"type":"object","properties":{`+
			`"path":{"type":"string","description":"Path to the file to write (relative to the workspace, or absolute inside it)"},`+
			`"content":{"type":"string","description":"Content to write to the file"},`+
			`"append":{"type":"boolean","description":"Append to the end of the file instead of overwriting it"}},`+
			`"required":["path","content"]}`)
}

func (t *writeTool) Run(ctx context.Context, args json.RawMessage) (Result, error) {
	var a struct {
		Path    string  `json:"path"`
		Content *string `json:"content"`
		Append  optBool `json:"append"`
	}
	if err := decodeArgs(args, &a); err != nil {
		return invalidArgs("write", err), nil
	}
	switch {
	case a.Path == "":
		return invalidArgs("write", errors.New("path is required")), nil
	case a.Content == nil:
		return invalidArgs("write", errors.New("content is required")), nil
	}
	abs, unlock, bad := t.s.lockPath(ctx, "write", a.Path)
	if bad != nil {
		return *bad, nil
	}
	defer unlock()
	data := []byte(*a.Content)
	shown := t.s.display(abs)
	if a.Append {
		if err := appendFile(abs, data); err != nil {
			return t.s.pathErr("write", a.Path, err), nil
		}
		return withDetails(textResult(fmt.Sprintf("Appended %d bytes to %s", len(data), shown)),
			map[string]any{"path": shown, "bytes": len(data), "append": true}), nil
	}
	if err := writeFileAtomic(abs, data, 0o644); err != nil {
		return t.s.pathErr("write", a.Path, err), nil
	}
	return withDetails(textResult(fmt.Sprintf("Successfully wrote %d bytes to %s", len(data), shown)),
		map[string]any{"path": shown, "bytes": len(data)}), nil
}

func appendFile(path string, data []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

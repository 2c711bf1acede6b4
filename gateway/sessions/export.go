package sessions

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"time"
)

// ExportVersion is the upstream session file version WriteJSONL writes.
const ExportVersion = 3

const exportTime = "2006-01-02T15:04:05.000Z"

func isoTime(t time.Time) string { return t.UTC().Format(exportTime) }

// exportHeader is the first line of an exported session.
type exportHeader struct {
	Type      string `json:"type"`
	Version   int    `json:"version"`
	ID        string `json:"id"`
	Timestamp string `json:"timestamp"`
	Cwd       string `json:"cwd"`
}

// exportEntry is one entry line; the fields after Timestamp depend on Type.
type exportEntry struct {
	Type       string          `json:"type"`
	ID         string          `json:"id"`
	ParentID   *string         `json:"parentId"`
	Timestamp  string          `json:"timestamp"`
	Message    json.RawMessage `json:"message,omitempty"`
	Provider   string          `json:"provider,omitempty"`
	ModelID    string          `json:"modelId,omitempty"`
	CustomType string          `json:"customType,omitempty"`
	Data       json.RawMessage `json:"data,omitempty"`
}

// WriteJSONL writes a transcript in the upstream session file layout: a header line
// {"type":"session","version":3,"id","timestamp","cwd"} and then one line per entry
// {"type","id","parentId","timestamp",...}, where a message entry carries "message".
func WriteJSONL(w io.Writer, t Transcript) error {
	bw := bufio.NewWriter(w)
	enc := json.NewEncoder(bw)
	enc.SetEscapeHTML(false)
	err := enc.Encode(exportHeader{Type: "session", Version: ExportVersion, ID: t.Session.ID,
		Timestamp: isoTime(t.Session.CreatedAt), Cwd: t.Session.Workspace})
	if err != nil {
		return err
	}
	for _, e := range t.Entries {
		line := exportEntry{Type: string(e.Type), ID: e.ID, Timestamp: isoTime(e.Timestamp)}
		if e.ParentID != "" {
			line.ParentID = &e.ParentID
		}
		var content bytes.Buffer
		if err := json.Compact(&content, e.Content); err != nil {
			return fmt.Errorf("entry %s: %w", e.ID, err)
		}
		switch e.Type {
		case EntryMessage:
			line.Message = content.Bytes()
		case EntryModelChange:
			var mc ModelChange
			if err := json.Unmarshal(content.Bytes(), &mc); err != nil {
				return fmt.Errorf("entry %s: %w", e.ID, err)
			}
			line.Provider, line.ModelID = mc.Provider, mc.ModelID
		case EntryCustom:
			var c Custom
			if err := json.Unmarshal(content.Bytes(), &c); err != nil {
				return fmt.Errorf("entry %s: %w", e.ID, err)
			}
			line.CustomType, line.Data = c.CustomType, c.Data
		default:
			line.Data = content.Bytes()
		}
		if err := enc.Encode(line); err != nil {
			return fmt.Errorf("entry %s: %w", e.ID, err)
		}
	}
	return bw.Flush()
}

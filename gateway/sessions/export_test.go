package sessions

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"testing"
	"time"
)

var update = flag.Bool("update", false, "rewrite golden files")

func TestWriteJSONLGolden(t *testing.T) {
	at := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	tr := Transcript{
		Session: Session{ID: "ses_1", Workspace: "/home/me/project", CreatedAt: at},
		Entries: []Entry{
			{ID: "ent_a", Type: EntryMessage, RunEpoch: 1, Timestamp: at.Add(time.Second),
				Content: json.RawMessage(`{"role":"user","content":[{"type":"text","text":"list files <now>"}],"timestamp":1772366401000}`)},
			{ID: "ent_b", ParentID: "ent_a", Type: EntryMessage, RunEpoch: 1, Timestamp: at.Add(2 * time.Second),
				Content: json.RawMessage(`{"role":"assistant","content":[{"type":"toolCall","id":"c1","name":"bash","arguments":{"cmd":"ls"}}],"stopReason":"toolUse","timestamp":1772366402000}`)},
			{ID: "ent_c", ParentID: "ent_b", Type: EntryModelChange, Timestamp: at.Add(3 * time.Second),
				Content: json.RawMessage(`{"provider":"openai","modelId":"gpt-5"}`)},
			{ID: "ent_d", ParentID: "ent_c", Type: EntryCustom, Timestamp: at.Add(4 * time.Second),
				Content: json.RawMessage(`{"customType":"placement","data":{"environmentId":"env_1"}}`)},
		},
	}
	var buf bytes.Buffer
	if err := WriteJSONL(&buf, tr); err != nil {
		t.Fatal(err)
	}
	golden := filepath.Join("testdata", "export.golden.jsonl")
	if *update {
		if err := os.WriteFile(golden, buf.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(buf.Bytes(), want) {
		t.Fatalf("export differs from %s (run with -update to accept):\n%s", golden, buf.String())
	}
	// Every line is one JSON object whose leading keys are the upstream envelope.
	for i, line := range bytes.Split(bytes.TrimSpace(buf.Bytes()), []byte("\n")) {
		var m map[string]any
		if err := json.Unmarshal(line, &m); err != nil {
			t.Fatalf("line %d: %v", i, err)
		}
		if i > 0 {
			if _, ok := m["parentId"]; !ok {
				t.Fatalf("line %d has no parentId", i)
			}
		}
	}
}

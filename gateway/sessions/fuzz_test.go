package sessions

import (
	"encoding/json"
	"testing"
)

func FuzzDecodeCommit(f *testing.F) {
	f.Add([]byte(`{"runEpoch":1,"seq":1,"baseLeafId":"","messages":[{"role":"user","content":[{"type":"text","text":"hi"}],"timestamp":1}]}`))
	f.Add([]byte(`{"runEpoch":1,"seq":1,"messages":[{"id":"x","role":"user","content":[],"timestamp":1}]}`))
	f.Add([]byte(`{"messages":[{"role":"toolResult","toolCallId":"c","content":[{"type":"image","data":"AA==","mimeType":"image/png"}],"timestamp":1}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := DecodeCommit("ses_bound", 1, json.RawMessage(b))
		if err != nil {
			if CodeOf(err) == "" {
				t.Fatalf("untyped error %v", err)
			}
			return
		}
		if len(p.Messages) == 0 || len(p.Messages) > MaxBatch || p.SessionID != "ses_bound" {
			t.Fatalf("accepted %+v", p)
		}
		for _, m := range p.Messages {
			if err := m.Validate(); err != nil {
				t.Fatalf("accepted an invalid message: %v", err)
			}
		}
	})
}

func FuzzDecodeLive(f *testing.F) {
	f.Add([]byte(`{"runEpoch":1,"lastAckedSeq":0,"seq":1,"runId":"r","event":{"type":"text_delta","delta":"hi"}}`))
	f.Add([]byte(`{"runEpoch":1,"seq":2,"runId":"r","event":{"type":"tool_start","toolCallId":"c","toolName":"bash","args":{}}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := DecodeLive("ses_bound", 1, json.RawMessage(b))
		if err != nil {
			if CodeOf(err) == "" {
				t.Fatalf("untyped error %v", err)
			}
			return
		}
		if err := p.Event.Validate(); err != nil {
			t.Fatalf("accepted an invalid event: %v", err)
		}
	})
}

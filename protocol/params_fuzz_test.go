package protocol

import (
	"encoding/json"
	"testing"
)

// FuzzDecodeParams feeds arbitrary bytes to the strict decoder of every request's params: it must
// never panic, and whatever it accepts must survive a round trip and be re-accepted (a closed
// schema: no field can be smuggled through).
func FuzzDecodeParams(f *testing.F) {
	seeds := []string{
		`{"sessionId":"s","ownerEpoch":1,"runId":"r","streamKind":"transcript","runEpoch":1,"seq":1,"baseLeafId":"","messages":[{"role":"user","content":[{"type":"text","text":"hi"}],"timestamp":1}]}`,
		`{"sessionId":"s","ownerEpoch":1,"streamKind":"live","runEpoch":1,"seq":2,"event":{"type":"text_delta","delta":"x"}}`,
		`{"sessionId":"s","ownerEpoch":1}`,
		`{"sessionId":"s","ownerEpoch":1,"runEpoch":1,"runId":"r","turnId":"t","modelRef":"demo/demo","context":{"messages":[]},"options":{}}`,
		`{"sessionId":"s","ownerEpoch":1,"runEpoch":1,"runId":"r","turnId":"t","modelRef":"a/b","context":{"messages":[]},"options":{},"baseUrl":"http://x"}`,
		`{"sessionId":"s","runEpoch":1,"turnId":"t","limit":1024}`,
		`{"sessionId":"s","ownerEpoch":1,"runEpoch":1,"runId":"r","modelRef":"a/b","text":"go","gatewayTools":[{"name":"web_search"}]}`,
		`{"sessionId":"s","ownerEpoch":1,"runId":"r","toolCallId":"c","name":"web_search","arguments":{"query":"q"}}`,
		`{"sessionId":"s","runId":"r"}`,
		`[]`, `null`, `{"a":`, `{"sessionId":1}`,
	}
	for _, s := range seeds {
		f.Add([]byte(s))
	}
	targets := []func() any{
		func() any { return &TranscriptCommitParams{} }, func() any { return &LiveEventParams{} },
		func() any { return &ResumeParams{} }, func() any { return &TranscriptContextParams{} },
		func() any { return &InferenceStartParams{} }, func() any { return &InferenceCreditParams{} },
		func() any { return &InferenceCancelParams{} }, func() any { return &TurnStartParams{} },
		func() any { return &TurnCancelParams{} }, func() any { return &ToolCallParams{} }, func() any { return &SessionsSpawnParams{} },
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, newV := range targets {
			v := newV()
			if err := DecodeParams(b, v); err != nil {
				continue
			}
			if p, ok := v.(*InferenceStartParams); ok {
				_ = p.Validate() // must not panic on anything the decoder accepts
			}
			again, err := json.Marshal(v)
			if err != nil {
				t.Fatalf("%T accepted %q but does not marshal: %v", v, b, err)
			}
			w := newV()
			if err := DecodeParams(again, w); err != nil {
				t.Fatalf("%T accepted %q but not its own encoding %s: %v", v, b, again, err)
			}
		}
	})
}

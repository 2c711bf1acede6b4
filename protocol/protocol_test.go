package protocol

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
)

func TestDecode(t *testing.T) {
	tests := []struct {
		name string
		in   string
		code Code // "" means valid
	}{
		{"req", `{"type":"req","id":"1","method":"connect","params":{"role":"worker"}}`, ""},
		{"req without params", `{"type":"req","id":"1","method":"worker.heartbeat"}`, ""},
		{"res ok", `{"type":"res","id":"1","ok":true,"payload":{"a":1}}`, ""},
		{"res error", `{"type":"res","id":"1","ok":false,"error":{"code":"unauthorized","message":"no","retryable":true,"retryAfterMs":5}}`, ""},
		{"event", `{"type":"event","event":"worker.shutdown","payload":{},"seq":3}`, ""},
		{"cancel", `{"type":"cancel","id":"7"}`, ""},
		{"unknown type", `{"type":"hello","id":"1"}`, CodeInvalidFrame},
		{"missing type", `{"id":"1"}`, CodeInvalidFrame},
		{"unknown field", `{"type":"req","id":"1","method":"m","extra":1}`, CodeInvalidFrame},
		{"unknown error field", `{"type":"res","id":"1","ok":false,"error":{"code":"x","stack":"..."}}`, CodeInvalidFrame},
		{"req missing id", `{"type":"req","method":"m"}`, CodeInvalidFrame},
		{"req empty method", `{"type":"req","id":"1","method":""}`, CodeInvalidFrame},
		{"req with ok", `{"type":"req","id":"1","method":"m","ok":true}`, CodeInvalidFrame},
		{"res missing ok", `{"type":"res","id":"1"}`, CodeInvalidFrame},
		{"res not ok without error", `{"type":"res","id":"1","ok":false}`, CodeInvalidFrame},
		{"res ok with error", `{"type":"res","id":"1","ok":true,"error":{"code":"x"}}`, CodeInvalidFrame},
		{"res with method", `{"type":"res","id":"1","ok":true,"method":"m"}`, CodeInvalidFrame},
		{"event missing name", `{"type":"event","payload":{}}`, CodeInvalidFrame},
		{"event with id", `{"type":"event","event":"e","id":"1"}`, CodeInvalidFrame},
		{"cancel with method", `{"type":"cancel","id":"1","method":"m"}`, CodeInvalidFrame},
		{"long id", `{"type":"cancel","id":"` + strings.Repeat("a", 200) + `"}`, CodeInvalidFrame},
		{"trailing data", `{"type":"cancel","id":"1"}{}`, CodeInvalidFrame},
		{"not json", `hello`, CodeInvalidFrame},
		{"array", `[]`, CodeInvalidFrame},
		{"negative seq", `{"type":"event","event":"e","seq":-1}`, CodeInvalidFrame},
		{"too large", `{"type":"cancel","id":"` + strings.Repeat("a", 100) + `"}`, CodeFrameTooLarge},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			limit := 1024
			if tt.code == CodeFrameTooLarge {
				limit = 64
			}
			_, err := Decode([]byte(tt.in), limit)
			if tt.code == "" {
				if err != nil {
					t.Fatalf("Decode: %v", err)
				}
				return
			}
			var de *DecodeError
			if !errors.As(err, &de) || de.Code != tt.code {
				t.Fatalf("Decode error = %v, want code %s", err, tt.code)
			}
		})
	}
}

func TestRoundTrip(t *testing.T) {
	req, err := Request("1", MethodConnect, ConnectParams{Role: RoleWorker, Admission: Admission{
		EnvironmentID: "env-1", Credential: "c", OwnerEpoch: 2,
		Handshake: Handshake{BundleHash: "h", Version: ProtocolVersion, ProtocolFeatures: Features},
	}})
	if err != nil {
		t.Fatal(err)
	}
	res, _ := Response("1", ConnectResult{EnvironmentID: "env-1", HeartbeatIntervalMs: 10, Features: Features})
	ev, _ := NewEvent(MethodShutdown, 4, ShutdownPayload{Reason: "bye"})
	frames := []Frame{req, res, ErrorResponse("2", Errorf(CodeUnauthorized, "unknown")), ev, {Type: TypeCancel, ID: "3"},
		{Type: TypeRes, ID: "4", OK: true}}
	for _, f := range frames {
		b, err := json.Marshal(f)
		if err != nil {
			t.Fatal(err)
		}
		got, err := Decode(b, DefaultFrameLimit)
		if err != nil {
			t.Fatalf("Decode(%s): %v", b, err)
		}
		b2, _ := json.Marshal(got)
		if string(b) != string(b2) {
			t.Fatalf("round trip: %s != %s", b, b2)
		}
	}
	got, _ := Decode(mustJSON(t, req), DefaultFrameLimit)
	var p ConnectParams
	if err := DecodeParams(got.Params, &p); err != nil {
		t.Fatal(err)
	}
	if p.Admission.OwnerEpoch != 2 || p.Admission.Handshake.Version != ProtocolVersion {
		t.Fatalf("params = %+v", p)
	}
	if err := DecodeParams(json.RawMessage(`{"role":"worker","admin":true}`), &p); err == nil {
		t.Fatal("DecodeParams accepted an unknown field")
	}
	if err := DecodeParams(nil, &p); err == nil {
		t.Fatal("DecodeParams accepted missing params")
	}
}

func TestNegotiateFeatures(t *testing.T) {
	got := NegotiateFeatures([]string{"future-thing", FeatureShutdown, FeatureHeartbeat})
	if strings.Join(got, ",") != FeatureHeartbeat+","+FeatureShutdown {
		t.Fatalf("NegotiateFeatures = %v", got)
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// FuzzDecode checks that Decode never panics, and that every accepted frame re-encodes to a frame
// that decodes to the same thing.
func FuzzDecode(f *testing.F) {
	for _, s := range []string{
		`{"type":"req","id":"1","method":"connect","params":{"role":"worker","admission":{}}}`,
		`{"type":"res","id":"1","ok":false,"error":{"code":"unauthorized"}}`,
		`{"type":"res","id":"1","ok":true,"payload":null}`,
		`{"type":"event","event":"worker.shutdown","payload":{},"seq":1}`,
		`{"type":"cancel","id":"1"}`,
		`{"type":"req","id":"1","method":"m","x":1}`,
		`{}`, `null`, ``,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		fr, err := Decode(b, PreAdmissionFrameLimit)
		if err != nil {
			var de *DecodeError
			if !errors.As(err, &de) {
				t.Fatalf("error %v is not a *DecodeError", err)
			}
			return
		}
		enc, err := json.Marshal(fr)
		if err != nil {
			t.Fatalf("marshal accepted frame: %v", err)
		}
		fr2, err := Decode(enc, DefaultFrameLimit)
		if err != nil {
			t.Fatalf("re-decode %s: %v", enc, err)
		}
		enc2, _ := json.Marshal(fr2)
		if string(enc) != string(enc2) {
			t.Fatalf("unstable encoding: %s != %s", enc, enc2)
		}
	})
}

func TestIsGatewayMethod(t *testing.T) {
	for _, m := range []string{MethodShutdown, MethodInferenceEvent, MethodInferenceTerminal, MethodTurnStart, MethodTurnCancel, MethodTurnStatus} {
		if !IsGatewayMethod(m) {
			t.Errorf("%s is not a gateway method", m)
		}
	}
	for _, m := range append(WorkerMethods(), "", "worker.bogus") {
		if m != MethodShutdown && IsGatewayMethod(m) {
			t.Errorf("%q is taken for a gateway method", m)
		}
	}
}

// TestEncode: Frame.Encode writes the bytes json.Marshal writes, and they decode to the same frame.
func TestEncode(t *testing.T) {
	tok, err := NewEvent(MethodInferenceEvent, 7, InferenceEventPayload{SessionID: "s<1>", RunID: "r&1", TurnID: "t\"1\u2028",
		Seq: 7, Event: StreamEvent{Type: "text_delta", Delta: "héllo <b>\n"}})
	if err != nil {
		t.Fatal(err)
	}
	req, _ := Request("id-1", MethodLiveEvent, LiveEventParams{LastAckedSeq: 3, Event: LiveEvent{Type: LiveTextDelta, Delta: "x"}})
	res, _ := Response("id<2>", LiveEventResult{AckedSeq: 4})
	noSeq, _ := NewEvent(MethodShutdown, 0, ShutdownPayload{Reason: "bye"})
	frames := []Frame{tok, req, res, noSeq,
		ErrorResponse("3", &Error{Code: CodeResyncRequired, Message: "a <gap> & more", AckedSeq: 2, ExpectedSeq: 3}),
		{Type: TypeRes, ID: "4", OK: true}, {Type: TypeRes, ID: "5"}, {Type: TypeReq, ID: "6", Method: MethodHeartbeat},
		{Type: TypeCancel, ID: "\x01é"}, {Type: TypeEvent, Event: MethodInferenceEvent}}
	for _, f := range frames {
		want, err := json.Marshal(f)
		if err != nil {
			t.Fatal(err)
		}
		got, err := f.Encode()
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != string(want) {
			t.Fatalf("Encode = %s\njson.Marshal = %s", got, want)
		}
		d1, err1 := Decode(got, DefaultFrameLimit)
		d2, err2 := Decode(want, DefaultFrameLimit)
		if (err1 == nil) != (err2 == nil) || !reflect.DeepEqual(d1, d2) {
			t.Fatalf("Decode(Encode) = %+v, %v; Decode(json.Marshal) = %+v, %v", d1, err1, d2, err2)
		}
	}
	if _, err := (Frame{Type: "bogus"}).Encode(); err == nil {
		t.Fatal("Encode accepted an unknown frame type")
	}
	// Raw bytes that are not one JSON value (here a member smuggled in after the params) are
	// refused, as json.Marshal refuses them, instead of being copied into the frame.
	for _, f := range []Frame{
		{Type: TypeReq, ID: "7", Method: MethodHeartbeat, Params: json.RawMessage(`1,"method":"other"`)},
		{Type: TypeEvent, Event: MethodInferenceEvent, Payload: json.RawMessage(`{"a":1`)},
		{Type: TypeRes, ID: "8", OK: true, Payload: json.RawMessage(`{} {}`)},
	} {
		if b, err := f.Encode(); err == nil {
			t.Fatalf("Encode copied raw bytes that are not one JSON value: %s", b)
		}
		if _, err := json.Marshal(f); err == nil {
			t.Fatalf("json.Marshal accepted %+v (the test's premise)", f)
		}
	}
}

// BenchmarkEncodeToken compares the relay's per-token frame write: json.Marshal against Encode.
func BenchmarkEncodeToken(b *testing.B) {
	f, err := NewEvent(MethodInferenceEvent, 42, InferenceEventPayload{SessionID: "ses_0123456789abcdef", RunID: "run-1",
		TurnID: "t12-34", Seq: 42, Event: StreamEvent{Type: "text_delta", Delta: "1764656400123456789"}})
	if err != nil {
		b.Fatal(err)
	}
	b.Run("json.Marshal", func(b *testing.B) {
		for b.Loop() {
			if _, err := json.Marshal(f); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("Encode", func(b *testing.B) {
		for b.Loop() {
			if _, err := f.Encode(); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// ManifestDiff names what differs, a few tools at most, and bounds a flood.
func TestManifestDiff(t *testing.T) {
	want := ToolManifest([]Tool{{Name: "read", Description: "r"}, {Name: "exec", Description: "e"}})
	if d := ManifestDiff(want, ToolManifest([]Tool{{Name: "exec", Description: "e"}, {Name: "read", Description: "r"}})); d != "" {
		t.Fatalf("the same tools in another order given: %q", d)
	}
	changed := ToolManifest([]Tool{{Name: "read", Description: "r2"}, {Name: "exec", Description: "e"}})
	if d := ManifestDiff(want, changed); d != `tool "read" has another schema` {
		t.Fatalf("a changed schema: %q", d)
	}
	if d := ManifestDiff(want, want[:1]); d != `tool "read" is missing` {
		t.Fatalf("a missing tool: %q", d)
	}
	flood := make([]ToolDigest, MaxManifestTools+1)
	if d := ManifestDiff(want, flood); !strings.Contains(d, "more than") {
		t.Fatalf("a flood: %q", d)
	}
	var many []ToolDigest
	for i := range 10 {
		many = append(many, ToolDigest{Name: fmt.Sprintf("t%d", i)})
	}
	if d := ManifestDiff(want, many); strings.Count(d, "unknown tool") != 3 || !strings.Contains(d, "more") {
		t.Fatalf("many differences: %q", d)
	}
}

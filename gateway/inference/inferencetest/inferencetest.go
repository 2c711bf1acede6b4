// Package inferencetest has the fakes adapter tests share: a loopback provider server that replays SSE
// streams and a recorder of stream events.
package inferencetest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openclaw/cloudworkers/gateway/inference"
	"github.com/openclaw/cloudworkers/protocol"
)

// Context is a bounded test context.
func Context(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// Request is what the server saw of one request.
type Request struct {
	Path   string
	Header http.Header
	Body   []byte
}

// APIKey is the credential the request carried: its x-api-key header, else its bearer token
// (the Anthropic SDK sends either, depending on its version).
func (r Request) APIKey() string {
	if k := r.Header.Get("X-Api-Key"); k != "" {
		return k
	}
	return strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
}

// Handler answers the n-th request (0-based).
type Handler func(n int, w http.ResponseWriter, r *http.Request)

// Server is a loopback provider.
type Server struct {
	*httptest.Server
	mu       sync.Mutex
	requests []Request
}

// NewServer starts a provider server on loopback, closed at cleanup.
func NewServer(t *testing.T, h Handler) *Server {
	t.Helper()
	s := &Server{}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		s.mu.Lock()
		n := len(s.requests)
		s.requests = append(s.requests, Request{Path: r.URL.Path, Header: r.Header.Clone(), Body: body})
		s.mu.Unlock()
		h(n, w, r)
	}))
	t.Cleanup(s.Close)
	return s
}

// Requests returns the requests seen so far.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Request(nil), s.requests...)
}

// SSE writes events ("event: x\ndata: {...}" or "data: {...}") as an event stream, flushing each.
func SSE(w http.ResponseWriter, events ...string) {
	if w.Header().Get("Content-Type") == "" {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
	}
	for _, e := range events {
		fmt.Fprintf(w, "%s\n\n", e)
		w.(http.Flusher).Flush()
	}
}

// JSONError is a handler that answers status with a JSON body and the given header pairs (name, value).
func JSONError(status int, body string, header ...string) Handler {
	return func(_ int, w http.ResponseWriter, _ *http.Request) {
		for i := 0; i+1 < len(header); i += 2 {
			w.Header().Set(header[i], header[i+1])
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = w.Write([]byte(body))
	}
}

// FailFirst is a handler that answers the first request with first and the others with then.
func FailFirst(first, then Handler) Handler {
	return func(n int, w http.ResponseWriter, r *http.Request) {
		if n == 0 {
			first(n, w, r)
			return
		}
		then(n, w, r)
	}
}

// Cut drops the connection mid-response (the client sees an unexpected EOF).
func Cut() { panic(http.ErrAbortHandler) }

// Recorder collects emitted events.
type Recorder struct {
	Events []protocol.StreamEvent
	// OnEvent, if set, runs after each event is recorded; its error is returned to the adapter.
	OnEvent func(protocol.StreamEvent) error
}

// Emit records ev.
func (r *Recorder) Emit(ev protocol.StreamEvent) error {
	r.Events = append(r.Events, ev)
	if r.OnEvent != nil {
		return r.OnEvent(ev)
	}
	return nil
}

// Summary renders the events compactly: "start", "text_delta 0 Hel", "toolcall_end 1 read {…}", "done toolUse".
func (r *Recorder) Summary() []string {
	var out []string
	for _, ev := range r.Events {
		s := ev.Type
		switch ev.Type {
		case protocol.EventStart:
		case protocol.EventDone, protocol.EventError:
			s += " " + ev.Reason
		case protocol.EventToolCallStart:
			s += fmt.Sprintf(" %d %s %s", ev.ContentIndex, ev.ToolCall.ID, ev.ToolCall.Name)
		case protocol.EventToolCallEnd:
			s += fmt.Sprintf(" %d %s %s %s", ev.ContentIndex, ev.ToolCall.ID, ev.ToolCall.Name, ev.ToolCall.Arguments)
		case protocol.EventTextEnd, protocol.EventThinkingEnd:
			s += fmt.Sprintf(" %d %s", ev.ContentIndex, ev.Content)
		case protocol.EventTextStart, protocol.EventThinkingStart:
			s += fmt.Sprintf(" %d", ev.ContentIndex)
		default:
			s += fmt.Sprintf(" %d %s", ev.ContentIndex, ev.Delta)
		}
		out = append(out, s)
	}
	return out
}

// JSON is all events marshalled, for leak checks.
func (r *Recorder) JSON() string {
	b, _ := json.Marshal(r.Events)
	return string(b)
}

// Diff reports the first difference of two summaries ("" when equal).
func Diff(got, want []string) string {
	for i := 0; i < max(len(got), len(want)); i++ {
		var g, w string
		if i < len(got) {
			g = got[i]
		}
		if i < len(want) {
			w = want[i]
		}
		if g != w {
			return fmt.Sprintf("event %d: got %q, want %q\nall: %s", i, g, w, strings.Join(got, " | "))
		}
	}
	return ""
}

// Case is one row of an adapter's streaming table: the provider's answer (Handler, to the n-th
// request) and what the call must show: the event summary, the stop reason, the text (and thinking,
// for adapters that check it), the usage (before cost, which the call's prices add), and for a failed
// call the status, the Retry-After and a part of the error message; Requests is how many requests the
// provider must have seen.
type Case struct {
	Name     string
	Handler  Handler
	Retries  int
	Events   []string
	Stop     string
	Text     string
	Thinking string
	Usage    *protocol.Usage
	Status   int
	Retry    time.Duration
	ErrMatch string
	Requests int
}

// RunCase serves want.Handler on loopback, streams the call newCall makes for that server (with
// want.Retries) through a, and checks the outcome against want, and that secret shows in neither the
// error nor an event. It returns the message and the first request, for the adapter's own checks.
func RunCase(t *testing.T, a inference.Adapter, newCall func(baseURL string, retries int) inference.Call, secret string, want Case) (protocol.Message, Request) {
	t.Helper()
	srv := NewServer(t, want.Handler)
	rec := &Recorder{}
	call := newCall(srv.URL, want.Retries)
	msg, err := a.Stream(Context(t), call, rec.Emit)
	if d := Diff(rec.Summary(), want.Events); d != "" {
		t.Fatal(d)
	}
	last := rec.Events[len(rec.Events)-1]
	if last.Message == nil || last.Message.StopReason != want.Stop || msg.StopReason != want.Stop {
		t.Fatalf("stop reason: event %+v, returned %q", last.Message, msg.StopReason)
	}
	if got := msg.Text(); got != want.Text {
		t.Errorf("text = %q, want %q", got, want.Text)
	}
	if want.Usage != nil {
		u := *want.Usage
		call.Model.Cost.ApplyCost(&u)
		if *msg.Usage != u {
			t.Errorf("usage = %+v, want %+v", *msg.Usage, u)
		}
	}
	if want.ErrMatch != "" {
		var ce *inference.CallError
		if !errors.As(err, &ce) || ce.Reason != protocol.StopError || !strings.Contains(msg.ErrorMessage, want.ErrMatch) {
			t.Fatalf("err = %v, errorMessage %q, want one containing %q", err, msg.ErrorMessage, want.ErrMatch)
		}
		if ce.Status != want.Status || ce.RetryAfter != want.Retry {
			t.Errorf("status %d retry %v, want %d %v", ce.Status, ce.RetryAfter, want.Status, want.Retry)
		}
		if strings.Contains(err.Error(), secret) {
			t.Errorf("error contains the credential: %v", err)
		}
	} else if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(rec.JSON(), secret) {
		t.Error("an event contains the credential")
	}
	reqs := srv.Requests()
	if len(reqs) != want.Requests {
		t.Fatalf("%d requests, want %d", len(reqs), want.Requests)
	}
	return msg, reqs[0]
}

// Streamer calls the adapter under test against the provider at baseURL.
type Streamer func(ctx context.Context, baseURL string, emit inference.Emit) (protocol.Message, error)

// CheckCancel has the provider stream events (which end with the text delta "Hel" in block 0) and
// then hold the response open; it cancels the call at that delta and checks that the call ends
// aborted with exactly those events and an error event, and that the provider sees the connection close.
func CheckCancel(t *testing.T, stream Streamer, events ...string) {
	t.Helper()
	ctx := Context(t)
	srv, closed := holdServer(t, events)
	callCtx, cancel := context.WithCancel(ctx)
	rec := &Recorder{OnEvent: func(ev protocol.StreamEvent) error {
		if ev.Type == protocol.EventTextDelta {
			cancel()
		}
		return nil
	}}
	msg, err := stream(callCtx, srv.URL, rec.Emit)
	var ce *inference.CallError
	if !errors.As(err, &ce) || ce.Reason != protocol.StopAborted || msg.StopReason != protocol.StopAborted {
		t.Fatalf("err = %v, stop %q", err, msg.StopReason)
	}
	if d := Diff(rec.Summary(), []string{"start", "text_start 0", "text_delta 0 Hel", "error aborted"}); d != "" {
		t.Fatal(d)
	}
	waitClosed(ctx, t, closed)
}

// CheckEmitError has the provider stream events (ending with a text delta) and then hold the response
// open; the emit of that delta fails, and it checks that the call returns the emit's error and that
// the provider sees the connection close. It returns the events, for the adapter's own checks.
func CheckEmitError(t *testing.T, stream Streamer, events ...string) *Recorder {
	t.Helper()
	ctx := Context(t)
	srv, closed := holdServer(t, events)
	gone := errors.New("consumer gone")
	rec := &Recorder{OnEvent: func(ev protocol.StreamEvent) error {
		if ev.Type == protocol.EventTextDelta {
			return gone
		}
		return nil
	}}
	if _, err := stream(ctx, srv.URL, rec.Emit); !errors.Is(err, gone) {
		t.Fatalf("err = %v, want the emit error", err)
	}
	waitClosed(ctx, t, closed)
	return rec
}

// holdServer is a provider that streams events and then holds the response open until the client
// goes away; closed is closed when it has.
func holdServer(t *testing.T, events []string) (*Server, <-chan struct{}) {
	t.Helper()
	closed := make(chan struct{})
	srv := NewServer(t, func(_ int, w http.ResponseWriter, r *http.Request) {
		SSE(w, events...)
		<-r.Context().Done()
		close(closed)
	})
	return srv, closed
}

func waitClosed(ctx context.Context, t *testing.T, closed <-chan struct{}) {
	t.Helper()
	select {
	case <-closed:
	case <-ctx.Done():
		t.Fatal("the provider never saw the connection close")
	}
}

// AnthropicText answers one Anthropic Messages request with a streamed assistant text (the
// documented SSE events, end_turn).
func AnthropicText(w http.ResponseWriter, text string) {
	t, _ := json.Marshal(text)
	SSE(w,
		`event: message_start
data: {"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","content":[],"model":"m","stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":3,"output_tokens":1}}}`,
		`event: content_block_start
data: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`,
		`event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":`+string(t)+`}}`,
		`event: content_block_stop
data: {"type":"content_block_stop","index":0}`,
		`event: message_delta
data: {"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":2}}`,
		`event: message_stop
data: {"type":"message_stop"}`)
}

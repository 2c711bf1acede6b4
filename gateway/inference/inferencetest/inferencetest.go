// Package inferencetest has the fakes adapter tests share: a loopback provider server that replays SSE
// streams and a recorder of stream events.
package inferencetest

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

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

// Package console renders a session's live events and a placement's steps for a terminal, for
// the CLI and the demo alike.
package console

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/coder/websocket"
	"go.yaml.in/yaml/v3"

	"github.com/openclaw/cloudworkers/gateway/api"
	"github.com/openclaw/cloudworkers/gateway/placement"
	"github.com/openclaw/cloudworkers/gateway/sessions"
	"github.com/openclaw/cloudworkers/protocol"
)

// Printer renders live events: assistant text on Out, tool activity and run lifecycle on Info.
type Printer struct {
	Out, Info io.Writer
	// Thinking also prints thinking deltas (on Info).
	Thinking bool
	// JSONLines writes each stream message (live records with their cursor, gaps) to Out as one
	// line of JSON instead of rendering it.
	JSONLines bool
	// YAMLDocs writes each stream message to Out as one YAML document, starting with "---" (as
	// kubectl get -w -o yaml does), with the JSON field names.
	YAMLDocs bool
	midLine  bool // the last text delta did not end a line
}

// Note prints one line on Info, after ending a text line left open on Out.
func (p *Printer) Note(format string, args ...any) {
	if p.midLine {
		fmt.Fprintln(p.Out)
		p.midLine = false
	}
	fmt.Fprintf(p.Info, format+"\n", args...)
}

// Print renders one live record.
func (p *Printer) Print(r *sessions.LiveRecord) {
	e := r.Event
	switch e.Type {
	case protocol.LiveTextDelta:
		fmt.Fprint(p.Out, e.Delta)
		p.midLine = !strings.HasSuffix(e.Delta, "\n")
	case protocol.LiveThinkingDelta:
		if p.Thinking {
			fmt.Fprint(p.Info, e.Delta)
		}
	case protocol.LiveToolStart:
		p.Note("→ %s %s", e.ToolName, Truncate(Readable(e.Args), 120))
	case protocol.LiveToolUpdate:
	case protocol.LiveToolResult:
		status := "ok"
		if e.IsError {
			status = "error"
		}
		p.Note("← %s %s %s", Dash(e.ToolName), status, Truncate(strings.Join(strings.Fields(string(e.Result)), " "), 120))
	case protocol.LiveLifecycleStart:
		p.Note("[run %s started]", Dash(r.RunID))
	case protocol.LiveLifecycleEnd:
		p.Note("[run %s ended]", Dash(r.RunID))
	case protocol.LiveLifecycleError:
		p.Note("[run %s failed: %s]", Dash(r.RunID), e.Error)
	}
}

// Watch follows one stream connection of a session, printing every event and advancing *cursor
// past it. It returns nil once until (if set) reports true for a printed event; a
// *websocket.CloseError with StatusTryAgainLater when the watcher fell behind.
func (p *Printer) Watch(ctx context.Context, c *api.Client, sessionID string, cursor *uint64, until func(*sessions.LiveRecord) bool) error {
	s, err := c.StreamSession(ctx, sessionID, *cursor)
	if err != nil {
		return err
	}
	defer s.Close()
	for {
		m, err := s.Next(ctx)
		if err != nil {
			return err
		}
		structured := p.JSONLines || p.YAMLDocs
		switch {
		case p.JSONLines:
			err = json.NewEncoder(p.Out).Encode(m)
		case p.YAMLDocs:
			err = writeYAMLDoc(p.Out, m)
		}
		if err != nil {
			return err
		}
		switch {
		case structured && m.LiveRecord != nil:
			*cursor = m.Cursor
			if until != nil && until(m.LiveRecord) {
				return nil
			}
		case structured:
		case m.Type == "gap":
			p.Note("(%d earlier events are no longer retained)", m.Missed)
		case m.LiveRecord != nil:
			p.Print(m.LiveRecord)
			*cursor = m.Cursor
			if until != nil && until(m.LiveRecord) {
				return nil
			}
		}
	}
}

// FollowTurn prints a session's events from cursor until the turn runID ends or fails, and
// returns that lifecycle record. each (when set) sees every record of the turn first. A watcher
// that fell behind reconnects from the last event it printed.
func (p *Printer) FollowTurn(ctx context.Context, c *api.Client, sessionID, runID string, cursor uint64, each func(*sessions.LiveRecord)) (*sessions.LiveRecord, error) {
	var outcome *sessions.LiveRecord
	until := func(r *sessions.LiveRecord) bool {
		if r.RunID != runID {
			return false
		}
		if each != nil {
			each(r)
		}
		if r.Event.Type == protocol.LiveLifecycleEnd || r.Event.Type == protocol.LiveLifecycleError {
			outcome = r
			return true
		}
		return false
	}
	for outcome == nil {
		err := p.Watch(ctx, c, sessionID, &cursor, until)
		var ce websocket.CloseError
		if errors.As(err, &ce) && ce.Code == websocket.StatusTryAgainLater {
			continue
		}
		if err != nil {
			return nil, err
		}
	}
	return outcome, nil
}

// PlacementSteps returns a function that prints each placement step on w as a timed line.
func PlacementSteps(w io.Writer) func(placement.Event) {
	return func(ev placement.Event) {
		at, _ := time.Parse("2006-01-02T15:04:05.000Z07:00", ev.At)
		fmt.Fprintf(w, "%s  %-12s %s\n", at.Local().Format("15:04:05.000"), ev.To, ev.Reason)
	}
}

// Dash is s, or "-" when s is blank.
func Dash(s string) string {
	if strings.TrimSpace(s) == "" {
		return "-"
	}
	return s
}

// Readable writes JSON for a person: compact, with &, < and > as they are (no \u0026).
func Readable(raw []byte) string {
	var v any
	dec := json.NewDecoder(strings.NewReader(string(raw)))
	dec.UseNumber()
	if dec.Decode(&v) != nil {
		return string(raw)
	}
	var b strings.Builder
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if enc.Encode(v) != nil {
		return string(raw)
	}
	return strings.TrimSuffix(b.String(), "\n")
}

// Truncate cuts s to n bytes, marking the cut with "…".
func Truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// WriteYAML writes v as YAML through its JSON form, so with its JSON field names.
func WriteYAML(w io.Writer, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	var tree any
	if err := json.Unmarshal(b, &tree); err != nil {
		return err
	}
	enc := yaml.NewEncoder(w)
	enc.SetIndent(2)
	if err := enc.Encode(tree); err != nil {
		return err
	}
	return enc.Close()
}

// writeYAMLDoc writes v as one YAML document of a stream: "---", then the document, in one write.
func writeYAMLDoc(w io.Writer, v any) error {
	var buf bytes.Buffer
	buf.WriteString("---\n")
	if err := WriteYAML(&buf, v); err != nil {
		return err
	}
	_, err := w.Write(buf.Bytes())
	return err
}

package mcp

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/openclaw/cloudworkers/gateway/placement"
	"github.com/openclaw/cloudworkers/gateway/sessions"
	"github.com/openclaw/cloudworkers/gateway/turns"
	"github.com/openclaw/cloudworkers/protocol"
)

// maxSteps bounds the steps a result lists (the progress notifications carry them all).
const maxSteps = 200

// progress sends the MCP progress notifications of one tool call (when the client asked for them
// with a progress token) and keeps the steps for the result.
type progress struct {
	ctx   context.Context
	req   *mcp.CallToolRequest // nil for a background dispatch
	token any

	mu   sync.Mutex
	n    float64
	list []string
}

func newProgress(ctx context.Context, req *mcp.CallToolRequest) *progress {
	p := &progress{ctx: ctx, req: req}
	if req != nil && req.Params != nil {
		p.token = req.Params.GetProgressToken()
	}
	return p
}

// step records one step and notifies the client.
func (p *progress) step(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	p.mu.Lock()
	p.n++
	n := p.n
	if len(p.list) < maxSteps {
		p.list = append(p.list, msg)
	}
	p.mu.Unlock()
	if p.token == nil || p.req == nil || p.req.Session == nil {
		return
	}
	// A client that went away is noticed by the call itself; a lost notification is not an error.
	_ = p.req.Session.NotifyProgress(p.ctx, &mcp.ProgressNotificationParams{ProgressToken: p.token, Progress: n, Message: msg})
}

func (p *progress) steps() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.list...)
}

// placementStep is WaitPlacement's callback: one notification per placement step.
func (p *progress) placementStep(e placement.Event) {
	if e.Reason != "" {
		p.step("placement %s → %s: %s", e.From, e.To, e.Reason)
		return
	}
	p.step("placement %s → %s", e.From, e.To)
}

// streamRetries bounds the reconnects of one turn's live stream before the turn is polled instead.
const streamRetries = 5

// followTurn watches a session's live stream from the turn's cursor, reporting each tool call,
// until the turn ends; then it returns the turn's final row. A stream that cannot be kept open
// falls back to polling the turn.
func (s *Server) followTurn(ctx context.Context, p *progress, t turns.Turn) (turns.Turn, error) {
	cursor := t.Cursor
	for attempt := 0; attempt < streamRetries; attempt++ {
		ended, err := s.watch(ctx, p, t, &cursor)
		if ended {
			break
		}
		if ctx.Err() != nil {
			return t, fmt.Errorf("turn %s of session %s: %w", t.RunID, t.SessionID, context.Cause(ctx))
		}
		s.cfg.Log.Debug("session stream", "session", t.SessionID, "err", err)
	}
	for {
		cur, err := s.cfg.Client.Turn(ctx, t.RunID)
		if err != nil {
			return t, toolError("turn "+t.RunID, err)
		}
		if !cur.Status.Ongoing() { // a moving turn goes on after its live move
			return cur, nil
		}
		select {
		case <-ctx.Done():
			return cur, fmt.Errorf("turn %s of session %s still running: %w", t.RunID, t.SessionID, context.Cause(ctx))
		case <-time.After(250 * time.Millisecond): // polling the API
		}
	}
}

// watch reads one connection of the session's stream; ended reports the turn's end was seen.
func (s *Server) watch(ctx context.Context, p *progress, t turns.Turn, cursor *uint64) (ended bool, err error) {
	st, err := s.cfg.Client.StreamSession(ctx, t.SessionID, *cursor)
	if err != nil {
		return false, err
	}
	defer st.Close()
	for {
		m, err := st.Next(ctx)
		if err != nil {
			return false, err
		}
		if m.LiveRecord == nil {
			continue // a gap: events no longer retained
		}
		*cursor = m.Cursor
		if m.RunID != t.RunID {
			continue
		}
		switch ev := m.Event; ev.Type {
		case protocol.LiveToolStart:
			p.step("tool %s %s", ev.ToolName, argsSummary(ev.Args))
		case protocol.LiveToolResult:
			if ev.IsError {
				p.step("tool %s failed", ev.ToolName)
			}
		case protocol.LiveLifecycleEnd:
			p.step("turn done")
			return true, nil
		case protocol.LiveLifecycleError:
			p.step("turn failed: %s", ev.Error)
			return true, nil
		}
	}
}

// argsSummary is a tool call's arguments, cut short for a progress message.
func argsSummary(raw json.RawMessage) string {
	s := strings.Join(strings.Fields(string(raw)), " ")
	if r := []rune(s); len(r) > 120 {
		s = string(r[:120]) + "…"
	}
	return s
}

// answer is the text of the last assistant message of a session's transcript.
func (s *Server) answer(ctx context.Context, id string) (string, error) {
	tr, err := s.cfg.Client.Transcript(ctx, id)
	if err != nil {
		return "", err
	}
	return clip(lastAnswer(tr), s.cfg.MaxAnswerBytes, id), nil
}

// clip cuts an answer longer than max bytes (at a rune boundary) and says where the rest is.
func clip(answer string, max int, id string) string {
	if len(answer) <= max {
		return answer
	}
	cut := max
	for cut > 0 && !utf8.RuneStart(answer[cut]) {
		cut--
	}
	return answer[:cut] + fmt.Sprintf("\n[answer cut at %d bytes (mcp.maxAnswerBytes): read the resource %s%s%s for the rest]", max, uriPrefix, id, transcriptSuffix)
}

func lastAnswer(tr sessions.Transcript) string {
	for i := len(tr.Entries) - 1; i >= 0; i-- {
		if tr.Entries[i].Type != sessions.EntryMessage {
			continue
		}
		var m protocol.Message
		if json.Unmarshal(tr.Entries[i].Content, &m) != nil || m.Role != "assistant" {
			continue
		}
		var b strings.Builder
		for _, c := range m.Content {
			if c.Type == "text" {
				b.WriteString(c.Text)
			}
		}
		if b.Len() > 0 {
			return b.String()
		}
	}
	return ""
}

package openclaw

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"time"

	"github.com/openclaw/cloudworkers/gateway/sessions"
	"github.com/openclaw/cloudworkers/protocol"
)

// maxRunAliases bounds the runs a connection remembers the client's run id of.
const maxRunAliases = 256

// maxCumulativeText is how much of a reply the assistant events repeat whole (text, message).
const maxCumulativeText = 32 << 10

// follower relays one session's live feed to a connection as chat and agent events.
type follower struct {
	sessionID string
	agent     string
	key       string // the key the client named the session by
	cancel    context.CancelFunc
	runs      map[string]*runState // our run id → its relay state
	// messages: sessions.messages.subscribe asked for session.message events; lastMsg is the
	// transcript entry last announced (or the tail when it subscribed).
	messages bool
	lastMsg  string
	lastLeaf string // the session's leaf when lastMsg was read (unchanged: nothing to read)
}

// runState is what a run's events need: the client's run id, the event seq and the assistant
// text so far (agent events carry it whole, chat deltas both).
type runState struct {
	clientID string
	seq      uint64
	text     strings.Builder
}

// follow starts relaying a session's live events from cursor (0: from now).
func (c *conn) follow(ctx context.Context, s sessions.Session, key string, cursor uint64, fromCursor bool) *errorShape {
	c.mu.Lock()
	if f, ok := c.subs[s.ID]; ok {
		f.key = key
		c.mu.Unlock()
		return nil
	}
	if len(c.subs) >= c.srv.cfg.MaxSubscriptions {
		c.mu.Unlock()
		return errf(CodeUnavailable, "this connection follows too many sessions (policy: at most "+itoa(c.srv.cfg.MaxSubscriptions)+"); unsubscribe from one first")
	}
	fctx, cancel := context.WithCancel(c.ctx)
	f := &follower{sessionID: s.ID, agent: s.Agent, key: key, cancel: cancel, runs: map[string]*runState{}}
	c.subs[s.ID] = f
	c.mu.Unlock()
	if !fromCursor {
		cur, err := c.srv.cfg.Sessions.LiveCursor(ctx, s.ID)
		if err != nil {
			c.unfollow(s.ID)
			return errf(CodeUnavailable, err.Error())
		}
		cursor = cur
	}
	sub, err := c.srv.cfg.Sessions.Subscribe(fctx, s.ID, cursor)
	if err != nil {
		c.unfollow(s.ID)
		return errf(CodeUnavailable, err.Error())
	}
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		defer sub.Close()
		for {
			select {
			case <-fctx.Done():
				return
			case rec, ok := <-sub.C():
				if !ok {
					c.unfollow(s.ID) // lagged or closed: the client subscribes again
					return
				}
				c.relay(f, rec)
			}
		}
	}()
	return nil
}

func (c *conn) unfollow(sessionID string) {
	c.mu.Lock()
	f, ok := c.subs[sessionID]
	delete(c.subs, sessionID)
	c.mu.Unlock()
	if ok {
		f.cancel()
	}
}

func (c *conn) unsubscribeAll() {
	c.mu.Lock()
	subs := c.subs
	c.subs = map[string]*follower{}
	c.mu.Unlock()
	for _, f := range subs {
		f.cancel()
	}
}

// rememberRun records the client's id of a run it started (its idempotency key).
func (c *conn) rememberRun(ours, clientID string) {
	if clientID == "" {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.aliases == nil {
		c.aliases = map[string]string{}
	}
	if len(c.aliases) >= maxRunAliases {
		for k := range c.aliases { // forget an arbitrary old one: the map stays bounded
			delete(c.aliases, k)
			break
		}
	}
	c.aliases[ours] = clientID
}

// clientRun is the run id the client knows a run by.
func (c *conn) clientRun(ours, fallback string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if id, ok := c.aliases[ours]; ok {
		return id
	}
	if fallback != "" {
		return fallback
	}
	return ours
}

// ourRun maps a client's run id back to ours.
func (c *conn) ourRun(clientID string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	for ours, id := range c.aliases {
		if id == clientID {
			return ours
		}
	}
	return clientID
}

// relay translates one live record into the protocol's agent and chat events.
func (c *conn) relay(f *follower, rec *sessions.LiveRecord) {
	if rec.RunID == "" {
		return
	}
	c.mu.Lock()
	rs, ok := f.runs[rec.RunID]
	if !ok {
		if len(f.runs) >= maxRunAliases {
			for k := range f.runs {
				delete(f.runs, k)
				break
			}
		}
		alias, known := c.aliases[rec.RunID]
		c.mu.Unlock()
		// A run's first event can come before chat.send's Send returns (and rememberRun): the
		// client's id is the turn's idempotency key, read from its row (written at admission).
		id := rec.RunID
		switch {
		case known:
			id = alias
		default:
			ctx, cancel := context.WithTimeout(c.ctx, 5*time.Second)
			if t, err := c.srv.cfg.Turns.Get(ctx, rec.RunID); err == nil && t.IdempotencyKey != "" {
				id = t.IdempotencyKey
			}
			cancel()
		}
		rs = &runState{clientID: id}
		c.mu.Lock()
		f.runs[rec.RunID] = rs
	}
	key := f.key
	c.mu.Unlock()
	ts := rec.At.UnixMilli()
	ev := rec.Event
	agent := func(stream string, data map[string]any) {
		rs.seq++
		c.event("agent", map[string]any{"runId": rs.clientID, "seq": rs.seq, "stream": stream, "ts": ts, "data": data})
	}
	chat := func(payload map[string]any) {
		rs.seq++
		payload["runId"], payload["sessionKey"], payload["seq"], payload["agentId"] = rs.clientID, key, rs.seq, f.agent
		c.event("chat", payload)
	}
	assistant := func() map[string]any {
		return map[string]any{"role": protocol.RoleAssistant, "content": []any{map[string]any{"type": "text", "text": rs.text.String()}}, "timestamp": ts}
	}
	switch ev.Type {
	case protocol.LiveLifecycleStart:
		agent("lifecycle", map[string]any{"phase": "start", "startedAt": ts, "sessionKey": key})
	case protocol.LiveTextDelta:
		rs.text.WriteString(ev.Delta)
		if rs.text.Len() > maxCumulativeText {
			// past this, each event would carry the whole reply again (quadratic bytes for
			// every client): only the delta, which clients append
			agent("assistant", map[string]any{"delta": ev.Delta})
			chat(map[string]any{"state": "delta", "deltaText": ev.Delta})
			break
		}
		agent("assistant", map[string]any{"text": rs.text.String(), "delta": ev.Delta})
		chat(map[string]any{"state": "delta", "deltaText": ev.Delta, "message": assistant()})
	case protocol.LiveThinkingDelta:
		agent("thinking", map[string]any{"delta": ev.Delta})
	case protocol.LiveToolStart:
		agent("tool", map[string]any{"phase": "start", "name": ev.ToolName, "toolCallId": ev.ToolCallID, "args": raw(ev.Args)})
	case protocol.LiveToolUpdate:
		agent("tool", map[string]any{"phase": "update", "name": ev.ToolName, "toolCallId": ev.ToolCallID, "partialResult": raw(ev.PartialResult)})
	case protocol.LiveToolResult:
		agent("tool", map[string]any{"phase": "result", "name": ev.ToolName, "toolCallId": ev.ToolCallID, "result": raw(ev.Result), "isError": ev.IsError})
		rs.text.Reset() // the next assistant text is a new message
	case protocol.LiveLifecycleEnd:
		agent("lifecycle", map[string]any{"phase": "end", "endedAt": ts})
		chat(map[string]any{"state": "final", "message": assistant(), "stopReason": "stop"})
		c.endRun(f, rec.RunID)
	case protocol.LiveLifecycleError:
		agent("lifecycle", map[string]any{"phase": "error", "error": truncate(ev.Error, 2000), "endedAt": ts})
		if strings.Contains(strings.ToLower(ev.Error), "cancel") {
			chat(map[string]any{"state": "aborted", "errorMessage": truncate(ev.Error, 2000)})
		} else {
			chat(map[string]any{"state": "error", "errorMessage": truncate(ev.Error, 2000), "errorKind": "unknown"})
		}
		c.endRun(f, rec.RunID)
	}
}

func (c *conn) endRun(f *follower, runID string) {
	c.mu.Lock()
	delete(f.runs, runID)
	c.mu.Unlock()
}

// raw is a JSON value for an event's data (null when absent).
func raw(m json.RawMessage) any {
	if len(m) == 0 {
		return nil
	}
	return m
}

// watchChanges turns on sessions.changed events (sessions.subscribe).
func (c *conn) watchChanges() {
	c.mu.Lock()
	c.changes = true
	c.mu.Unlock()
	c.relayChanges()
}

// relayChanges runs, once per connection, the relay of the gateway-wide change feed: as
// sessions.changed events when the client subscribed to them, and as session.message events for
// the sessions whose messages it subscribed to. The feed's reader never waits on the store: it
// marks a changed session pending and messageLoop reads what the transcript gained, so a burst of
// changes cannot make the feed drop the reader. A reader dropped all the same (it lagged) joins
// the feed again, tells the client to reload (sessions.changed "resync") and looks at every
// subscribed session afresh.
func (c *conn) relayChanges() {
	c.mu.Lock()
	started := c.changesStarted
	c.changesStarted = true
	c.mu.Unlock()
	if started {
		return
	}
	c.wg.Add(2)
	go c.changeLoop()
	go c.messageLoop()
}

func (c *conn) changeLoop() {
	defer c.wg.Done()
	for {
		sub := c.srv.cfg.Sessions.SubscribeChanges(c.srv.cfg.Sessions.ChangesCursor())
		if !c.readChanges(sub) {
			return
		}
		c.mu.Lock()
		on := c.changes
		c.mu.Unlock()
		if on {
			c.event("sessions.changed", map[string]any{"reason": "resync", "ts": c.srv.nowMs()})
		}
		c.markPending("")
	}
}

// readChanges relays sub until it ends; true when it ended because this reader lagged (join
// again), false when the connection or the feed is closing.
func (c *conn) readChanges(sub *sessions.Subscription[*sessions.Change]) bool {
	defer sub.Close()
	for {
		select {
		case <-c.ctx.Done():
			return false
		case ch, ok := <-sub.C():
			if !ok {
				return errors.Is(sub.Err(), sessions.ErrLagged) && c.ctx.Err() == nil
			}
			if ch == nil {
				continue
			}
			c.mu.Lock()
			on := c.changes
			c.mu.Unlock()
			if on {
				c.event("sessions.changed", map[string]any{"reason": ch.Kind, "sessionId": ch.ID, "ts": ch.At.UnixMilli()})
			}
			if ch.Kind == sessions.ChangeSessionUpdated {
				c.markPending(ch.ID)
			}
		}
	}
}

// markPending queues a message-subscribed session ("": every one) for messageLoop.
func (c *conn) markPending(id string) {
	c.mu.Lock()
	for sid, f := range c.subs {
		if f.messages && (id == "" || sid == id) {
			c.pending[sid] = struct{}{}
		}
	}
	n := len(c.pending)
	c.mu.Unlock()
	if n > 0 {
		select {
		case c.kick <- struct{}{}:
		default:
		}
	}
}

// messageLoop announces the new messages of the pending sessions, each once however many
// changes marked it meanwhile.
func (c *conn) messageLoop() {
	defer c.wg.Done()
	for {
		select {
		case <-c.ctx.Done():
			return
		case <-c.kick:
		}
		c.mu.Lock()
		var todo []*follower
		for id := range c.pending {
			if f := c.subs[id]; f != nil && f.messages {
				todo = append(todo, f)
			}
		}
		clear(c.pending)
		c.mu.Unlock()
		for _, f := range todo {
			c.announceMessages(f)
		}
	}
}

// maxMessagesPerUpdate bounds the session.message events one transcript change sends; a client
// further behind reads chat.history.
const maxMessagesPerUpdate = 64

// transcriptTail is a session's messages with their entry ids.
func (c *conn) transcriptTail(ctx context.Context, sessionID string) ([]json.RawMessage, []string, error) {
	t, err := c.srv.cfg.Sessions.Transcript(ctx, sessionID)
	if err != nil {
		return nil, nil, err
	}
	msgs, ids := messagesOf(t)
	return msgs, ids, nil
}

// current reports whether f still follows its session's messages (not unsubscribed or replaced).
func (c *conn) current(f *follower) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.subs[f.sessionID] == f && f.messages
}

// announceMessages sends the messages a session's transcript gained since the last announced
// one as session.message events (the shape OpenClaw's gateway sends: the message with its
// entry id and position). The transcript is read only when its leaf moved.
func (c *conn) announceMessages(f *follower) {
	ctx, cancel := context.WithTimeout(c.ctx, 10*time.Second)
	defer cancel()
	s, err := c.srv.cfg.Sessions.Get(ctx, f.sessionID)
	c.mu.Lock()
	last, leaf, key, agent := f.lastMsg, f.lastLeaf, f.key, f.agent
	c.mu.Unlock()
	if err != nil || s.LeafID == leaf {
		return
	}
	msgs, ids, err := c.transcriptTail(ctx, f.sessionID)
	if err != nil {
		return
	}
	from := 0
	if last != "" {
		i := slices.Index(ids, last)
		if i < 0 {
			// the branch changed under the client (a rewind): it reloads on sessions.changed
			from = len(ids)
		} else {
			from = i + 1
		}
	}
	from = max(from, len(ids)-maxMessagesPerUpdate)
	for i := from; i < len(ids); i++ {
		var m map[string]any
		if json.Unmarshal(msgs[i], &m) != nil || m == nil {
			continue
		}
		if !c.current(f) {
			return
		}
		m["__openclaw"] = map[string]any{"id": ids[i], "seq": i + 1}
		c.event("session.message", map[string]any{"sessionKey": key, "agentId": agent, "message": m, "messageId": ids[i], "messageSeq": i + 1})
	}
	c.mu.Lock()
	if c.subs[f.sessionID] == f {
		f.lastLeaf = s.LeafID
		if len(ids) > 0 {
			f.lastMsg = ids[len(ids)-1]
		}
	}
	c.mu.Unlock()
}

// watchMessages marks a followed session for session.message events from its current tail on.
func (c *conn) watchMessages(ctx context.Context, sessionID string) {
	s, serr := c.srv.cfg.Sessions.Get(ctx, sessionID)
	_, ids, err := c.transcriptTail(ctx, sessionID)
	c.mu.Lock()
	if f := c.subs[sessionID]; f != nil && !f.messages {
		f.messages = true
		if err == nil && serr == nil {
			f.lastLeaf = s.LeafID
			if len(ids) > 0 {
				f.lastMsg = ids[len(ids)-1]
			}
		}
	}
	c.mu.Unlock()
	c.relayChanges()
}

func itoa(n int) string {
	b, _ := json.Marshal(n)
	return string(b)
}

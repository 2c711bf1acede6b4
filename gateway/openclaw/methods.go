package openclaw

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/openclaw/cloudworkers/gateway/sessions"
	"github.com/openclaw/cloudworkers/gateway/store"
	"github.com/openclaw/cloudworkers/gateway/turns"
)

const (
	defaultAgent = sessions.DefaultAgent
	mainKeyName  = "main"
	// callTimeout bounds a short method's work.
	callTimeout = 30 * time.Second
	// maxHistory bounds the messages chat.history returns.
	maxHistory = 1000
)

type method struct {
	scope string // "" for none
	long  bool   // runs in a goroutine of its own (waits for a run)
	fn    func(c *conn, f inFrame) (any, *errorShape)
}

// methods is the closed set this endpoint implements; hello-ok lists exactly these.
var methods = map[string]method{
	"health":                        {"operator.read", false, (*conn).health},
	"status":                        {"operator.read", false, (*conn).status},
	"sessions.list":                 {"operator.read", false, (*conn).sessionsList},
	"sessions.subscribe":            {"operator.read", false, (*conn).sessionsSubscribe},
	"sessions.unsubscribe":          {"operator.read", false, (*conn).sessionsUnsubscribe},
	"sessions.messages.subscribe":   {"operator.read", false, (*conn).messagesSubscribe},
	"sessions.messages.unsubscribe": {"operator.read", false, (*conn).messagesUnsubscribe},
	"sessions.describe":             {"operator.read", false, (*conn).sessionsDescribe},
	"sessions.resolve":              {"operator.read", false, (*conn).sessionsResolve},
	"sessions.create":               {"operator.write", false, (*conn).sessionsCreate},
	"sessions.patch":                {"operator.write", false, (*conn).sessionsPatch},
	"sessions.delete":               {"operator.admin", true, (*conn).sessionsDelete},
	"sessions.abort":                {"operator.write", false, (*conn).chatAbort},
	"chat.startup":                  {"operator.read", false, (*conn).chatHistory},
	"chat.history":                  {"operator.read", false, (*conn).chatHistory},
	"chat.send":                     {"operator.write", false, (*conn).chatSend},
	"sessions.send":                 {"operator.write", false, (*conn).sessionsSend},
	"chat.abort":                    {"operator.write", false, (*conn).chatAbort},
	"chat.metadata":                 {"operator.read", false, (*conn).chatMetadata},
	"agent":                         {"operator.write", true, (*conn).agent},
	"agent.wait":                    {"operator.read", true, (*conn).agentWait},
	"agents.list":                   {"operator.read", false, (*conn).agentsList},
	"agent.identity.get":            {"operator.read", false, (*conn).agentIdentity},
	"models.list":                   {"operator.read", false, (*conn).modelsList},
	"models.authStatus":             {"operator.read", false, (*conn).modelsAuthStatus},
	"commands.list":                 {"operator.read", false, (*conn).commandsList},
	"environments.list":             {"operator.read", false, (*conn).environmentsList},
	"environments.status":           {"operator.read", false, (*conn).environmentsStatus},
	"environments.create":           {"operator.admin", true, (*conn).environmentsCreate},
	"environments.destroy":          {"operator.admin", true, (*conn).environmentsDestroy},
	"environments.session.create":   {"operator.admin", true, (*conn).environmentsSessionCreate},
	"environments.session.status":   {"operator.read", false, (*conn).environmentsSessionStatus},
	"environments.session.destroy":  {"operator.admin", true, (*conn).environmentsSessionDestroy},
	"sessions.dispatch":             {"operator.admin", true, (*conn).sessionsDispatch},
	"sessions.reclaim":              {"operator.admin", true, (*conn).sessionsReclaim},
	"question.list":                 {"operator.read", false, (*conn).questionList},
	"config.get":                    {"operator.read", false, (*conn).configGet},
	"config.patch":                  {"operator.admin", true, (*conn).configPatch},
	"tasks.list":                    {"operator.read", false, (*conn).tasksList},
	"fs.listDir":                    {"operator.admin", false, (*conn).fsListDir},
	"worktrees.branches":            {"operator.admin", false, (*conn).worktreesBranches},
}

// eventNames are the events this endpoint sends.
var eventNames = []string{"connect.challenge", "tick", "shutdown", "chat", "agent", "sessions.changed", "session.message"}

func methodNames() []string {
	out := make([]string, 0, len(methods))
	for name := range methods {
		out = append(out, name)
	}
	sort.Strings(out)
	return out
}

func (c *conn) callCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(c.ctx, callTimeout)
}

// Session keys: a session of ours is "agent:<agent>:<session id>"; "agent:<agent>:main" (and
// "main") is the agent's newest session.

func sessionKeyFor(agent, id string) string { return "agent:" + agent + ":" + id }

// resolveKey finds the session a key names; "" (and no error) for an agent's main key with no
// session yet.
func (c *conn) resolveKey(ctx context.Context, key string) (sessions.Session, *errorShape) {
	agent, rest := defaultAgent, key
	if a, r, ok := strings.Cut(strings.TrimPrefix(key, "agent:"), ":"); ok && strings.HasPrefix(key, "agent:") {
		agent, rest = a, r
	}
	if rest == "" || len(key) > 512 {
		return sessions.Session{}, errf(CodeInvalidRequest, "invalid session key")
	}
	if rest == mainKeyName {
		list, err := c.srv.cfg.Sessions.List(ctx)
		if err != nil {
			return sessions.Session{}, errf(CodeUnavailable, err.Error())
		}
		for _, s := range list { // newest first
			if s.Agent == agent && s.ArchivedAt == nil {
				return s, nil
			}
		}
		return sessions.Session{}, nil
	}
	s, err := c.srv.cfg.Sessions.Get(ctx, rest)
	if errors.Is(err, store.ErrNotFound) {
		return sessions.Session{}, errf(CodeInvalidRequest, "unknown session key: "+truncate(key, 128))
	}
	if err != nil {
		return sessions.Session{}, errf(CodeUnavailable, err.Error())
	}
	return s, nil
}

func (c *conn) health(inFrame) (any, *errorShape) {
	return map[string]any{"ok": true, "ts": c.srv.nowMs(), "durationMs": 0}, nil
}

func (c *conn) status(inFrame) (any, *errorShape) {
	return map[string]any{"ok": true, "version": orDefault(c.srv.cfg.Version, "dev"),
		"uptimeMs": c.srv.cfg.Now().Sub(c.srv.started).Milliseconds(), "connections": c.srv.Connections()}, nil
}

// row is a session as sessions.list shows it.
func (c *conn) row(ctx context.Context, s sessions.Session) map[string]any {
	status := "done"
	if c.srv.cfg.Turns.Busy(s.ID) {
		status = "running"
	}
	title := s.Title
	if title == "" {
		title = s.ID
	}
	r := map[string]any{
		"key": sessionKeyFor(s.Agent, s.ID), "sessionId": s.ID, "kind": "direct", "channel": "webchat",
		"agentId": s.Agent, "displayName": title, "label": title, "status": status,
		"updatedAt": s.UpdatedAt.UnixMilli(), "createdAt": s.CreatedAt.UnixMilli(),
		"archived": s.ArchivedAt != nil, "pinned": false, "hasActiveRun": status == "running",
	}
	if s.Model != "" {
		r["model"] = s.Model
		if p, _, ok := strings.Cut(s.Model, "/"); ok {
			r["modelProvider"] = p
		}
	}
	if s.Workspace != "" {
		r["workspaceDir"] = s.Workspace
	}
	if s.ParentSessionID != "" {
		r["parentSessionId"] = s.ParentSessionID
		r["spawnDepth"] = s.SpawnDepth
	}
	if pl := c.placement(ctx, s); pl != nil {
		r["placement"] = pl
		// OpenClaw's UI treats a row with a repository workspace as a session that runs on a
		// worker (at rest on the gateway it asks for one before a send). Ours also run on the
		// gateway, so only a session that is (or was) on a worker names its workspace so: the UI
		// then offers to bring it home or move it.
		if st, _ := pl["state"].(string); st != "local" && s.Workspace != "" {
			r["repositoryWorkspaceId"] = workspaceID(s.Workspace)
		}
	}
	return r
}

// placement is a session's placement in the protocol's SessionPlacement shape.
func (c *conn) placement(ctx context.Context, s sessions.Session) map[string]any {
	if c.srv.cfg.Placement == nil {
		return nil
	}
	p, ok := c.srv.cfg.Placement(ctx, s.ID)
	if !ok {
		p = Placement{State: "local"}
	}
	return c.placementShape(s, p)
}

// placementShape is a placement in the protocol's SessionPlacement shape. Each state of that
// shape is a closed object with its own required fields (syncing needs the worker bundle hash,
// starting also the workspace base and directory, a worker-owned state also the owner epoch), so
// only the fields a state allows are sent, and a placement whose facts do not yet support its
// state is shown as the latest earlier state they do support.
func (c *conn) placementShape(s sessions.Session, p Placement) map[string]any {
	ms := s.UpdatedAt.UnixMilli()
	out := map[string]any{"state": p.State, "generation": 0, "createdAtMs": s.CreatedAt.UnixMilli(), "updatedAtMs": ms, "stateChangedAtMs": ms}
	if p.Generation > 0 {
		out["generation"] = p.Generation
	}
	state := p.State
	switch state {
	case "local", "requested", "reclaimed":
		return out
	case "provisioning", "syncing", "starting", "active", "draining", "reconciling", "failed":
	default:
		// A state the protocol does not know is shown as the move in progress.
		state = "provisioning"
	}
	if p.ProfileID != "" {
		out["profileId"] = p.ProfileID
	}
	if p.ProviderID != "" {
		out["providerId"] = p.ProviderID
	}
	bundle := ""
	if bundleHashRe.MatchString(p.BundleHash) {
		bundle = p.BundleHash
	}
	workspace := p.BaseManifest != "" && p.BoxWorkspace != ""
	if state == "failed" {
		out["recoveryError"] = orDefault(truncate(p.Error, 500), "placement failed")
		putIf(out, "environmentId", p.EnvironmentID)
		putIf(out, "workerBundleHash", bundle)
		putIf(out, "workspaceBaseManifestRef", p.BaseManifest)
		putIf(out, "remoteWorkspaceDir", p.BoxWorkspace)
		if p.OwnerEpoch > 0 {
			out["activeOwnerEpoch"] = p.OwnerEpoch
		}
		out["state"] = state
		return out
	}
	// Step down to the latest state the facts support.
	level := map[string]int{"provisioning": 0, "syncing": 1, "starting": 2, "active": 3, "draining": 3, "reconciling": 3}[state]
	supported := 0
	if p.EnvironmentID != "" && bundle != "" {
		supported = 1
		if workspace {
			supported = 2
			if p.OwnerEpoch > 0 {
				supported = 3
			}
		}
	}
	if level > supported {
		level = supported
		state = [...]string{"provisioning", "syncing", "starting"}[level]
	}
	out["state"] = state
	putIf(out, "environmentId", p.EnvironmentID)
	if level >= 1 {
		out["workerBundleHash"] = bundle
	}
	if level >= 2 {
		out["workspaceBaseManifestRef"] = p.BaseManifest
		out["remoteWorkspaceDir"] = p.BoxWorkspace
	}
	if level >= 3 {
		out["activeOwnerEpoch"] = p.OwnerEpoch
	}
	return out
}

// bundleHashRe is the protocol's WorkerBundleHash: 64 lower-case hex digits.
var bundleHashRe = regexp.MustCompile(`^[a-f0-9]{64}$`)

func putIf(m map[string]any, key, value string) {
	if value != "" {
		m[key] = value
	}
}

func (c *conn) listPayload(ctx context.Context, limit, offset int) (map[string]any, *errorShape) {
	list, err := c.srv.cfg.Sessions.List(ctx)
	if err != nil {
		return nil, errf(CodeUnavailable, err.Error())
	}
	list = slices.DeleteFunc(list, func(s sessions.Session) bool { return s.ArchivedAt != nil })
	total := len(list)
	if limit <= 0 || limit > 500 {
		limit = 500
	}
	offset = min(max(offset, 0), total)
	end := min(offset+limit, total)
	rows := make([]map[string]any, 0, end-offset)
	for _, s := range list[offset:end] {
		rows = append(rows, c.row(ctx, s))
	}
	out := map[string]any{"ts": c.srv.nowMs(), "count": len(rows), "totalCount": total, "hasMore": end < total, "sessions": rows,
		"defaults": map[string]any{"model": c.srv.cfg.DefaultModel(), "contextTokens": nil}}
	if end < total {
		out["nextOffset"] = end
	}
	return out, nil
}

type listParams struct {
	Limit  int `json:"limit"`
	Offset int `json:"offset"`
}

func (c *conn) sessionsList(f inFrame) (any, *errorShape) {
	var p listParams
	if err := decodeParams(f.Method, f.Params, &p); err != nil {
		return nil, err
	}
	ctx, cancel := c.callCtx()
	defer cancel()
	return c.listPayload(ctx, p.Limit, p.Offset)
}

// sessionsSubscribe turns on sessions.changed events; with list params it answers the list too.
func (c *conn) sessionsSubscribe(f inFrame) (any, *errorShape) {
	c.watchChanges()
	var raw map[string]json.RawMessage
	_ = json.Unmarshal(f.Params, &raw)
	if len(raw) == 0 {
		return map[string]any{"subscribed": true}, nil
	}
	p, err := c.sessionsList(f)
	if err != nil {
		return nil, err
	}
	m := p.(map[string]any)
	m["subscribed"] = true
	return m, nil
}

func (c *conn) sessionsUnsubscribe(inFrame) (any, *errorShape) {
	c.mu.Lock()
	c.changes = false
	c.mu.Unlock()
	return map[string]any{"subscribed": false}, nil
}

type keyParams struct {
	Key        string `json:"key"`
	SessionKey string `json:"sessionKey"`
}

func (p keyParams) key() string {
	if p.SessionKey != "" {
		return p.SessionKey
	}
	return p.Key
}

func (c *conn) messagesSubscribe(f inFrame) (any, *errorShape) {
	var p keyParams
	if err := decodeParams(f.Method, f.Params, &p); err != nil {
		return nil, err
	}
	ctx, cancel := c.callCtx()
	defer cancel()
	s, err := c.resolveKey(ctx, p.key())
	if err != nil {
		return nil, err
	}
	if s.ID != "" {
		if err := c.follow(ctx, s, p.key(), 0, false); err != nil {
			return nil, err
		}
		c.watchMessages(ctx, s.ID)
	}
	return map[string]any{"subscribed": true, "key": p.key()}, nil
}

func (c *conn) messagesUnsubscribe(f inFrame) (any, *errorShape) {
	var p keyParams
	if err := decodeParams(f.Method, f.Params, &p); err != nil {
		return nil, err
	}
	ctx, cancel := c.callCtx()
	defer cancel()
	if s, err := c.resolveKey(ctx, p.key()); err == nil && s.ID != "" {
		c.unfollow(s.ID)
	}
	return map[string]any{"subscribed": false, "key": p.key()}, nil
}

func (c *conn) sessionsDescribe(f inFrame) (any, *errorShape) {
	var p keyParams
	if err := decodeParams(f.Method, f.Params, &p); err != nil {
		return nil, err
	}
	ctx, cancel := c.callCtx()
	defer cancel()
	s, err := c.resolveKey(ctx, p.key())
	if err != nil {
		return nil, err
	}
	if s.ID == "" {
		return nil, errf(CodeInvalidRequest, "no session for key "+truncate(p.key(), 128)+" yet")
	}
	return map[string]any{"session": c.row(ctx, s), "key": sessionKeyFor(s.Agent, s.ID)}, nil
}

type createParams struct {
	AgentID     string `json:"agentId"`
	Label       string `json:"label"`
	DisplayName string `json:"displayName"`
	Model       string `json:"model"`
	Message     string `json:"message"`
	// Cwd is the session's workspace on the gateway (a directory inside workspaces.roots),
	// needed before it can be dispatched to a worker; naming one takes operator.admin.
	Cwd string `json:"cwd"`
	// WorktreeSource "empty" asks for a new empty workspace (the Control UI's "New workspace"),
	// made by the gateway in its own area of the data dir.
	WorktreeSource string `json:"worktreeSource"`
}

// sessionsCreate makes a session on the gateway (in cwd, when given: the workspace a dispatch
// sends to a worker), validated like every other door (workspace roots, agent, model).
func (c *conn) sessionsCreate(f inFrame) (any, *errorShape) {
	var p createParams
	if err := decodeParams(f.Method, f.Params, &p); err != nil {
		return nil, err
	}
	title := p.DisplayName
	if title == "" {
		title = p.Label
	}
	ctx, cancel := c.callCtx()
	defer cancel()
	if p.Cwd != "" {
		if !c.has("operator.admin") {
			return nil, errf(CodeForbidden, "missing scope: operator.admin (sessions.create with cwd)")
		}
		// the same confinement as every other door: inside workspaces.roots, never the data dir
		if err := c.srv.cfg.Sessions.Roots().Check("cwd", p.Cwd); err != nil {
			return nil, errf(CodeInvalidRequest, err.Error())
		}
		if err := sessions.CheckWorkspace(ctx, p.Cwd, false); err != nil {
			return nil, errf(CodeInvalidRequest, strings.Replace(err.Error(), "workspace", "cwd", 1))
		}
	}
	fresh := p.WorktreeSource == "empty"
	switch {
	case p.WorktreeSource != "" && !fresh:
		return nil, errf(CodeInvalidRequest, "sessions.create: worktreeSource must be \"empty\"")
	case fresh && p.Cwd != "":
		return nil, errf(CodeInvalidRequest, "sessions.create: worktreeSource \"empty\" cannot be combined with cwd")
	case fresh && c.srv.cfg.NewWorkspace == nil:
		return nil, errf(CodeUnavailable, "sessions.create: this gateway cannot make new workspaces")
	}
	s, err := c.srv.cfg.Sessions.Create(ctx, sessions.CreateParams{Title: truncate(title, sessions.MaxTitleLen-4), Agent: p.AgentID, Model: p.Model, Workspace: p.Cwd})
	if err != nil {
		return nil, errf(CodeInvalidRequest, err.Error())
	}
	if fresh {
		dir, err := c.srv.cfg.NewWorkspace(s.ID)
		if err == nil {
			if err = c.srv.cfg.Sessions.SetWorkspace(ctx, s.ID, dir); err != nil {
				_ = os.Remove(dir) // made a moment ago, still empty
			}
		}
		if err != nil {
			// The reason (a path of the data dir) stays in the gateway's log; the half-made
			// session is archived so it does not linger as a session without its workspace.
			c.srv.cfg.Log.Warn("new workspace", "session", s.ID, "err", err)
			actx, acancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			defer acancel()
			if _, aerr := c.srv.cfg.Sessions.SetArchived(actx, s.ID, true); aerr != nil {
				c.srv.cfg.Log.Warn("archive session without workspace", "session", s.ID, "err", aerr)
			}
			return nil, errf(CodeUnavailable, "sessions.create: the new workspace could not be made (the gateway's log says why); retry")
		}
		s.Workspace = dir
	}
	out := map[string]any{"ok": true, "key": sessionKeyFor(s.Agent, s.ID), "sessionId": s.ID, "entry": c.row(ctx, s)}
	if strings.TrimSpace(p.Message) != "" {
		t, err := c.srv.cfg.Turns.Send(ctx, s.ID, p.Message, "")
		if err != nil {
			out["runStarted"] = false
			out["runError"] = map[string]any{"code": CodeUnavailable, "message": truncate(err.Error(), 500)}
		} else {
			out["runStarted"], out["runId"] = true, t.RunID
		}
	}
	c.srv.cfg.Sessions.Notify(sessions.ChangeSessionCreated, s.ID)
	return out, nil
}

type patchParams struct {
	keyParams
	Label       *string `json:"label"`
	DisplayName *string `json:"displayName"`
}

// sessionsPatch renames a session (label / displayName); other overrides are refused by name.
func (c *conn) sessionsPatch(f inFrame) (any, *errorShape) {
	var p patchParams
	if err := decodeParams(f.Method, f.Params, &p); err != nil {
		return nil, err
	}
	var raw map[string]json.RawMessage
	_ = json.Unmarshal(f.Params, &raw)
	for k := range raw {
		switch k {
		case "key", "agentId", "label", "displayName", "expectedSessionId":
		default:
			return nil, errf(CodeInvalidRequest, "sessions.patch: "+truncate(k, 64)+" cannot be changed on this gateway (only label)")
		}
	}
	ctx, cancel := c.callCtx()
	defer cancel()
	s, e := c.resolveKey(ctx, p.key())
	if e != nil {
		return nil, e
	}
	if s.ID == "" {
		return nil, errf(CodeInvalidRequest, "no session for key "+truncate(p.key(), 128))
	}
	title := p.Label
	if p.DisplayName != nil {
		title = p.DisplayName
	}
	if title != nil {
		if len(*title) > sessions.MaxTitleLen {
			return nil, errf(CodeInvalidRequest, fmt.Sprintf("label longer than %d bytes", sessions.MaxTitleLen))
		}
		if err := c.srv.cfg.Sessions.SetTitle(ctx, s.ID, *title); err != nil {
			return nil, errf(CodeUnavailable, err.Error())
		}
		s.Title = *title
	}
	return map[string]any{"ok": true, "key": sessionKeyFor(s.Agent, s.ID), "entry": c.row(ctx, s)}, nil
}

type historyParams struct {
	SessionKey  string   `json:"sessionKey"`
	Limit       int      `json:"limit"`
	Cursor      string   `json:"cursor"`
	InputRunIDs []string `json:"inputRunIds"`
}

// chatHistory answers chat.history and chat.startup: the session's transcript as messages. A
// cursor (an entry id we gave as deltaCursor) asks for what came after it.
func (c *conn) chatHistory(f inFrame) (any, *errorShape) {
	var p historyParams
	if err := decodeParams(f.Method, f.Params, &p); err != nil {
		return nil, err
	}
	if p.SessionKey == "" {
		p.SessionKey = sessionKeyFor(defaultAgent, mainKeyName)
	}
	ctx, cancel := c.callCtx()
	defer cancel()
	s, e := c.resolveKey(ctx, p.SessionKey)
	if e != nil {
		return nil, e
	}
	out := map[string]any{"sessionKey": p.SessionKey, "messages": []any{}, "hasMore": false}
	if s.ID == "" {
		return out, nil
	}
	out["sessionId"] = s.ID
	if s.Model != "" {
		out["model"] = s.Model
	}
	msgs, ids, err := c.transcriptTail(ctx, s.ID)
	if err != nil {
		return nil, errf(CodeUnavailable, err.Error())
	}
	if p.Cursor != "" {
		i := slices.Index(ids, p.Cursor)
		if i < 0 {
			return map[string]any{"kind": "reset", "sessionKey": p.SessionKey}, nil
		}
		out["kind"] = "delta"
		msgs, ids = msgs[i+1:], ids[i+1:]
	}
	limit := p.Limit
	if limit <= 0 || limit > maxHistory {
		limit = maxHistory
	}
	if len(msgs) > limit {
		out["hasMore"] = true
		msgs = msgs[len(msgs)-limit:]
	}
	out["messages"] = msgs
	if len(ids) > 0 {
		out["deltaCursor"] = ids[len(ids)-1]
	} else if p.Cursor != "" {
		out["deltaCursor"] = p.Cursor
	}
	return out, nil
}

// messagesOf lists a transcript's messages (the leaf's branch) with their entry ids.
func messagesOf(t sessions.Transcript) ([]json.RawMessage, []string) {
	byID := map[string]sessions.Entry{}
	for _, e := range t.Entries {
		byID[e.ID] = e
	}
	var branch []sessions.Entry
	for id := t.Session.LeafID; id != ""; {
		e, ok := byID[id]
		if !ok || len(branch) > len(t.Entries) {
			break
		}
		branch = append(branch, e)
		id = e.ParentID
	}
	slices.Reverse(branch)
	var msgs []json.RawMessage
	var ids []string
	for _, e := range branch {
		if e.Type == sessions.EntryMessage {
			msgs = append(msgs, e.Content)
			ids = append(ids, e.ID)
		}
	}
	return msgs, ids
}

type sendParams struct {
	SessionKey     string `json:"sessionKey"`
	Message        string `json:"message"`
	IdempotencyKey string `json:"idempotencyKey"`
	AgentID        string `json:"agentId"`
	Model          string `json:"model"`
}

// sessionFor resolves (or, for an agent's main key without a session, creates) the session a
// send goes to.
func (c *conn) sessionFor(ctx context.Context, key, agent, model string) (sessions.Session, string, *errorShape) {
	if key == "" {
		a := agent
		if a == "" {
			a = defaultAgent
		}
		key = sessionKeyFor(a, mainKeyName)
	}
	s, e := c.resolveKey(ctx, key)
	if e != nil {
		return s, key, e
	}
	if s.ID == "" {
		a, _, _ := strings.Cut(strings.TrimPrefix(key, "agent:"), ":")
		if !strings.HasPrefix(key, "agent:") {
			a = defaultAgent
		}
		var err error
		s, err = c.srv.cfg.Sessions.Create(ctx, sessions.CreateParams{Title: mainKeyName, Agent: a, Model: model})
		if err != nil {
			return s, key, errf(CodeInvalidRequest, err.Error())
		}
	}
	return s, key, nil
}

// chatSend starts a turn; its events reach this connection as chat and agent events with the
// client's idempotency key as runId.
func (c *conn) chatSend(f inFrame) (any, *errorShape) {
	var p sendParams
	if err := decodeParams(f.Method, f.Params, &p); err != nil {
		return nil, err
	}
	if strings.TrimSpace(p.Message) == "" || p.IdempotencyKey == "" {
		return nil, errf(CodeInvalidRequest, "chat.send needs message and idempotencyKey")
	}
	ctx, cancel := c.callCtx()
	defer cancel()
	s, key, e := c.sessionFor(ctx, p.SessionKey, p.AgentID, p.Model)
	if e != nil {
		return nil, e
	}
	t, e := c.start(ctx, s, key, p.Message, p.IdempotencyKey)
	if e != nil {
		return nil, e
	}
	return map[string]any{"runId": c.clientRun(t.RunID, p.IdempotencyKey), "status": "started", "sessionKey": key, "sessionId": s.ID}, nil
}

// start follows the session from before the turn (so no event of it is missed) and sends it.
func (c *conn) start(ctx context.Context, s sessions.Session, key, text, idem string) (turns.Turn, *errorShape) {
	if len(idem) > 256 {
		return turns.Turn{}, errf(CodeInvalidRequest, "idempotencyKey longer than 256 bytes")
	}
	cursor, err := c.srv.cfg.Sessions.LiveCursor(ctx, s.ID)
	if err != nil {
		return turns.Turn{}, errf(CodeUnavailable, err.Error())
	}
	if e := c.follow(ctx, s, key, cursor, true); e != nil {
		return turns.Turn{}, e
	}
	t, err := c.srv.cfg.Turns.Send(ctx, s.ID, text, idem)
	if err != nil {
		return turns.Turn{}, errf(CodeUnavailable, "send to session "+s.ID+": "+err.Error())
	}
	c.rememberRun(t.RunID, idem)
	return t, nil
}

type abortParams struct {
	SessionKey string `json:"sessionKey"`
	Key        string `json:"key"`
	RunID      string `json:"runId"`
}

func (c *conn) chatAbort(f inFrame) (any, *errorShape) {
	var p abortParams
	if err := decodeParams(f.Method, f.Params, &p); err != nil {
		return nil, err
	}
	key := p.SessionKey
	if key == "" {
		key = p.Key
	}
	ctx, cancel := c.callCtx()
	defer cancel()
	s, e := c.resolveKey(ctx, key)
	if e != nil {
		return nil, e
	}
	aborted := s.ID != "" && c.srv.cfg.Turns.Cancel(s.ID)
	runIDs := []string{}
	if aborted && p.RunID != "" {
		runIDs = append(runIDs, p.RunID)
	}
	return map[string]any{"ok": true, "aborted": aborted, "runIds": runIDs}, nil
}

func (c *conn) chatMetadata(f inFrame) (any, *errorShape) {
	var p keyParams
	if err := decodeParams(f.Method, f.Params, &p); err != nil {
		return nil, err
	}
	ctx, cancel := c.callCtx()
	defer cancel()
	s, e := c.resolveKey(ctx, p.key())
	if e != nil {
		return nil, e
	}
	out := map[string]any{"sessionKey": p.key()}
	if s.ID != "" {
		out["sessionId"] = s.ID
		out["model"] = orDefault(s.Model, c.srv.cfg.DefaultModel())
	}
	return out, nil
}

type agentParams struct {
	Message        string `json:"message"`
	SessionKey     string `json:"sessionKey"`
	SessionID      string `json:"sessionId"`
	AgentID        string `json:"agentId"`
	IdempotencyKey string `json:"idempotencyKey"`
	Model          string `json:"model"`
	Timeout        int64  `json:"timeout"`
}

// agent runs a turn and answers twice, as the protocol does: {status:"accepted"} at once, then
// {status:"ok"|"error"} when the run ends. Its events carry the idempotency key as runId.
func (c *conn) agent(f inFrame) (any, *errorShape) {
	var p agentParams
	if err := decodeParams(f.Method, f.Params, &p); err != nil {
		return nil, err
	}
	if strings.TrimSpace(p.Message) == "" || p.IdempotencyKey == "" {
		return nil, errf(CodeInvalidRequest, "agent needs message and idempotencyKey")
	}
	key := p.SessionKey
	if key == "" && p.SessionID != "" {
		key = p.SessionID
	}
	ctx, cancel := c.callCtx()
	s, key, e := c.sessionFor(ctx, key, p.AgentID, p.Model)
	if e != nil {
		cancel()
		return nil, e
	}
	t, e := c.start(ctx, s, key, p.Message, p.IdempotencyKey)
	cancel()
	if e != nil {
		return nil, e
	}
	runID := c.clientRun(t.RunID, p.IdempotencyKey)
	c.reply(f, map[string]any{"runId": runID, "status": "accepted", "acceptedAt": c.srv.nowMs(), "sessionKey": key}, nil)
	timeout := time.Duration(p.Timeout) * time.Second
	if timeout <= 0 || timeout > 2*time.Hour {
		timeout = 2 * time.Hour
	}
	end, err := c.waitRun(t.RunID, timeout)
	if err != nil {
		return map[string]any{"runId": runID, "status": "timeout", "summary": "the run did not end within the wait"}, nil
	}
	status := "ok"
	if end.Status != turns.TurnDone {
		status = "error"
	}
	out := map[string]any{"runId": runID, "status": status, "sessionKey": key}
	if end.Error != "" {
		out["summary"] = truncate(end.Error, 500)
	}
	return out, nil
}

type waitParams struct {
	RunID     string `json:"runId"`
	TimeoutMs int64  `json:"timeoutMs"`
}

func (c *conn) agentWait(f inFrame) (any, *errorShape) {
	var p waitParams
	if err := decodeParams(f.Method, f.Params, &p); err != nil {
		return nil, err
	}
	ours := c.ourRun(p.RunID)
	timeout := time.Duration(p.TimeoutMs) * time.Millisecond
	if timeout <= 0 || timeout > 10*time.Minute {
		timeout = 30 * time.Second
	}
	t, err := c.waitRun(ours, timeout)
	if err != nil {
		return map[string]any{"runId": p.RunID, "status": "timeout"}, nil
	}
	status := "ok"
	if t.Status != turns.TurnDone {
		status = "error"
	}
	out := map[string]any{"runId": p.RunID, "status": status}
	if t.Error != "" {
		out["error"] = truncate(t.Error, 500)
	}
	return out, nil
}

// waitRun waits for a turn to end (polling its row: a turn's end is a row change, not a live
// event every client follows).
func (c *conn) waitRun(runID string, timeout time.Duration) (turns.Turn, error) {
	ctx, cancel := context.WithTimeout(c.ctx, timeout)
	defer cancel()
	tick := time.NewTicker(100 * time.Millisecond) // polling interval of a run's end
	defer tick.Stop()
	for {
		t, err := c.srv.cfg.Turns.Get(ctx, runID)
		if err == nil && t.Status.Terminal() {
			return t, nil
		}
		select {
		case <-ctx.Done():
			return turns.Turn{}, ctx.Err()
		case <-tick.C:
		}
	}
}

func (c *conn) agentsList(inFrame) (any, *errorShape) {
	a := map[string]any{"id": defaultAgent, "name": "OpenClaw cloud-worker gateway"}
	if m := c.srv.cfg.DefaultModel(); m != "" {
		a["model"] = map[string]any{"primary": m}
	}
	return map[string]any{"defaultId": defaultAgent, "mainKey": mainKeyName, "scope": "per-sender", "agents": []any{a}}, nil
}

func (c *conn) agentIdentity(inFrame) (any, *errorShape) {
	return map[string]any{"agentId": defaultAgent, "name": "OpenClaw", "nameSource": "default", "avatarStatus": "none"}, nil
}

func (c *conn) modelsList(inFrame) (any, *errorShape) {
	ms := c.srv.cfg.Models()
	out := make([]map[string]any, 0, len(ms))
	for _, m := range ms {
		e := map[string]any{"id": m.ID, "name": orDefault(m.Name, m.ID), "provider": m.Provider}
		if m.ContextWindow > 0 {
			e["contextWindow"] = m.ContextWindow
		}
		out = append(out, e)
	}
	return map[string]any{"models": out}, nil
}

// modelsAuthStatus: the gateway holds every model credential; clients hold none.
func (c *conn) modelsAuthStatus(inFrame) (any, *errorShape) {
	provs := map[string]bool{}
	for _, m := range c.srv.cfg.Models() {
		provs[m.Provider] = true
	}
	out := []map[string]any{}
	for _, p := range slices.Sorted(mapsKeys(provs)) {
		out = append(out, map[string]any{"provider": p, "status": "ok", "source": "gateway"})
	}
	return map[string]any{"providers": out, "ts": c.srv.nowMs()}, nil
}

// commandsList: this gateway has no slash commands (a truthful empty list).
func (c *conn) commandsList(inFrame) (any, *errorShape) {
	return map[string]any{"commands": []any{}}, nil
}

type envListParams struct {
	Projection string `json:"projection"`
}

// environmentsList answers the inventory, or with {projection: "profiles"} the profile catalog.
func (c *conn) environmentsList(f inFrame) (any, *errorShape) {
	var p envListParams
	if err := decodeParams(f.Method, f.Params, &p); err != nil {
		return nil, err
	}
	ctx, cancel := c.callCtx()
	defer cancel()
	res := map[string]any{"environments": []map[string]any{}}
	// The profile catalog (what a dispatch may choose) goes to admin callers, with the
	// environments or alone (projection "profiles"): the Control UI's Where picker reads it from
	// a plain environments.list, its Cloud workers page from the projection.
	if c.has("operator.admin") || p.Projection == "profiles" {
		profs, e := c.profileCatalog(ctx)
		if e != nil {
			return nil, e
		}
		if len(profs) > 0 {
			res["profiles"] = profs
		}
	}
	if p.Projection == "profiles" || c.srv.cfg.Environments == nil {
		return res, nil
	}
	envs, err := c.srv.cfg.Environments(ctx)
	if err != nil {
		return nil, errf(CodeUnavailable, err.Error())
	}
	out := make([]map[string]any, 0, len(envs))
	for _, e := range envs {
		out = append(out, summary(e))
	}
	res["environments"] = out
	return res, nil
}

// profileCatalog is the worker profiles as environments.list shows them.
func (c *conn) profileCatalog(ctx context.Context) ([]map[string]any, *errorShape) {
	if c.srv.cfg.Profiles == nil {
		return nil, nil
	}
	profs, err := c.srv.cfg.Profiles(ctx)
	if err != nil {
		return nil, errf(CodeUnavailable, err.Error())
	}
	var list []map[string]any
	for _, pr := range profs {
		e := map[string]any{"id": pr.ID, "providerId": orDefault(pr.ProviderID, "unknown"), "trust": "disposable",
			"executionMode": "worker-turn", "executionModes": []string{"worker-turn"}}
		var machines []map[string]any
		for i, cl := range pr.Classes {
			if i == 64 {
				break
			}
			machines = append(machines, map[string]any{"id": truncate(cl, 128), "label": truncate(cl, 128), "default": i == 0})
		}
		if len(machines) > 0 {
			e["machines"] = machines
		}
		list = append(list, e)
	}
	return list, nil
}

type envCreateParams struct {
	ProfileID      string `json:"profileId"`
	IdempotencyKey string `json:"idempotencyKey"`
}

// environmentsCreate leases an environment of a profile, idempotent per key, through the same
// environment manager (and capacity limits) as POST /api/v1/environments.
func (c *conn) environmentsCreate(f inFrame) (any, *errorShape) {
	var p envCreateParams
	if err := decodeParams(f.Method, f.Params, &p); err != nil {
		return nil, err
	}
	if p.ProfileID == "" || p.IdempotencyKey == "" || len(p.IdempotencyKey) > 256 {
		return nil, errf(CodeInvalidRequest, "environments.create needs profileId and an idempotencyKey of at most 256 bytes")
	}
	if c.srv.cfg.CreateEnvironment == nil {
		return nil, errf(CodeUnavailable, "this gateway leases no environments")
	}
	ctx, cancel := c.callCtx()
	defer cancel()
	e, err := c.srv.cfg.CreateEnvironment(ctx, p.ProfileID, "openclaw:"+p.IdempotencyKey)
	if err != nil {
		return nil, envError(err)
	}
	return summary(e), nil
}

type envDestroyParams struct {
	EnvironmentID string `json:"environmentId"`
	Force         bool   `json:"force"`
}

// environmentsDestroy tears an environment down and answers once the provider proves it gone (or
// after a minute, with the environment still stopping: the teardown goes on).
func (c *conn) environmentsDestroy(f inFrame) (any, *errorShape) {
	var p envDestroyParams
	if err := decodeParams(f.Method, f.Params, &p); err != nil {
		return nil, err
	}
	if p.EnvironmentID == "" {
		return nil, errf(CodeInvalidRequest, "environments.destroy needs environmentId")
	}
	if c.srv.cfg.DestroyEnvironment == nil {
		return nil, errf(CodeUnavailable, "this gateway leases no environments")
	}
	ctx, cancel := context.WithTimeout(c.ctx, time.Minute)
	defer cancel()
	e, err := c.srv.cfg.DestroyEnvironment(ctx, p.EnvironmentID, p.Force)
	if err != nil {
		return nil, envError(err)
	}
	return summary(e), nil
}

// envError maps an environment refusal onto the protocol's errors.
func envError(err error) *errorShape {
	var ee *EnvironmentError
	if errors.As(err, &ee) {
		if ee.Invalid {
			return &errorShape{Code: CodeInvalidRequest, Message: truncate(ee.Message, 500), Details: map[string]any{"code": ee.Code}}
		}
		return &errorShape{Code: CodeUnavailable, Message: truncate(ee.Message, 500), Retryable: true, RetryAfterMs: ee.RetryAfter.Milliseconds()}
	}
	return errf(CodeUnavailable, truncate(err.Error(), 500))
}

type envParams struct {
	EnvironmentID string `json:"environmentId"`
}

func (c *conn) environmentsStatus(f inFrame) (any, *errorShape) {
	var p envParams
	if err := decodeParams(f.Method, f.Params, &p); err != nil {
		return nil, err
	}
	ctx, cancel := c.callCtx()
	defer cancel()
	if c.srv.cfg.Environments != nil {
		envs, err := c.srv.cfg.Environments(ctx)
		if err != nil {
			return nil, errf(CodeUnavailable, err.Error())
		}
		for _, e := range envs {
			if e.ID == p.EnvironmentID {
				return summary(e), nil
			}
		}
	}
	return nil, errf(CodeInvalidRequest, "unknown environment: "+truncate(p.EnvironmentID, 128))
}

// summary is an environment in the protocol's EnvironmentSummary shape.
func summary(e Environment) map[string]any {
	status := "starting"
	switch e.State {
	case "ready", "attached", "idle":
		status = "available"
	case "draining", "destroying":
		status = "stopping"
	case "destroyed":
		status = "unavailable"
	case "failed", "orphaned":
		status = "error"
	}
	w := map[string]any{"providerId": orDefault(e.ProviderID, "unknown"), "state": e.State, "ageMs": max(e.AgeMs, 0),
		"attachedSessionIds": nonNil(e.AttachedSessionIDs), "tunnelStatus": orDefault(e.TunnelStatus, "stopped")}
	if e.ProfileID != "" {
		w["profileId"] = e.ProfileID
	}
	if e.LeaseID != "" {
		w["leaseId"] = e.LeaseID
	}
	if e.IdleMs > 0 {
		w["idleMs"] = e.IdleMs
	}
	if e.Error != "" {
		w["error"] = truncate(e.Error, 500)
	}
	out := map[string]any{"id": e.ID, "type": "worker", "status": status, "sessionHost": true, "trust": "disposable", "worker": w}
	if e.ProfileID != "" {
		out["label"] = e.ProfileID
	}
	return out
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

func mapsKeys(m map[string]bool) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// questionList: this gateway never asks the operator a question (worker exec needs no approval),
// so the list is truthfully empty.
func (c *conn) questionList(inFrame) (any, *errorShape) {
	return map[string]any{"questions": []any{}}, nil
}

// tasksList: the gateway keeps no background task ledger apart from sessions and their turns
// (those are sessions.list and chat.history), so the list is truthfully empty.
func (c *conn) tasksList(inFrame) (any, *errorShape) {
	return map[string]any{"tasks": []any{}}, nil
}

type deleteParams struct {
	Key               string `json:"key"`
	ExpectedSessionID string `json:"expectedSessionId"`
}

// sessionsDelete removes a session (its transcript, turns and gateway-side workspace copies) as
// `openclaw session rm` does; a session whose work is still on a worker is refused.
func (c *conn) sessionsDelete(f inFrame) (any, *errorShape) {
	var p deleteParams
	if err := decodeParams(f.Method, f.Params, &p); err != nil {
		return nil, err
	}
	if c.srv.cfg.RemoveSession == nil {
		return nil, errf(CodeUnavailable, "this gateway does not remove sessions here")
	}
	ctx, cancel := context.WithTimeout(c.ctx, 2*time.Minute)
	defer cancel()
	s, e := c.resolveKey(ctx, p.Key)
	if e != nil {
		return nil, e
	}
	if s.ID == "" || (p.ExpectedSessionID != "" && p.ExpectedSessionID != s.ID) {
		return nil, &errorShape{Code: CodeInvalidRequest, Message: "no such session for key " + truncate(p.Key, 128), Details: map[string]any{"reason": "session-changed"}}
	}
	if err := c.srv.cfg.RemoveSession(ctx, s.ID); err != nil {
		return nil, errf(CodeInvalidRequest, truncate(err.Error(), 500))
	}
	c.unfollow(s.ID)
	return map[string]any{"ok": true, "key": p.Key, "deleted": true, "archived": []string{}}, nil
}

// workspaceID is a stable opaque id of a session's workspace directory.
func workspaceID(dir string) string {
	sum := sha256.Sum256([]byte(dir))
	return "ws_" + hex.EncodeToString(sum[:8])
}

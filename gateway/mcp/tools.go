package mcp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/openclaw/cloudworkers/gateway/api"
	"github.com/openclaw/cloudworkers/gateway/placement"
	"github.com/openclaw/cloudworkers/gateway/sessions"
	"github.com/openclaw/cloudworkers/gateway/turns"
)

// DispatchInput are the arguments of the dispatch tool.
type DispatchInput struct {
	Workspace    string  `json:"workspace" jsonschema:"absolute path of the workspace directory on the gateway's machine; a git work tree gets its results back as commits on the branch openclaw/<name>"`
	Task         string  `json:"task" jsonschema:"the task for the worker's agent, as its first message"`
	Profile      string  `json:"profile,omitempty" jsonschema:"worker profile to lease the machine from (the operator defines them: openclaw profile list; list_environments shows those in use); default: the server's default profile"`
	MachineClass string  `json:"machineClass,omitempty" jsonschema:"machine class, overriding the profile's (lease-CLI providers only)"`
	Model        string  `json:"model,omitempty" jsonschema:"model reference provider/model for the worker's agent; default: the gateway's default model"`
	Wait         *bool   `json:"wait,omitempty" jsonschema:"true (default): return when the task is done and its results are home; false: return the session id at once and follow it with status"`
	Pullback     *bool   `json:"pullback,omitempty" jsonschema:"with wait, bring the results home after the task (default true); false leaves the session on its worker for follow-up sends"`
	BudgetUSD    float64 `json:"budgetUsd,omitempty" jsonschema:"the session's spend limit in US dollars (its model calls and machines); a call or lease past it is refused, naming the budget"`
}

// DispatchResult is what dispatch, send and status report of a session.
type DispatchResult struct {
	SessionID     string        `json:"sessionId" jsonschema:"the session's id: pass it to status, send and pullback"`
	State         string        `json:"state" jsonschema:"where the session is: dispatching, running, active (on its worker, idle), local (results home), failed"`
	EnvironmentID string        `json:"environmentId,omitempty" jsonschema:"the environment (machine) the session ran on"`
	RunID         string        `json:"runId,omitempty" jsonschema:"the last turn's run id"`
	TurnStatus    string        `json:"turnStatus,omitempty" jsonschema:"the last turn's status: running, done, failed, cancelled"`
	Answer        string        `json:"answer,omitempty" jsonschema:"the agent's final answer of the last turn"`
	Error         string        `json:"error,omitempty" jsonschema:"why the placement or the turn failed"`
	Branch        string        `json:"branch,omitempty" jsonschema:"the managed git branch that holds the worker's commits (after pull-back)"`
	Commits       []Commit      `json:"commits,omitempty" jsonschema:"the worker's commits on the branch, newest first"`
	Files         []ChangedFile `json:"files,omitempty" jsonschema:"the files those commits changed"`
	Uncommitted   []ChangedFile `json:"uncommitted,omitempty" jsonschema:"files of the session's workspace changed outside commits"`
	Workspace     string        `json:"workspace,omitempty" jsonschema:"the directory that holds the results (the anchor)"`
	Resources     []string      `json:"resources,omitempty" jsonschema:"resource URIs of the transcript and the diff"`
	Steps         []string      `json:"steps,omitempty" jsonschema:"placement steps and tool calls seen during this call"`
}

// Commit is one commit of the managed branch.
type Commit struct {
	ID      string `json:"id"`
	Subject string `json:"subject"`
	Author  string `json:"author,omitempty"`
}

// ChangedFile is a path with its git status (A, M, D, ??).
type ChangedFile struct {
	Status string `json:"status"`
	Path   string `json:"path"`
}

// SessionInput names a session.
type SessionInput struct {
	SessionID string `json:"sessionId" jsonschema:"the session id returned by dispatch or list_sessions (ses_…)"`
}

// SendInput are the arguments of send.
type SendInput struct {
	SessionID string `json:"sessionId" jsonschema:"the session id returned by dispatch"`
	Message   string `json:"message" jsonschema:"the next message for the session's agent"`
	Wait      *bool  `json:"wait,omitempty" jsonschema:"true (default): return the answer when the turn ends; false: return at once"`
}

// PullbackInput are the arguments of pullback.
type PullbackInput struct {
	SessionID string `json:"sessionId" jsonschema:"the session to bring home"`
	Force     bool   `json:"force,omitempty" jsonschema:"apply the worker's deletions even past the deletion brake (the profile's sync.maxDeleteShare)"`
	Busy      string `json:"busy,omitempty" jsonschema:"a running turn: drain (default: wait for it to end, then cancel it past the gateway's placement.drainTimeout), cancel (stop it now) or live (stop it at its next model call; it goes on, the same turn, on the gateway)"`
}

// ListSessionsInput are the arguments of list_sessions.
type ListSessionsInput struct {
	Limit int `json:"limit,omitempty" jsonschema:"at most this many sessions, most recently updated first (default 50)"`
}

// SessionSummary is one row of list_sessions.
type SessionSummary struct {
	ID            string `json:"id"`
	Title         string `json:"title"`
	Workspace     string `json:"workspace"`
	Placement     string `json:"placement"`
	EnvironmentID string `json:"environmentId,omitempty"`
	UpdatedAt     string `json:"updatedAt"`
}

// SessionList is the result of list_sessions.
type SessionList struct {
	Sessions []SessionSummary `json:"sessions"`
}

// ListEnvironmentsInput are the arguments of list_environments.
type ListEnvironmentsInput struct {
	All bool `json:"all,omitempty" jsonschema:"include destroyed environments"`
}

// EnvironmentSummary is one row of list_environments.
type EnvironmentSummary struct {
	ID        string `json:"id"`
	ProfileID string `json:"profileId"`
	State     string `json:"state"`
	Error     string `json:"error,omitempty"`
	CreatedAt string `json:"createdAt"`
}

// EnvironmentList is the result of list_environments.
type EnvironmentList struct {
	Environments []EnvironmentSummary `json:"environments"`
}

// DestroyInput are the arguments of destroy_environment.
type DestroyInput struct {
	EnvironmentID string `json:"environmentId" jsonschema:"the environment to tear down (env_…)"`
	Force         bool   `json:"force,omitempty" jsonschema:"destroy even while a session is attached to it (that session's worker is lost)"`
}

// destroyWait is how long destroy_environment waits for proof of teardown before it answers.
const destroyWait = 2 * time.Minute

func (s *Server) addTools() {
	mcp.AddTool(s.mcp, &mcp.Tool{Name: "dispatch", Title: "Run a task on a cloud worker", InputSchema: inputSchema[DispatchInput]("wait", "pullback"),
		Description: `Run a task on a cloud worker: lease (or reuse) a machine of a profile, copy the workspace to it,
run the task there as an agent turn (its model calls go through the gateway), then bring the results
home. Returns the session id, the agent's final answer, and for a git workspace the branch
openclaw/<name> with the worker's commits and the files they changed. Sends a progress notification
at each placement step and each tool call of the worker. With wait: false it returns the session id
at once; follow it with status.`},
		s.dispatch)
	mcp.AddTool(s.mcp, &mcp.Tool{Name: "status", Title: "Status of a dispatched session",
		Description: "Where a session is (dispatching, running, active on its worker, local) and the outcome of its last turn: answer, error, and once home its branch, commits and files."},
		s.status)
	mcp.AddTool(s.mcp, &mcp.Tool{Name: "send", Title: "Send a follow-up message", InputSchema: inputSchema[SendInput]("wait"),
		Description: "Send the next message to a session (a dispatched session still on its worker runs it there). With wait (default) returns the answer when the turn ends, with progress for each tool call."},
		s.send)
	mcp.AddTool(s.mcp, &mcp.Tool{Name: "pullback", Title: "Bring a session's results home",
		Description: "Pass the migration barrier: stop the worker, fast-forward the managed branch openclaw/<name> to the worker's commits and mirror its other files, then report the branch, commits and files. The session's later turns run on the gateway."},
		s.pullback)
	mcp.AddTool(s.mcp, &mcp.Tool{Name: "list_sessions", Title: "List sessions",
		Description: "The gateway's sessions, most recently updated first, with where each runs.",
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}},
		s.listSessions)
	mcp.AddTool(s.mcp, &mcp.Tool{Name: "list_environments", Title: "List environments",
		Description: "The leased machines (environments): their profile and state (provisioning, ready, attached, idle, destroying …).",
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}},
		s.listEnvironments)
	mcp.AddTool(s.mcp, &mcp.Tool{Name: "destroy_environment", Title: "Destroy an environment",
		Description: "Tear down a leased machine; returns once the provider proved it gone (or, after two minutes, while the gateway keeps retrying). Refused while a session is attached unless force.",
		Annotations: &mcp.ToolAnnotations{DestructiveHint: ptr(true)}},
		s.destroyEnvironment)
}

func ptr[T any](v T) *T { return &v }

// inputSchema is the schema inferred from In, with the named optional booleans (pointers, to
// tell "absent" from false) shown as plain booleans that default to true.
func inputSchema[In any](trueByDefault ...string) *jsonschema.Schema {
	sc, err := jsonschema.For[In](nil)
	if err != nil {
		panic(fmt.Sprintf("schema of %T: %v", *new(In), err))
	}
	for _, name := range trueByDefault {
		p := sc.Properties[name]
		p.Types, p.Type, p.Default = nil, "boolean", json.RawMessage("true")
	}
	return sc
}

// toolError is a tool's failure as the agent sees it: the gateway's code and message when the
// gateway refused, prefixed with what the tool was doing.
func toolError(what string, err error) error {
	var ae *api.Error
	if errors.As(err, &ae) {
		if ae.Field != "" {
			return fmt.Errorf("%s: gateway refused (%s, field %s): %s", what, ae.Code, ae.Field, ae.Message)
		}
		return fmt.Errorf("%s: gateway refused (%s): %s", what, ae.Code, ae.Message)
	}
	return fmt.Errorf("%s: %w", what, err)
}

func (s *Server) dispatch(ctx context.Context, req *mcp.CallToolRequest, in DispatchInput) (*mcp.CallToolResult, *DispatchResult, error) {
	ws := strings.TrimSpace(in.Workspace)
	switch {
	case ws == "":
		return nil, nil, errors.New("dispatch: workspace is required: the absolute path of the directory to work in")
	case !filepath.IsAbs(ws):
		return nil, nil, fmt.Errorf("dispatch: workspace %q must be an absolute path", in.Workspace)
	case strings.TrimSpace(in.Task) == "":
		return nil, nil, errors.New("dispatch: task is required: what the worker's agent should do")
	}
	profile := in.Profile
	if profile == "" {
		profile = s.cfg.DefaultProfile
	}
	if profile == "" {
		return nil, nil, errors.New("dispatch: profile is required (no default profile: start `openclaw mcp --profile P`)")
	}
	ws = filepath.Clean(ws)
	if err := s.cfg.Roots.Check("workspace", ws); err != nil {
		return nil, nil, fmt.Errorf("dispatch: %w", err)
	}
	ses, err := s.cfg.Client.CreateSession(ctx, sessions.CreateRequest{
		CreateParams: sessions.CreateParams{Title: "mcp: " + firstLine(in.Task, 60), Workspace: ws, Model: in.Model, BudgetUSD: in.BudgetUSD},
		Target:       &sessions.Target{Kind: "profile", ProfileID: profile, MachineClass: in.MachineClass},
	})
	if err != nil {
		return nil, nil, toolError(fmt.Sprintf("dispatch to workspace %s", ws), err)
	}
	pull := in.Pullback == nil || *in.Pullback
	if in.Wait != nil && !*in.Wait {
		if err := s.startBackground(ses.ID, in.Task); err != nil {
			return nil, nil, err
		}
		return nil, &DispatchResult{SessionID: ses.ID, State: "dispatching", Workspace: ws, Resources: resourceURIs(ses.ID)}, nil
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.CallTimeout)
	defer cancel()
	p := newProgress(ctx, req)
	res, err := s.runTask(ctx, p, ses.ID, in.Task, pull)
	if err != nil {
		return nil, nil, err
	}
	return nil, res, nil
}

// runTask waits for a new session's placement, runs task as its first turn, and (when pull)
// brings the results home.
func (s *Server) runTask(ctx context.Context, p *progress, id, task string, pull bool) (*DispatchResult, error) {
	v, err := s.cfg.Client.WaitPlacement(ctx, id, 0, p.placementStep)
	if err != nil {
		return nil, toolError("dispatch "+id, err)
	}
	if v.Placement.State != placement.Active {
		return nil, fmt.Errorf("dispatch %s: placement ended %s: %s", id, v.Placement.State, v.Placement.Error)
	}
	res, err := s.runTurn(ctx, p, id, task)
	if err != nil {
		return nil, err
	}
	if !pull || res.TurnStatus != string(turns.TurnDone) {
		return res, nil
	}
	return s.pullHome(ctx, p, id, false, "", res)
}

// runTurn sends a message to a session and follows its turn to the end.
func (s *Server) runTurn(ctx context.Context, p *progress, id, text string) (*DispatchResult, error) {
	t, err := s.cfg.Client.SendMessage(ctx, id, turns.SendRequest{Text: text})
	if err != nil {
		return nil, toolError("send to session "+id, err)
	}
	t, err = s.followTurn(ctx, p, t)
	if err != nil {
		return nil, err
	}
	res := &DispatchResult{SessionID: id, RunID: t.RunID, TurnStatus: string(t.Status), Error: t.Error, Resources: resourceURIs(id)}
	res.Answer, _ = s.answer(ctx, id)
	if pv, err := s.cfg.Client.Placement(ctx, id); err == nil {
		res.State, res.EnvironmentID = string(pv.Placement.State), pv.Placement.EnvironmentID
	}
	res.Steps = p.steps()
	return res, nil
}

// pullHome pulls a session back, waits for it to rest and adds its branch changes to res.
func (s *Server) pullHome(ctx context.Context, p *progress, id string, force bool, busy string, res *DispatchResult) (*DispatchResult, error) {
	skip := 0
	if pv, err := s.cfg.Client.Placement(ctx, id); err == nil {
		skip = len(pv.Events)
		if res.EnvironmentID == "" {
			res.EnvironmentID = pv.Placement.EnvironmentID
		}
	}
	if _, err := s.cfg.Client.PullBack(ctx, id, placement.PullBackRequest{Force: force, Busy: busy}); err != nil {
		return nil, toolError("pull back session "+id, err)
	}
	v, err := s.cfg.Client.WaitPlacement(ctx, id, skip, p.placementStep)
	if err != nil {
		return nil, toolError("pull back session "+id, err)
	}
	res.State = string(v.Placement.State)
	if v.Placement.State != placement.Local {
		return nil, fmt.Errorf("pull back session %s: ended %s: %s", id, v.Placement.State, v.Placement.Error)
	}
	s.addChanges(ctx, id, res)
	res.Steps = p.steps()
	return res, nil
}

// addChanges fills in the branch, commits and files that came back to a session's anchor.
func (s *Server) addChanges(ctx context.Context, id string, res *DispatchResult) {
	ch, err := s.cfg.Client.BranchChanges(ctx, id)
	if err != nil {
		s.cfg.Log.Warn("branch changes", "session", id, "err", err)
		return
	}
	res.Branch, res.Workspace = ch.Branch, ch.AnchorDir
	for _, c := range ch.Commits {
		res.Commits = append(res.Commits, Commit{ID: c.ID, Subject: c.Subject, Author: c.Author})
	}
	for _, f := range ch.Files {
		res.Files = append(res.Files, ChangedFile(f))
	}
	for _, f := range ch.Uncommitted {
		res.Uncommitted = append(res.Uncommitted, ChangedFile(f))
	}
}

func (s *Server) status(ctx context.Context, _ *mcp.CallToolRequest, in SessionInput) (*mcp.CallToolResult, *DispatchResult, error) {
	if in.SessionID == "" {
		return nil, nil, errors.New("status: sessionId is required")
	}
	ses, err := s.cfg.Client.Session(ctx, in.SessionID)
	if err != nil {
		return nil, nil, toolError("status of session "+in.SessionID, err)
	}
	res := &DispatchResult{SessionID: ses.ID, State: string(ses.Placement), EnvironmentID: ses.EnvironmentID, Workspace: ses.Workspace, Resources: resourceURIs(ses.ID)}
	s.mu.Lock()
	bg := s.bg[ses.ID]
	var bgDone bool
	var bgErr error
	if bg != nil {
		bgDone, bgErr = bg.done, bg.err
	}
	s.mu.Unlock()
	if bgErr != nil {
		res.Error = bgErr.Error()
	}
	if pv, err := s.cfg.Client.Placement(ctx, ses.ID); err == nil {
		res.State = string(pv.Placement.State)
		if pv.Placement.Error != "" {
			res.Error = pv.Placement.Error
		}
	}
	ts, err := s.cfg.Client.Turns(ctx, ses.ID)
	if err != nil {
		return nil, nil, toolError("status of session "+in.SessionID, err)
	}
	if len(ts) == 0 && bg != nil && !bgDone {
		res.State = "dispatching" // the task is sent once the placement is active
	}
	if len(ts) > 0 {
		last := ts[0]
		for _, t := range ts {
			if t.RunEpoch > last.RunEpoch {
				last = t
			}
		}
		res.RunID, res.TurnStatus = last.RunID, string(last.Status)
		if last.Error != "" {
			res.Error = last.Error
		}
		if last.Status.Ongoing() {
			res.State = "running"
		} else {
			res.Answer, _ = s.answer(ctx, ses.ID)
		}
	}
	if res.State == string(placement.Local) {
		s.addChanges(ctx, ses.ID, res)
	}
	return nil, res, nil
}

func (s *Server) send(ctx context.Context, req *mcp.CallToolRequest, in SendInput) (*mcp.CallToolResult, *DispatchResult, error) {
	switch {
	case in.SessionID == "":
		return nil, nil, errors.New("send: sessionId is required")
	case strings.TrimSpace(in.Message) == "":
		return nil, nil, errors.New("send: message is required")
	}
	if in.Wait != nil && !*in.Wait {
		t, err := s.cfg.Client.SendMessage(ctx, in.SessionID, turns.SendRequest{Text: in.Message})
		if err != nil {
			return nil, nil, toolError("send to session "+in.SessionID, err)
		}
		return nil, &DispatchResult{SessionID: in.SessionID, State: "running", RunID: t.RunID, TurnStatus: string(t.Status), Resources: resourceURIs(in.SessionID)}, nil
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.CallTimeout)
	defer cancel()
	res, err := s.runTurn(ctx, newProgress(ctx, req), in.SessionID, in.Message)
	if err != nil {
		return nil, nil, err
	}
	return nil, res, nil
}

func (s *Server) pullback(ctx context.Context, req *mcp.CallToolRequest, in PullbackInput) (*mcp.CallToolResult, *DispatchResult, error) {
	if in.SessionID == "" {
		return nil, nil, errors.New("pullback: sessionId is required")
	}
	if _, err := placement.ParseBusyPolicy("busy", in.Busy); err != nil {
		return nil, nil, fmt.Errorf("pullback: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.CallTimeout)
	defer cancel()
	res, err := s.pullHome(ctx, newProgress(ctx, req), in.SessionID, in.Force, in.Busy, &DispatchResult{SessionID: in.SessionID, Resources: resourceURIs(in.SessionID)})
	if err != nil {
		return nil, nil, err
	}
	return nil, res, nil
}

// maxListed bounds list_sessions.
const maxListed = 500

func (s *Server) listSessions(ctx context.Context, _ *mcp.CallToolRequest, in ListSessionsInput) (*mcp.CallToolResult, *SessionList, error) {
	if in.Limit < 0 || in.Limit > maxListed {
		return nil, nil, fmt.Errorf("list_sessions: limit must be within 0..%d, got %d", maxListed, in.Limit)
	}
	limit := in.Limit
	if limit == 0 {
		limit = 50
	}
	list, err := s.cfg.Client.Sessions(ctx)
	if err != nil {
		return nil, nil, toolError("list sessions", err)
	}
	out := &SessionList{Sessions: []SessionSummary{}}
	for _, ses := range list[:min(limit, len(list))] {
		out.Sessions = append(out.Sessions, SessionSummary{ID: ses.ID, Title: ses.Title, Workspace: ses.Workspace,
			Placement: string(ses.Placement), EnvironmentID: ses.EnvironmentID, UpdatedAt: ses.UpdatedAt.UTC().Format(time.RFC3339)})
	}
	return nil, out, nil
}

func (s *Server) listEnvironments(ctx context.Context, _ *mcp.CallToolRequest, in ListEnvironmentsInput) (*mcp.CallToolResult, *EnvironmentList, error) {
	list, err := s.cfg.Client.Environments(ctx, in.All)
	if err != nil {
		return nil, nil, toolError("list environments", err)
	}
	out := &EnvironmentList{Environments: []EnvironmentSummary{}}
	for _, e := range list {
		out.Environments = append(out.Environments, EnvironmentSummary{ID: e.ID, ProfileID: e.ProfileID, State: string(e.State),
			Error: e.Error, CreatedAt: e.CreatedAt.UTC().Format(time.RFC3339)})
	}
	return nil, out, nil
}

func (s *Server) destroyEnvironment(ctx context.Context, _ *mcp.CallToolRequest, in DestroyInput) (*mcp.CallToolResult, *EnvironmentSummary, error) {
	if in.EnvironmentID == "" {
		return nil, nil, errors.New("destroy_environment: environmentId is required")
	}
	e, err := s.cfg.Client.DestroyEnvironment(ctx, in.EnvironmentID, api.DestroyOptions{Force: in.Force, Wait: destroyWait})
	if err != nil {
		return nil, nil, toolError("destroy environment "+in.EnvironmentID, err)
	}
	return nil, &EnvironmentSummary{ID: e.ID, ProfileID: e.ProfileID, State: string(e.State), Error: e.Error, CreatedAt: e.CreatedAt.UTC().Format(time.RFC3339)}, nil
}

// startBackground follows a dispatch with wait: false: wait for its placement, send its task.
func (s *Server) startBackground(id, task string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	running := 0
	for sid, b := range s.bg {
		switch {
		case !b.done:
			running++
		case len(s.bg) > s.cfg.MaxBackground:
			delete(s.bg, sid) // an ended one: status reads the gateway's rows for it
		}
	}
	if running >= s.cfg.MaxBackground {
		return fmt.Errorf("dispatch: %d dispatches with wait: false are already being followed (mcp.maxBackground); retry later or use wait: true", running)
	}
	if s.ctx.Err() != nil {
		return errors.New("dispatch: the MCP server is stopping")
	}
	b := &background{}
	s.bg[id] = b
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		ctx, cancel := context.WithTimeout(s.ctx, s.cfg.CallTimeout)
		defer cancel()
		res, err := s.runTask(ctx, newProgress(ctx, nil), id, task, false)
		s.mu.Lock()
		b.done, b.result, b.err = true, res, err
		s.mu.Unlock()
	}()
	return nil
}

func firstLine(s string, n int) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	}
	if r := []rune(s); len(r) > n {
		s = string(r[:n]) + "…"
	}
	return s
}

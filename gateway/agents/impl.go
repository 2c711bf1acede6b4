package agents

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/openclaw/cloudworkers/gateway/envs"
	"github.com/openclaw/cloudworkers/gateway/placement"
	"github.com/openclaw/cloudworkers/gateway/sessions"
	"github.com/openclaw/cloudworkers/gateway/store"
	"github.com/openclaw/cloudworkers/gateway/turns"
	"github.com/openclaw/cloudworkers/internal/clock"
	"github.com/openclaw/cloudworkers/internal/ids"
	"github.com/openclaw/cloudworkers/protocol"
	"github.com/openclaw/cloudworkers/providers"
	"github.com/openclaw/cloudworkers/sync/gitexec"
)

// Bounds of the tools' arguments.
const (
	MaxTaskBytes  = 1 << 20
	MaxLabelBytes = sessions.MaxTitleLen
)

// pollInterval paces the waits on a child's placement and turn.
const pollInterval = 200 * time.Millisecond

// cancelWait bounds how long a canceled child's turn is given to end.
const cancelWait = 30 * time.Second

// check validates a request and fills its defaults; it names the argument that is wrong.
func (s *Spawner) check(req *SpawnRequest) error {
	req.Task = strings.TrimSpace(req.Task)
	switch {
	case req.Task == "":
		return fieldf("task", "is required")
	case len(req.Task) > MaxTaskBytes:
		return fieldf("task", "is %d bytes, at most %d", len(req.Task), MaxTaskBytes)
	case !utf8.ValidString(req.Task):
		return fieldf("task", "is not valid UTF-8")
	case len(req.ToolCallID) > MaxToolCallIDBytes:
		return fieldf("toolCallId", "is %d bytes, at most %d", len(req.ToolCallID), MaxToolCallIDBytes)
	case strings.ContainsFunc(req.ToolCallID, func(r rune) bool { return r < 0x21 || r == 0x7f }) || !utf8.ValidString(req.ToolCallID):
		return fieldf("toolCallId", "has spaces or control characters")
	case len(req.Label) > MaxLabelBytes:
		return fieldf("label", "is %d bytes, at most %d", len(req.Label), MaxLabelBytes)
	case req.RunTimeoutSeconds < 0 || time.Duration(req.RunTimeoutSeconds)*time.Second > MaxRunTimeout:
		return fieldf("runTimeoutSeconds", "must be 0..%d, got %d", int(MaxRunTimeout.Seconds()), req.RunTimeoutSeconds)
	}
	switch req.Workspace {
	case "":
		req.Workspace = WorkspaceFork
	case WorkspaceFork, WorkspaceEmpty:
	default:
		return fieldf("workspace", "must be %q or %q, got %.64q", WorkspaceFork, WorkspaceEmpty, req.Workspace)
	}
	switch req.Cleanup {
	case "":
		req.Cleanup = CleanupKeep
	case CleanupKeep, CleanupDelete:
	default:
		return fieldf("cleanup", "must be %q or %q, got %.64q", CleanupKeep, CleanupDelete, req.Cleanup)
	}
	if req.Profile == "" {
		req.Profile = s.cfg.DefaultProfile
	}
	if req.Profile == "" {
		return ErrNoDefaultProfile
	}
	return nil
}

func (s *Spawner) runTimeout(seconds int) time.Duration {
	if seconds > 0 {
		return time.Duration(seconds) * time.Second
	}
	return s.cfg.RunTimeout.D()
}

// spawn: every check (arguments, depth, profile, capacity) passes before anything is written or
// leased.
func (s *Spawner) spawn(ctx context.Context, parentID string, req SpawnRequest) (SpawnResult, error) {
	d, err := s.deps()
	if err != nil {
		return SpawnResult{}, err
	}
	if err := s.check(&req); err != nil {
		return SpawnResult{}, err
	}
	depth, srcDir, model := 1, "", req.Model
	var parent sessions.Session
	if parentID != "" {
		if req.Dir != "" {
			return SpawnResult{}, fieldf("dir", "is only for a spawn without a parent session")
		}
		if parent, err = d.Sessions.Get(ctx, parentID); err != nil {
			return SpawnResult{}, err
		}
		pp, err := d.Placements.Get(ctx, parentID)
		if err != nil {
			return SpawnResult{}, err
		}
		// A parent placed on a worker is at depth 1 at least, however it got there (a human's
		// dispatch, a spawn, OCC): with the default bound, worker sessions do not lease workers.
		level := parent.SpawnDepth
		if pp.State != placement.Local {
			level = max(level, 1)
		}
		depth = level + 1
		if depth > s.cfg.MaxSpawnDepth {
			return SpawnResult{}, &DepthError{Depth: depth, Max: s.cfg.MaxSpawnDepth}
		}
		srcDir = parent.Workspace
		if pp.State != placement.Local && pp.AnchorDir != "" {
			// A parent on a worker forks the gateway's copy of its workspace (its last
			// checkpoint or sync).
			srcDir = pp.AnchorDir
		}
		if srcDir == "" {
			srcDir = filepath.Join(d.DataDir, "workspaces", parentID)
		}
		if model == "" {
			model = parent.Model
		}
	} else {
		if req.Workspace == WorkspaceFork && (req.Dir == "" || !filepath.IsAbs(req.Dir)) {
			return SpawnResult{}, fieldf("workspace", "a spawn without a parent forks an absolute directory, got %q", req.Dir)
		}
		if req.Dir != "" {
			if err := d.Sessions.Roots().Check("dir", req.Dir); err != nil {
				return SpawnResult{}, asFieldError(err)
			}
		}
		srcDir = req.Dir
	}
	if parentID != "" && req.Workspace == WorkspaceFork {
		if err := d.Sessions.Roots().CheckStored("workspace", srcDir); err != nil {
			return SpawnResult{}, asFieldError(err)
		}
	}
	if req.Workspace == WorkspaceFork {
		if fi, err := os.Stat(srcDir); err != nil || !fi.IsDir() {
			if parentID == "" {
				return SpawnResult{}, fieldf("workspace", "%s is not a directory", srcDir)
			}
			return SpawnResult{}, errNoWorkspace
		}
	}
	if err := d.Sessions.CheckParams(sessions.CreateParams{Model: model, BudgetUSD: req.BudgetUSD}); err != nil {
		return SpawnResult{}, asFieldError(err)
	}
	if err := d.Dispatcher.CheckTarget(ctx, req.Profile, req.MachineClass); errors.Is(err, store.ErrNotFound) {
		return SpawnResult{}, fieldf("profile", "no profile %q (see `openclaw profile list`)", req.Profile)
	} else if fe := (*providers.FieldError)(nil); errors.As(err, &fe) {
		return SpawnResult{}, &FieldError{Field: fe.Field, Msg: fe.Message}
	} else if err != nil {
		return SpawnResult{}, fmt.Errorf("profile %q: %w", req.Profile, err)
	}

	// Capacity is claimed under the lock, so that two spawns at once cannot both take the last
	// slot; the claim is given back once the dispatch is recorded (the placement row counts from
	// then) or refused.
	if err := s.claim(ctx, d, req.Profile, req.MachineClass); err != nil {
		return SpawnResult{}, err
	}
	claimed := true
	unclaim := func() {
		if claimed {
			claimed = false
			s.unclaim(req.Profile)
		}
	}
	defer unclaim()

	ws := filepath.Join(d.DataDir, "agents", ids.Hex(8), "workspace")
	if req.Workspace == WorkspaceFork {
		mode, err := fork(ctx, srcDir, ws)
		if mode == "git" && parentID != "" && srcDir == parent.Workspace {
			// The child's branch is fetched into the parent's repository once it is back.
			req.parentRepo = srcDir
		}
		if err != nil {
			_ = os.RemoveAll(filepath.Dir(ws))
			return SpawnResult{}, err
		}
	} else if err := os.MkdirAll(ws, 0o755); err != nil {
		return SpawnResult{}, err
	}
	child, err := d.Sessions.Create(ctx, sessions.CreateParams{Title: req.Label, Model: model, Workspace: ws, BudgetUSD: req.BudgetUSD,
		Parent: parentID, ToolCallID: req.ToolCallID, Depth: depth})
	if err != nil {
		_ = os.RemoveAll(filepath.Dir(ws))
		return SpawnResult{}, err
	}
	if err := s.remember(ctx, d, child.ID, req); err != nil {
		return SpawnResult{}, fmt.Errorf("record spawn options of %s: %w", child.ID, err)
	}
	s.audit(ctx, d, "agents.spawn", fmt.Sprintf("session %s spawned %s (tool call %s, depth %d, profile %s, workspace %s, cleanup %s, wait %t)",
		orOperator(parentID), child.ID, req.ToolCallID, depth, req.Profile, req.Workspace, req.Cleanup, req.Waits()))
	_, err = d.Dispatcher.Dispatch(ctx, child.ID, req.Profile, req.MachineClass)
	unclaim()
	if err != nil {
		return s.result(ctx, d, child.ID), fmt.Errorf("dispatch child %s: %w", child.ID, err)
	}
	if !req.Waits() {
		// A follower places the child and starts its task.
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			fctx, cancel := context.WithTimeout(s.ctx, s.runTimeout(req.RunTimeoutSeconds))
			defer cancel()
			if _, err := s.placeAndStart(fctx, d, child.ID, req.Task, req.Progress); err != nil {
				d.Log.Warn("spawned child did not start", "child", child.ID, "err", err)
			}
		}()
		r := s.result(ctx, d, child.ID)
		r.Status = StatusStarting
		return r, nil
	}
	return s.runAndCollect(ctx, d, child.ID, req.Task, req)
}

func orOperator(id string) string {
	if id == "" {
		return "(operator)"
	}
	return id
}

// claim takes a slot of the profile's maxEnvironments for a spawn about to be dispatched, or
// refuses it with a *RetryError. unclaim gives it back once the dispatch is recorded or refused.
func (s *Spawner) claim(ctx context.Context, d *Deps, profileID, class string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.capacity(ctx, d, profileID, class); err != nil {
		return err
	}
	s.admitting[profileID]++
	return nil
}

func (s *Spawner) unclaim(profileID string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.admitting[profileID]--
}

// capacity refuses a spawn that the profile's maxEnvironments blocks now: its live environments,
// less the idle ones a dispatch would reuse, plus the dispatches that hold none yet (placements
// requested with no environment leased for them, and spawns being admitted). s.mu is held.
func (s *Spawner) capacity(ctx context.Context, d *Deps, profileID, class string) error {
	prof, err := d.Envs.Profile(ctx, profileID)
	if err != nil {
		return err
	}
	list, err := d.Envs.List(ctx, false)
	if err != nil {
		return err
	}
	ps, err := d.Placements.List(ctx, placement.MaxListedPlacements)
	if err != nil {
		return err
	}
	waiting := map[string]bool{} // sessions whose dispatch to the profile has no environment yet
	for _, p := range ps {
		if p.ProfileID == profileID && p.State == placement.Requested && p.EnvironmentID == "" {
			waiting[p.SessionID] = true
		}
	}
	live, idle := 0, 0
	for _, e := range list {
		if e.ProfileID != profileID || !e.State.Live() {
			continue
		}
		live++
		// an environment being leased for a requested placement counts once
		if rest, ok := strings.CutPrefix(e.IdempotencyKey, "dispatch-"); ok {
			if i := strings.LastIndexByte(rest, '-'); i > 0 {
				delete(waiting, rest[:i])
			}
		}
		if (e.State == envs.Ready || e.State == envs.Idle) && (class == "" || e.Class() == class) &&
			(d.Admitted == nil || d.Admitted(e.ID)) {
			idle++
		}
	}
	pending := len(waiting) + s.admitting[profileID]
	if prof.MaxEnvironments-live+idle-pending <= 0 {
		return &RetryError{RetryAfter: DefaultRetryAfter, Err: fmt.Errorf("profile %q is at its maxEnvironments limit %d (%d live environments, %d being placed, none idle)",
			profileID, prof.MaxEnvironments, live, pending)}
	}
	return nil
}

// placeAndStart waits for the child's placement to be active, then starts msg as its turn.
func (s *Spawner) placeAndStart(ctx context.Context, d *Deps, childID, msg string, progress func(Progress)) (turns.Turn, error) {
	err := s.waitPlacement(ctx, d, childID, progress, func(p placement.Placement) (bool, error) {
		switch p.State {
		case placement.Active:
			return true, nil
		case placement.Failed, placement.Local, placement.Reclaimed:
			return false, fmt.Errorf("child %s was not placed on a worker: %s %s", childID, p.State, p.Error)
		}
		return false, nil
	})
	if err != nil {
		return turns.Turn{}, err
	}
	t, err := d.Turns.Send(ctx, childID, msg, "")
	if err != nil {
		return t, fmt.Errorf("start the child's turn: %w", err)
	}
	if progress != nil {
		progress(Progress{SessionID: childID, Kind: "turn", Message: "running " + t.RunID})
	}
	return t, nil
}

// waitPlacement polls the child's placement until done says so (or fails), telling progress of
// each new state.
func (s *Spawner) waitPlacement(ctx context.Context, d *Deps, childID string, progress func(Progress), done func(placement.Placement) (bool, error)) error {
	last := placement.State("")
	// the poll: what done reads beyond the placement (a worker's admission)
	return d.Placements.Await(ctx, childID, pollInterval, func() (bool, error) {
		p, err := d.Placements.Get(ctx, childID)
		if err != nil {
			return false, err
		}
		if p.State != last && progress != nil {
			progress(Progress{SessionID: childID, Kind: "placement", Message: string(p.State)})
		}
		last = p.State
		return done(p)
	})
}

// waitTurn waits for the run to end. When ctx ends first (the parent's turn was canceled, or the
// run timeout passed) the child's turn is canceled and given cancelWait to end.
func (s *Spawner) waitTurn(ctx context.Context, d *Deps, t turns.Turn, progress func(Progress)) (turns.Turn, error) {
	if progress != nil {
		if sub, err := d.Sessions.Subscribe(ctx, t.SessionID, t.Cursor); err == nil {
			go func() {
				defer sub.Close()
				for r := range sub.C() {
					if r.RunID == t.RunID && r.Event.Type == protocol.LiveToolStart {
						progress(Progress{SessionID: t.SessionID, Kind: "tool", Message: r.Event.ToolName})
					}
				}
			}()
		}
	}
	tick := clock.Or(d.Clock).NewTicker(pollInterval)
	defer tick.Stop()
	for {
		cur, err := d.Turns.Get(context.WithoutCancel(ctx), t.RunID)
		if err == nil && !cur.Status.Ongoing() {
			return cur, nil
		}
		select {
		case <-ctx.Done():
			d.Turns.Cancel(t.SessionID)
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cancelWait)
			defer cancel()
			for {
				cur, err := d.Turns.Get(cctx, t.RunID)
				if err == nil && !cur.Status.Ongoing() {
					return cur, ctx.Err()
				}
				select {
				case <-cctx.Done():
					return cur, ctx.Err()
				case <-tick.C():
				}
			}
		case <-tick.C():
		}
	}
}

// runAndCollect places the child, runs msg, pulls its results back and applies its cleanup.
func (s *Spawner) runAndCollect(ctx context.Context, d *Deps, childID, msg string, req SpawnRequest) (SpawnResult, error) {
	t, err := s.placeAndStart(ctx, d, childID, msg, req.Progress)
	if err != nil {
		r := s.result(context.WithoutCancel(ctx), d, childID)
		return r, err
	}
	rctx, cancel := context.WithTimeout(ctx, s.runTimeout(req.RunTimeoutSeconds))
	defer cancel()
	end, werr := s.waitTurn(rctx, d, t, req.Progress)
	if werr != nil {
		r := s.result(context.WithoutCancel(ctx), d, childID)
		if ctx.Err() != nil {
			return r, fmt.Errorf("the parent's turn was canceled; child %s canceled: %w", childID, ctx.Err())
		}
		return r, fmt.Errorf("child %s did not finish within its run timeout %s and was canceled", childID, s.runTimeout(req.RunTimeoutSeconds))
	}
	r, err := s.collect(ctx, d, childID, "")
	if err != nil {
		return r, err
	}
	if end.Status != turns.TurnDone {
		r.Status, r.Error = string(end.Status), end.Error
	}
	return r, nil
}

// collect pulls the child back (if it is on a worker), waits until its results are home, applies
// its cleanup and returns what came back.
func (s *Spawner) collect(ctx context.Context, d *Deps, childID string, policy placement.BusyPolicy) (SpawnResult, error) {
	p, err := d.Placements.Get(ctx, childID)
	if err != nil {
		return SpawnResult{}, err
	}
	envID := p.EnvironmentID
	if p.State != placement.Local {
		if policy == "" {
			policy = placement.BusyDrain
		}
		if _, err := d.Dispatcher.PullBackBusy(ctx, childID, false, policy); err != nil {
			return s.result(ctx, d, childID), fmt.Errorf("pull back child %s: %w", childID, err)
		}
		err = s.waitPlacement(ctx, d, childID, nil, func(p placement.Placement) (bool, error) {
			switch p.State {
			case placement.Local:
				return true, nil
			case placement.Failed:
				return false, fmt.Errorf("pull back child %s: %s", childID, p.Error)
			}
			return false, nil
		})
		if err != nil {
			return s.result(context.WithoutCancel(ctx), d, childID), err
		}
	}
	r := s.result(ctx, d, childID)
	opts := s.recalled(ctx, d, childID)
	if opts.parentRepo != "" && r.Branch != "" {
		// The parent's own repository gets the child's branch (a ref of the child's name only;
		// the parent's checkout, index and other refs are not touched), so the parent can merge it.
		ref := "refs/heads/" + r.Branch
		if _, err := gitexec.Run(ctx, opts.parentRepo, "fetch", "--quiet", "--no-tags", "--no-write-fetch-head", "--",
			r.Workspace, "+"+ref+":"+ref); err != nil {
			d.Log.Warn("fetch the child's branch into the parent's repository", "child", childID, "err", err)
			r.Error = "the branch " + r.Branch + " could not be fetched into your repository: " + err.Error()
		} else {
			r.ParentBranch = r.Branch
		}
	}
	if opts.Cleanup == CleanupDelete && envID != "" {
		if _, err := d.Envs.RequestDestroy(ctx, envID, false); err != nil {
			d.Log.Warn("destroy child environment", "child", childID, "env", envID, "err", err)
		} else {
			s.audit(ctx, d, "agents.cleanup", fmt.Sprintf("child %s: environment %s destroyed after pull-back", childID, envID))
		}
	}
	return r, nil
}

// own refuses a session that parentID did not spawn ("" may drive any).
func (s *Spawner) own(ctx context.Context, d *Deps, parentID, childID string) error {
	if childID == "" {
		return fieldf("sessionId", "is required")
	}
	c, err := d.Sessions.Get(ctx, childID)
	if err != nil || (parentID != "" && c.ParentSessionID != parentID) {
		// The same answer for "no such session" and "someone else's": a parent learns nothing
		// about sessions it did not spawn.
		return fmt.Errorf("session %.64q: %w", childID, ErrNotChild)
	}
	return nil
}

// child returns the dependencies to drive childID with, once own allowed parentID to.
func (s *Spawner) child(ctx context.Context, parentID, childID string) (*Deps, error) {
	d, err := s.deps()
	if err != nil {
		return nil, err
	}
	return d, s.own(ctx, d, parentID, childID)
}

func (s *Spawner) send(ctx context.Context, parentID, childID, message string, wait bool) (SpawnResult, error) {
	d, err := s.deps()
	if err != nil {
		return SpawnResult{}, err
	}
	message = strings.TrimSpace(message)
	if message == "" {
		return SpawnResult{}, fieldf("message", "is required")
	}
	if len(message) > MaxTaskBytes {
		return SpawnResult{}, fieldf("message", "is %d bytes, at most %d", len(message), MaxTaskBytes)
	}
	if err := s.own(ctx, d, parentID, childID); err != nil {
		return SpawnResult{}, err
	}
	req := s.recalled(ctx, d, childID)
	p, err := d.Placements.Get(ctx, childID)
	if err != nil {
		return SpawnResult{}, err
	}
	if p.State == placement.Local {
		// Pulled back: the follow-up runs on a worker again.
		if req.Profile == "" {
			req.Profile = p.ProfileID
		}
		if err := s.claim(ctx, d, req.Profile, p.MachineClass); err != nil {
			return SpawnResult{}, err
		}
		_, err := d.Dispatcher.Dispatch(ctx, childID, req.Profile, p.MachineClass)
		s.unclaim(req.Profile)
		if err != nil {
			return SpawnResult{}, fmt.Errorf("dispatch child %s again: %w", childID, err)
		}
	}
	s.audit(ctx, d, "agents.send", fmt.Sprintf("session %s sent a message to child %s (wait %t)", orOperator(parentID), childID, wait))
	if !wait {
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			fctx, cancel := context.WithTimeout(s.ctx, s.runTimeout(req.RunTimeoutSeconds))
			defer cancel()
			if _, err := s.placeAndStart(fctx, d, childID, message, nil); err != nil {
				d.Log.Warn("message to child", "child", childID, "err", err)
			}
		}()
		r := s.result(ctx, d, childID)
		return r, nil
	}
	return s.runAndCollect(ctx, d, childID, message, req)
}

func (s *Spawner) status(ctx context.Context, parentID, childID string) (SpawnResult, error) {
	d, err := s.child(ctx, parentID, childID)
	if err != nil {
		return SpawnResult{}, err
	}
	return s.result(ctx, d, childID), nil
}

func (s *Spawner) pullback(ctx context.Context, parentID, childID, busy string) (SpawnResult, error) {
	var policy placement.BusyPolicy
	if busy != "" {
		var err error
		if policy, err = placement.ParseBusyPolicy("busy", busy); err != nil {
			return SpawnResult{}, err
		}
		if policy == placement.BusyLive {
			return SpawnResult{}, providers.Fieldf("busy", "a child's results come home with its turn ended: drain (wait for it) or cancel (stop it), not live")
		}
	}
	d, err := s.child(ctx, parentID, childID)
	if err != nil {
		return SpawnResult{}, err
	}
	if d.Turns.Busy(childID) {
		if policy == "" {
			return s.result(ctx, d, childID), fmt.Errorf("child %s: %w; wait for it (sessions_status), pull back after it ends, or say busy: drain (wait for it here) or cancel (stop it)", childID, placement.ErrBusy)
		}
		if p, err := d.Placements.Get(ctx, childID); err == nil && p.State == placement.Local {
			// on the gateway: nothing to bring home, only its turn to end
			if err := s.settleLocal(ctx, d, childID, policy); err != nil {
				return s.result(context.WithoutCancel(ctx), d, childID), err
			}
		}
	}
	s.audit(ctx, d, "agents.pullback", fmt.Sprintf("session %s pulled back child %s", orOperator(parentID), childID))
	return s.collect(ctx, d, childID, policy)
}

// settleLocal ends the running turn of a child on the gateway by policy: drain waits for it,
// cancel stops it; both wait (bounded by ctx) until it has ended.
func (s *Spawner) settleLocal(ctx context.Context, d *Deps, childID string, policy placement.BusyPolicy) error {
	if policy == placement.BusyCancel {
		d.Turns.Cancel(childID)
	}
	// a turn's end releases its claim (a change); the poll covers the turn's own record
	if err := d.Placements.Await(ctx, childID, pollInterval, func() (bool, error) { return !d.Turns.Busy(childID), nil }); err != nil {
		return fmt.Errorf("wait for the turn of child %s to end: %w", childID, err)
	}
	return nil
}

func (s *Spawner) children(ctx context.Context, parentID string) ([]Child, error) {
	d, err := s.deps()
	if err != nil {
		return nil, err
	}
	rows, err := d.DB.R.QueryContext(ctx, `SELECT id, title, spawn_tool_call_id FROM sessions WHERE parent_session_id=? ORDER BY created_at, id`, parentID)
	if err != nil {
		return nil, err
	}
	var out []Child
	for rows.Next() {
		var c Child
		if err := rows.Scan(&c.SessionID, &c.Label, &c.ToolCallID); err != nil {
			rows.Close()
			return nil, err
		}
		out = append(out, c)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	for i := range out {
		r := s.result(ctx, d, out[i].SessionID)
		out[i].Status, out[i].Placement, out[i].EnvID, out[i].Usage, out[i].Cost = r.Status, r.Placement, r.EnvironmentID, r.Usage, r.Cost
	}
	return out, nil
}

// result derives a child's status from its placement and last turn, with its answer, what came
// back, and its usage and cost (its own and its descendants').
func (s *Spawner) result(ctx context.Context, d *Deps, childID string) SpawnResult {
	r := SpawnResult{SessionID: childID, Status: StatusStarting}
	if c, err := d.Sessions.Get(ctx, childID); err == nil {
		r.ParentID, r.Label = c.ParentSessionID, c.Title
		r.Workspace = c.Workspace
	}
	p, err := d.Placements.Get(ctx, childID)
	if err != nil {
		r.Error = err.Error()
		return r
	}
	r.Placement, r.EnvironmentID, r.ProfileID = string(p.State), p.EnvironmentID, p.ProfileID
	var last *turns.Turn
	if list, err := d.Turns.List(ctx, childID); err == nil && len(list) > 0 {
		last = &list[len(list)-1]
		r.RunID = last.RunID
	}
	switch {
	case p.State == placement.Failed:
		r.Status, r.Error = StatusFailed, p.Error
	case p.State == placement.Reclaimed:
		r.Status, r.Error = StatusFailed, "the child's worker was lost (reclaimed); sessions_send brings it back"
	case last == nil:
		r.Status = StatusStarting
	case last.Status.Ongoing():
		r.Status = StatusRunning
	case last.Status == turns.TurnFailed:
		r.Status, r.Error = StatusFailed, last.Error
	case last.Status == turns.TurnCanceled:
		r.Status = StatusCanceled
	default:
		r.Status = StatusDone
	}
	r.PulledBack = p.State == placement.Local
	if msgs, err := d.Sessions.Context(ctx, childID); err == nil {
		for i := len(msgs) - 1; i >= 0; i-- {
			if msgs[i].Role == protocol.RoleAssistant {
				if txt := strings.TrimSpace(msgs[i].Text()); txt != "" {
					r.Answer = txt
					break
				}
			}
		}
	}
	if d.Workspace != nil {
		if ch, err := d.Workspace.Changes(ctx, childID); err == nil {
			r.Branch, r.Commits = ch.Branch, ch.Commits
			r.Files = append(ch.Files, ch.Uncommitted...)
			if ch.AnchorDir != "" {
				r.Workspace = ch.AnchorDir
			}
		}
	}
	r.Usage, r.Cost = s.usage(ctx, d, childID)
	return r
}

// usage sums the model calls of a session and its descendants.
func (s *Spawner) usage(ctx context.Context, d *Deps, sessionID string) (Usage, float64) {
	var u Usage
	var cost float64
	err := d.DB.R.QueryRowContext(ctx, `WITH RECURSIVE tree(id) AS (
			SELECT ? UNION SELECT s.id FROM sessions s JOIN tree ON s.parent_session_id = tree.id)
		SELECT COUNT(*), COALESCE(SUM(input_tokens),0), COALESCE(SUM(output_tokens),0), COALESCE(SUM(total_tokens),0), COALESCE(SUM(cost),0)
		FROM inference_calls WHERE session_id IN (SELECT id FROM tree)`, sessionID).
		Scan(&u.Calls, &u.InputTokens, &u.OutputTokens, &u.TotalTokens, &cost)
	if err != nil {
		d.Log.Warn("child usage", "session", sessionID, "err", err)
	}
	return u, cost
}

func (s *Spawner) audit(ctx context.Context, d *Deps, kind, detail string) {
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := d.DB.InTx(actx, func(tx *sql.Tx) error { return store.Audit(actx, tx, clock.Or(d.Clock).Now(), kind, "", detail) }); err != nil {
		d.Log.Warn("audit", "kind", kind, "err", err)
	}
}

// remember records a child's spawn options (profile, cleanup, timeout, the parent's repository)
// for its follow-ups and its cleanup, in SQLite, so that a restarted gateway still applies them.
func (s *Spawner) remember(ctx context.Context, d *Deps, childID string, req SpawnRequest) error {
	req.Task, req.Progress = "", nil
	raw, err := json.Marshal(req)
	if err != nil {
		return err
	}
	return d.DB.InTx(ctx, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO spawn_options(session_id, options, parent_repo) VALUES(?,?,?)
			ON CONFLICT(session_id) DO UPDATE SET options=excluded.options, parent_repo=excluded.parent_repo`,
			childID, string(raw), req.parentRepo)
		return err
	})
}

// recalled returns the options a child was spawned with (zero for one with none recorded).
func (s *Spawner) recalled(ctx context.Context, d *Deps, childID string) SpawnRequest {
	var raw, repo string
	var req SpawnRequest
	err := d.DB.R.QueryRowContext(ctx, `SELECT options, parent_repo FROM spawn_options WHERE session_id=?`, childID).Scan(&raw, &repo)
	if err != nil {
		if !errors.Is(err, sql.ErrNoRows) {
			d.Log.Warn("spawn options", "session", childID, "err", err)
		}
		return req
	}
	if err := json.Unmarshal([]byte(raw), &req); err != nil {
		d.Log.Warn("spawn options", "session", childID, "err", err)
	}
	req.parentRepo = repo
	return req
}

func itoa(n int) string { return strconv.Itoa(n) }

// DeleteTx deletes the spawn options of a removed session in tx (session rm).
func (s *Spawner) DeleteTx(ctx context.Context, tx *sql.Tx, sessionID string) error {
	if _, err := tx.ExecContext(ctx, `DELETE FROM spawn_options WHERE session_id = ?`, sessionID); err != nil {
		return fmt.Errorf("remove spawn options of %s: %w", sessionID, err)
	}
	return nil
}

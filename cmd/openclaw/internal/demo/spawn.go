package demo

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/openclaw/cloudworkers/cmd/openclaw/internal/console"
	"github.com/openclaw/cloudworkers/gateway/agents"
	"github.com/openclaw/cloudworkers/gateway/envs"
	"github.com/openclaw/cloudworkers/gateway/sessions"
	"github.com/openclaw/cloudworkers/gateway/turns"
	"github.com/openclaw/cloudworkers/internal/clock"
	"github.com/openclaw/cloudworkers/protocol"
	"github.com/openclaw/cloudworkers/providers/local"
)

// spawnScript is the parent agent of the spawn stage: one sessions_spawn (the child runs the demo
// script on its own worker, from a fork of the parent's workspace), then its answer.
const spawnScript = `[
  {"text": "I'll hand this to a child agent on a cloud worker.", "toolCalls": [{"name": "sessions_spawn", "arguments": {"task": "` + message + `", "label": "demo child", "model": "demo/demo", "cleanup": "delete"}}]},
  {"text": "The child did it on its own worker; its commit is on its branch."}
]
`

// spawnChild runs a local session whose agent spawns a child session on a worker (sessions_spawn,
// wait): the child forks the user's workspace, commits there, comes back with its branch and
// cost, and its environment is destroyed after the pull-back (cleanup "delete").
func (d *run) spawnChild(ctx context.Context) (string, error) {
	ses, err := d.c.CreateSession(ctx, sessions.CreateRequest{CreateParams: sessions.CreateParams{Title: "openclaw demo parent", Workspace: d.ws, Model: "spawner/demo"}})
	if err != nil {
		return "", fmt.Errorf("create session: %w", err)
	}
	const ask = "Get a child agent on a cloud worker to make the greeting say where it ran."
	t, err := d.c.SendMessage(ctx, ses.ID, turns.SendRequest{Text: ask})
	if err != nil {
		return "", fmt.Errorf("send: %w", err)
	}
	fmt.Fprintf(d.out, "   session %s (on the gateway) > %s\n", ses.ID, ask)
	p := &console.Printer{Out: d.out, Info: d.out}
	outcome, err := p.FollowTurn(ctx, d.c, ses.ID, t.RunID, t.Cursor, nil)
	if err != nil {
		return "", err
	}
	if outcome.Event.Type != protocol.LiveLifecycleEnd {
		return "", fmt.Errorf("the parent's turn %s ended %s: %s", t.RunID, outcome.Event.Type, outcome.Event.Error)
	}
	tr, err := d.c.Transcript(ctx, ses.ID)
	if err != nil {
		return "", err
	}
	var res *agents.SpawnResult
	for _, e := range tr.Entries {
		var m protocol.Message
		if json.Unmarshal(e.Content, &m) != nil || m.Role != protocol.RoleToolResult || m.ToolName != agents.SpawnToolName {
			continue
		}
		if m.IsError {
			return "", fmt.Errorf("sessions_spawn failed: %s", m.Text())
		}
		var r agents.SpawnResult
		if err := json.Unmarshal([]byte(m.Text()), &r); err != nil {
			return "", fmt.Errorf("sessions_spawn result: %w", err)
		}
		res = &r
	}
	if res == nil {
		return "", fmt.Errorf("the parent's turn made no sessions_spawn call")
	}
	if res.Status != agents.StatusDone || len(res.Commits) == 0 || res.Answer == "" {
		return "", fmt.Errorf("child %s is %s with %d commits (%s)", res.SessionID, res.Status, len(res.Commits), res.Error)
	}
	fmt.Fprintf(d.out, "   child %s ran on environment %s: %q\n", res.SessionID, res.EnvironmentID, res.Answer)
	fmt.Fprintf(d.out, "   its branch %s: %s %s (also in your repository: %v)\n", res.Branch, short12(res.Commits[0].ID), res.Commits[0].Subject, res.ParentBranch != "")
	kids, err := d.c.Children(ctx, ses.ID)
	if err != nil {
		return "", err
	}
	if len(kids) != 1 || kids[0].SessionID != res.SessionID {
		return "", fmt.Errorf("the parent lists children %+v, want its one child", kids)
	}
	fmt.Fprintf(d.out, "   under the parent: %s, %d tokens in %d model calls, cost $%.6f\n", kids[0].SessionID, kids[0].Usage.TotalTokens, kids[0].Usage.Calls, kids[0].Cost)
	// cleanup "delete": the child's machine goes once its results are back
	wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	e, err := d.c.WaitEnvironment(wctx, res.EnvironmentID, 0, nil, func(e envs.Environment) bool { return e.State.Dead() })
	if err != nil {
		return "", fmt.Errorf("the child's environment %s: %w", res.EnvironmentID, err)
	}
	if e.State != envs.Destroyed {
		return "", fmt.Errorf("the child's environment %s is %s, want destroyed", e.ID, e.State)
	}
	for deadline := time.Now().Add(10 * time.Second); len(local.LiveBoxes(d.boxes())) > 0; {
		if time.Now().After(deadline) {
			return "", fmt.Errorf("box processes still running: %v", local.LiveBoxes(d.boxes()))
		}
		if err := clock.Sleep(ctx, clock.Real, 50*time.Millisecond); err != nil {
			return "", err
		}
	}
	return fmt.Sprintf("child %s spawned by an agent, ran on %s, committed %s on %s, cost $%.6f; its environment destroyed after the pull-back",
		res.SessionID, res.EnvironmentID, short12(res.Commits[0].ID), res.Branch, kids[0].Cost), nil
}

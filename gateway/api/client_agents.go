package api

import (
	"context"
	"net/http"

	"github.com/openclaw/cloudworkers/gateway/agents"
)

// Children lists the sessions a session spawned (sessions_spawn), with their usage and cost.
func (c *Client) Children(ctx context.Context, sessionID string) ([]agents.Child, error) {
	var list []agents.Child
	err := c.get(ctx, v1("sessions", sessionID, "children"), &list)
	return list, err
}

// Spawn spawns a child session with no parent (the operator's door, used by the MCP server),
// forking req.Dir.
func (c *Client) Spawn(ctx context.Context, req agents.OperatorSpawnRequest) (agents.SpawnResult, error) {
	var r agents.SpawnResult
	_, err := c.Do(ctx, http.MethodPost, v1("agents", "spawn"), req, &r)
	return r, err
}

// AgentStatus reports a spawned session.
func (c *Client) AgentStatus(ctx context.Context, id string) (agents.SpawnResult, error) {
	var r agents.SpawnResult
	err := c.get(ctx, v1("agents", id), &r)
	return r, err
}

// AgentSend sends a follow-up message to a spawned session.
func (c *Client) AgentSend(ctx context.Context, id string, req agents.OperatorSendRequest) (agents.SpawnResult, error) {
	var r agents.SpawnResult
	_, err := c.Do(ctx, http.MethodPost, v1("agents", id, "send"), req, &r)
	return r, err
}

// AgentPullback brings a spawned session's results back and returns them.
func (c *Client) AgentPullback(ctx context.Context, id string) (agents.SpawnResult, error) {
	var r agents.SpawnResult
	_, err := c.Do(ctx, http.MethodPost, v1("agents", id, "pullback"), struct{}{}, &r)
	return r, err
}

package api

import (
	"context"
	"net/http"

	"github.com/openclaw/cloudworkers/gateway/agents"
)

// Children lists the sessions a session spawned (sessions_spawn), with their usage and cost.
func (c *Client) Children(ctx context.Context, sessionID string) ([]agents.Child, error) {
	return getAs[[]agents.Child](ctx, c, v1("sessions", sessionID, "children"))
}

// Spawn spawns a child session with no parent (the operator's door, used by the MCP server),
// forking req.Dir.
func (c *Client) Spawn(ctx context.Context, req agents.OperatorSpawnRequest) (agents.SpawnResult, error) {
	return doAs[agents.SpawnResult](ctx, c, http.MethodPost, v1("agents", "spawn"), req)
}

// AgentStatus reports a spawned session.
func (c *Client) AgentStatus(ctx context.Context, id string) (agents.SpawnResult, error) {
	return getAs[agents.SpawnResult](ctx, c, v1("agents", id))
}

// AgentSend sends a follow-up message to a spawned session.
func (c *Client) AgentSend(ctx context.Context, id string, req agents.OperatorSendRequest) (agents.SpawnResult, error) {
	return doAs[agents.SpawnResult](ctx, c, http.MethodPost, v1("agents", id, "send"), req)
}

// AgentPullback brings a spawned session's results back and returns them.
func (c *Client) AgentPullback(ctx context.Context, id string, req agents.OperatorPullbackRequest) (agents.SpawnResult, error) {
	return doAs[agents.SpawnResult](ctx, c, http.MethodPost, v1("agents", id, "pullback"), req)
}

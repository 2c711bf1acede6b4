package agents

import "context"

// The four operations below are the shared core of the sessions_* tools and the MCP server.
// parentID is the calling session; "" is the operator's door (MCP), which may drive any session
// and spawns from req.Dir instead of a parent's workspace.

// Spawn creates a child session of parentID, places it on a worker of the request's profile and
// runs req.Task as its first turn. With req.Waits() it returns once the turn has ended and its
// results are back (answer, branch, commits, files, usage, cost); otherwise at once with the
// child's id. A refusal is a *FieldError (bad argument), *DepthError, *RetryError (a limit; retry
// later), ErrNoDefaultProfile, or the placement's error; nothing is leased before the checks pass.
func (s *Spawner) Spawn(ctx context.Context, parentID string, req SpawnRequest) (SpawnResult, error) {
	return s.spawn(ctx, parentID, req)
}

// Send runs message as a new turn of a child (brought back onto a worker first if it was pulled
// back); with wait it returns when the turn has ended.
func (s *Spawner) Send(ctx context.Context, parentID, childID, message string, wait bool) (SpawnResult, error) {
	return s.send(ctx, parentID, childID, message, wait)
}

// Status reports a child: placement, last turn, answer, usage and cost.
func (s *Spawner) Status(ctx context.Context, parentID, childID string) (SpawnResult, error) {
	return s.status(ctx, parentID, childID)
}

// Pullback brings a child's results back to the gateway and waits for them (branch, commits,
// files); a child spawned with cleanup "delete" then has its environment destroyed. A child whose
// turn runs is refused unless busy says what becomes of the turn: drain (wait for it) or cancel.
func (s *Spawner) Pullback(ctx context.Context, parentID, childID, busy string) (SpawnResult, error) {
	return s.pullback(ctx, parentID, childID, busy)
}

// Children lists a session's children with their usage and cost.
func (s *Spawner) Children(ctx context.Context, parentID string) ([]Child, error) {
	return s.children(ctx, parentID)
}

package api

import (
	"context"

	"github.com/openclaw/cloudworkers/gateway/workspace"
)

// BranchChanges lists what came back to a session's anchor: the commits on its managed branch,
// the files they touch and the anchor's uncommitted files (GET /sessions/:id/changes).
func (c *Client) BranchChanges(ctx context.Context, sessionID string) (workspace.Changes, error) {
	return getAs[workspace.Changes](ctx, c, v1("sessions", sessionID, "changes"))
}

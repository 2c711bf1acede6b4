package api

import (
	"context"
)

// BranchChanges is the body of GET /sessions/:id/changes: what a session's worker brought back
// to its anchor (the commits on its managed branch, the files they touch, the anchor's
// uncommitted files). It mirrors the route's JSON so that the MCP server can read it without
// depending on the placement package's types.
type BranchChanges struct {
	Mode        string         `json:"mode"`
	Branch      string         `json:"branch,omitempty"`
	AnchorDir   string         `json:"anchorDir,omitempty"`
	Commits     []BranchCommit `json:"commits"`
	Files       []ChangedPath  `json:"files"`
	Uncommitted []ChangedPath  `json:"uncommitted"`
	Truncated   bool           `json:"truncated,omitempty"`
}

// BranchCommit is one commit of a managed branch.
type BranchCommit struct {
	ID      string `json:"id"`
	Author  string `json:"author"`
	At      string `json:"at"`
	Subject string `json:"subject"`
}

// ChangedPath is a path with its git status letters (A, M, D, ?? …).
type ChangedPath struct {
	Status string `json:"status"`
	Path   string `json:"path"`
}

// BranchChanges lists what came back to a session's anchor.
func (c *Client) BranchChanges(ctx context.Context, sessionID string) (BranchChanges, error) {
	var ch BranchChanges
	err := c.get(ctx, v1("sessions", sessionID, "changes"), &ch)
	return ch, err
}

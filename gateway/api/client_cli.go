package api

import (
	"context"
	"io"
	"net/http"

	"github.com/openclaw/cloudworkers/gateway/workspace"
)

// ApplyProfiles creates or replaces profiles together: all are validated before any is written
// (none with dryRun), and an unchanged one is left alone.
func (c *Client) ApplyProfiles(ctx context.Context, req ApplyProfilesRequest) ([]AppliedProfile, error) {
	return doAs[[]AppliedProfile](ctx, c, http.MethodPost, v1("profiles", "apply"), req)
}

// CancelTurn asks the gateway to stop a session's running turn; it reports whether one ran.
func (c *Client) CancelTurn(ctx context.Context, sessionID string) (bool, error) {
	var out struct {
		Canceled bool `json:"canceled"`
	}
	_, err := c.Do(ctx, http.MethodPost, v1("sessions", sessionID, "cancel"), nil, &out)
	return out.Canceled, err
}

// Changes lists what a session's worker brought back to its anchor: the managed branch's commits
// since its base, the files they touch, and the anchor's uncommitted files.
func (c *Client) Changes(ctx context.Context, sessionID string) (workspace.Changes, error) {
	return getAs[workspace.Changes](ctx, c, v1("sessions", sessionID, "changes"))
}

// CommitDiff is one commit of a session's managed branch as git show prints it.
func (c *Client) CommitDiff(ctx context.Context, sessionID, commit string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.BaseURL+v1("sessions", sessionID, "changes", commit), nil)
	if err != nil {
		return "", err
	}
	req.Header.Set("Authorization", "Bearer "+c.Token)
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, workspace.MaxDiffBytes+1))
	if err != nil {
		return "", err
	}
	if resp.StatusCode >= 300 {
		return "", &Error{Status: resp.StatusCode, Code: "http", Message: summarizeBody(c.BaseURL, resp, b)}
	}
	return string(b), nil
}

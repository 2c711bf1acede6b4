package api

import (
	"context"
	"net/http"
)

// ApplyProfiles creates or replaces profiles together: all are validated before any is written
// (none with dryRun), and an unchanged one is left alone.
func (c *Client) ApplyProfiles(ctx context.Context, req ApplyProfilesRequest) ([]AppliedProfile, error) {
	var out []AppliedProfile
	_, err := c.Do(ctx, http.MethodPost, v1("profiles", "apply"), req, &out)
	return out, err
}

// CancelTurn asks the gateway to stop a session's running turn; it reports whether one ran.
func (c *Client) CancelTurn(ctx context.Context, sessionID string) (bool, error) {
	var out struct {
		Canceled bool `json:"canceled"`
	}
	_, err := c.Do(ctx, http.MethodPost, v1("sessions", sessionID, "cancel"), nil, &out)
	return out.Canceled, err
}

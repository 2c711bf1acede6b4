package api

import (
	"context"
	"net/http"

	"github.com/openclaw/cloudworkers/gateway/openclaw"
)

// OpenClawDevices lists the devices of OpenClaw's clients that were issued a device token.
func (c *Client) OpenClawDevices(ctx context.Context) ([]openclaw.Device, error) {
	return getAs[[]openclaw.Device](ctx, c, v1("openclaw", "devices"))
}

// RevokeOpenClawDevice ends a device's token and closes its connections.
func (c *Client) RevokeOpenClawDevice(ctx context.Context, id string) (openclaw.Device, error) {
	return doAs[openclaw.Device](ctx, c, http.MethodPost, v1("openclaw", "devices", id, "revoke"), struct{}{})
}

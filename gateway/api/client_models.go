package api

import (
	"context"
	"net/http"

	"github.com/openclaw/cloudworkers/gateway/inference"
)

// Models returns the gateway's model catalog.
func (c *Client) Models(ctx context.Context) (inference.ModelsResponse, error) {
	return getAs[inference.ModelsResponse](ctx, c, v1("models"))
}

// ProbeModel makes one minimal real call to a model (the default when model is empty) through
// the gateway's inference proxy.
func (c *Client) ProbeModel(ctx context.Context, model string) (inference.Probe, error) {
	return doAs[inference.Probe](ctx, c, http.MethodPost, v1("models", "probe"), inference.ProbeRequest{Model: model})
}

// Credentials lists the stored credentials' names (never their values).
func (c *Client) Credentials(ctx context.Context) ([]inference.CredentialInfo, error) {
	return listAs[inference.CredentialInfo](ctx, c, v1("credentials"))
}

// SetCredential stores a credential's value (write-only).
func (c *Client) SetCredential(ctx context.Context, name, value string) error {
	_, err := c.Do(ctx, http.MethodPut, v1("credentials", name), inference.CredentialSetRequest{Value: value}, nil)
	return err
}

// DeleteCredential deletes a credential.
func (c *Client) DeleteCredential(ctx context.Context, name string) error {
	_, err := c.Do(ctx, http.MethodDelete, v1("credentials", name), nil, nil)
	return err
}

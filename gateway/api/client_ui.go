package api

import (
	"context"
	"net/http"
)

// MintSignInCode mints a one-time sign-in code of the Control UI (valid two minutes); the link
// is the client's BaseURL followed by its Path.
func (c *Client) MintSignInCode(ctx context.Context) (SignInCode, error) {
	var out SignInCode
	_, err := c.Do(ctx, http.MethodPost, v1("ui", "signin-codes"), nil, &out)
	return out, err
}

// BrowserSessions lists the Control UI's browser sessions: the live ones and those ended in
// the last day, newest first.
func (c *Client) BrowserSessions(ctx context.Context) ([]BrowserSession, error) {
	return getAs[[]BrowserSession](ctx, c, v1("ui", "sessions"))
}

// RevokeBrowserSession ends a browser session by its id.
func (c *Client) RevokeBrowserSession(ctx context.Context, id string) (BrowserSession, error) {
	var out BrowserSession
	_, err := c.Do(ctx, http.MethodDelete, v1("ui", "sessions", id), nil, &out)
	return out, err
}

// streamHTTP is the HTTP client a WebSocket dial uses: c.HTTP's transport (a pinned TLS one, for
// the gateway's own /mcp server) without its timeout, which a stream must not have; nil (the
// default client) when c.HTTP has the default transport.
func (c *Client) streamHTTP() *http.Client {
	if c.HTTP == nil || c.HTTP.Transport == nil {
		return nil
	}
	return &http.Client{Transport: c.HTTP.Transport}
}

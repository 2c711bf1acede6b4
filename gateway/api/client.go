package api

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// Client is a typed client of the API, used by the CLI.
type Client struct {
	BaseURL string
	Token   string
	HTTP    *http.Client
}

// NewClient returns a client for the gateway at baseURL.
func NewClient(baseURL, token string) *Client {
	if !strings.Contains(baseURL, "://") {
		baseURL = "http://" + baseURL
	}
	return &Client{BaseURL: strings.TrimRight(baseURL, "/"), Token: token, HTTP: &http.Client{Timeout: 15 * time.Minute}}
}

// Do sends a request with a JSON body (if in is non-nil) and decodes the JSON reply into out.
// A non-2xx reply is returned as *Error. It returns the HTTP status.
func (c *Client) Do(ctx context.Context, method, path string, in, out any) (int, error) {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return 0, err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.BaseURL+path, body)
	if err != nil {
		return 0, err
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Authorization", "Bearer "+c.Token)
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return 0, fmt.Errorf("gateway at %s: %w (is `openclaw gateway` running?)", c.BaseURL, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return resp.StatusCode, err
	}
	if resp.StatusCode >= 300 {
		var eb struct {
			Error *Error `json:"error"`
		}
		if json.Unmarshal(b, &eb) == nil && eb.Error != nil {
			eb.Error.Status = resp.StatusCode
			return resp.StatusCode, eb.Error
		}
		return resp.StatusCode, &Error{Status: resp.StatusCode, Code: "http", Message: strings.TrimSpace(string(b))}
	}
	if out != nil && len(b) > 0 {
		if err := json.Unmarshal(b, out); err != nil {
			return resp.StatusCode, fmt.Errorf("decode reply of %s %s: %w", method, path, err)
		}
	}
	return resp.StatusCode, nil
}

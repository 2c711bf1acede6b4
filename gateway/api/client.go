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
	status, _, err := c.do(ctx, method, path, in, out)
	return status, err
}

// do is Do that also returns the reply's headers (nil without a reply).
func (c *Client) do(ctx context.Context, method, path string, in, out any) (int, http.Header, error) {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return 0, nil, err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.BaseURL+path, body)
	if err != nil {
		return 0, nil, err
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Authorization", "Bearer "+c.Token)
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return 0, nil, fmt.Errorf("gateway at %s: %w (is `openclaw gateway` running?)", c.BaseURL, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return resp.StatusCode, resp.Header, err
	}
	if resp.StatusCode >= 300 {
		return resp.StatusCode, resp.Header, replyError(c.BaseURL, resp, b)
	}
	if out != nil && len(b) > 0 {
		if err := json.Unmarshal(b, out); err != nil {
			return resp.StatusCode, resp.Header, fmt.Errorf("decode reply of %s %s: %w", method, path, err)
		}
	}
	return resp.StatusCode, resp.Header, nil
}

// summarizeBody is the message of an error reply that is not the gateway's JSON: a short body as
// it is, an HTML page (a proxy's, another server's) as its title, anything long cut.
func summarizeBody(base string, resp *http.Response, b []byte) string {
	text := strings.TrimSpace(string(b))
	ct := resp.Header.Get("Content-Type")
	if strings.HasPrefix(ct, "text/html") || strings.HasPrefix(strings.ToLower(text), "<!doctype html") || strings.HasPrefix(strings.ToLower(text), "<html") {
		title := ""
		low := strings.ToLower(text)
		if i := strings.Index(low, "<title>"); i >= 0 {
			if j := strings.Index(low[i:], "</title>"); j > 0 {
				title = strings.Join(strings.Fields(text[i+len("<title>"):i+j]), " ")
			}
		}
		if title == "" {
			title = "untitled"
		}
		return fmt.Sprintf("%s answered %s with an HTML page (%q), not the gateway's API: is --gateway the gateway's address?", base, resp.Status, truncateRunes(title, 100))
	}
	text = strings.Join(strings.Fields(text), " ")
	if text == "" {
		return resp.Status
	}
	return truncateRunes(text, 300)
}

func truncateRunes(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n]) + "…"
}

package api

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/openclaw/cloudworkers/gateway/paging"
)

// maxPages bounds the pages one list call follows (at paging.MaxLimit items each).
const maxPages = 10000

// PageOptions ask for one page of a list route: Limit items (0: the gateway's default) after
// Cursor ("" : the first page).
type PageOptions struct {
	Limit  int
	Cursor string
}

// withPage adds ?limit and ?cursor to path.
func withPage(path string, o PageOptions) string {
	q := url.Values{}
	if o.Limit > 0 {
		q.Set("limit", strconv.Itoa(o.Limit))
	}
	if o.Cursor != "" {
		q.Set("cursor", o.Cursor)
	}
	if len(q) == 0 {
		return path
	}
	sep := "?"
	if strings.Contains(path, "?") {
		sep = "&"
	}
	return path + sep + q.Encode()
}

// pageAs gets one page of a list route: its items and the cursor of the next page ("" on the
// last).
func pageAs[T any](ctx context.Context, c *Client, path string, o PageOptions) ([]T, string, error) {
	var items []T
	_, h, err := c.do(ctx, http.MethodGet, withPage(path, o), nil, &items)
	if err != nil {
		return nil, "", err
	}
	return items, h.Get(paging.HeaderNext), nil
}

// listAs follows every page of a list route (at the largest page size) and returns all items.
func listAs[T any](ctx context.Context, c *Client, path string) ([]T, error) {
	all := []T{}
	o := PageOptions{Limit: paging.MaxLimit}
	seen := map[string]bool{}
	for range maxPages {
		items, next, err := pageAs[T](ctx, c, path, o)
		if err != nil {
			return nil, err
		}
		all = append(all, items...)
		if next == "" {
			return all, nil
		}
		if seen[next] {
			return nil, fmt.Errorf("list %s: the gateway repeated the cursor %s", path, next)
		}
		seen[next] = true
		o.Cursor = next
	}
	return nil, fmt.Errorf("list %s: more than %d pages", path, maxPages)
}

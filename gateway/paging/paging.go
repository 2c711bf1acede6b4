// Package paging cuts the gateway's list routes into pages: ?limit and an opaque keyset ?cursor
// in, the next cursor out in the X-Next-Cursor and Link headers (the body stays the JSON array).
package paging

import (
	"encoding/base64"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/openclaw/cloudworkers/providers"
)

// Bounds of ?limit.
const (
	DefaultLimit = 100
	MaxLimit     = 1000
)

// Headers of a page that has a next one.
const (
	HeaderNext = "X-Next-Cursor"
	HeaderLink = "Link"
)

// maxCursorBytes bounds a cursor as sent (a sort key and an id).
const maxCursorBytes = 512

// Key is a position in a list's order: its sort key (a time, a number, a name) and its id (the
// tiebreak). A page holds the items after the cursor's Key, in the list's order.
type Key struct {
	Sort string
	ID   string
}

// Request is a parsed page request.
type Request struct {
	Limit int
	// After is the cursor's key; nil: the first page.
	After *Key
}

// Parse reads ?limit and ?cursor of a request; a bad value is a *providers.FieldError naming it.
func Parse(q url.Values) (Request, error) {
	req := Request{Limit: DefaultLimit}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > MaxLimit {
			return Request{}, providers.Fieldf("limit", "must be a whole number from 1 to %d (default %d), got %.20q", MaxLimit, DefaultLimit, v)
		}
		req.Limit = n
	}
	if v := q.Get("cursor"); v != "" {
		k, err := Decode(v)
		if err != nil {
			return Request{}, err
		}
		req.After = &k
	}
	return req, nil
}

// Encode is the opaque cursor of k.
func Encode(k Key) string {
	return base64.RawURLEncoding.EncodeToString([]byte(k.Sort + "\x00" + k.ID))
}

// Decode reads a cursor made by Encode; anything else is a *providers.FieldError naming cursor.
func Decode(s string) (Key, error) {
	bad := providers.Fieldf("cursor", "is not a cursor of this list: pass the X-Next-Cursor of the previous page as it is")
	if len(s) > maxCursorBytes {
		return Key{}, bad
	}
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return Key{}, bad
	}
	sortKey, id, ok := strings.Cut(string(b), "\x00")
	if !ok || id == "" || strings.ContainsRune(id, 0) {
		return Key{}, bad
	}
	return Key{Sort: sortKey, ID: id}, nil
}

// SetNext sets the headers of a page whose next page starts after last: X-Next-Cursor, and a
// Link rel="next" to the same route with the cursor (other parameters kept).
func SetNext(h http.Header, r *http.Request, last Key) {
	cur := Encode(last)
	h.Set(HeaderNext, cur)
	q := r.URL.Query()
	q.Set("cursor", cur)
	h.Set(HeaderLink, fmt.Sprintf(`<%s?%s>; rel="next"`, r.URL.Path, q.Encode()))
	h.Add("Access-Control-Expose-Headers", HeaderNext+", "+HeaderLink)
}

// Slice pages a list already in memory, in its order: the items after req.After (by key) up to
// req.Limit, and the key of the last item when more follow. The list must be sorted by key, in
// the direction less says (less(a, b): a comes first).
func Slice[T any](list []T, req Request, key func(T) Key, less func(a, b Key) bool) ([]T, *Key) {
	start := 0
	if req.After != nil {
		start = len(list)
		for i, it := range list {
			if less(*req.After, key(it)) {
				start = i
				break
			}
		}
	}
	list = list[start:]
	if len(list) <= req.Limit {
		return list, nil
	}
	last := key(list[req.Limit-1])
	return list[:req.Limit], &last
}

// Ascending orders keys by sort key, then id, both as strings, smallest first.
func Ascending(a, b Key) bool {
	if a.Sort != b.Sort {
		return a.Sort < b.Sort
	}
	return a.ID < b.ID
}

// Descending is the reverse of Ascending: largest first.
func Descending(a, b Key) bool { return Ascending(b, a) }

// Page pages a list held in memory for the request r: it sorts a copy by key in the order less
// gives, takes the items after ?cursor up to ?limit and sets the next-page headers on h. A bad
// parameter is a *providers.FieldError naming it.
func Page[T any](r *http.Request, h http.Header, list []T, key func(T) Key, less func(a, b Key) bool) ([]T, error) {
	req, err := Parse(r.URL.Query())
	if err != nil {
		return nil, err
	}
	sorted := slices.Clone(list)
	slices.SortStableFunc(sorted, func(a, b T) int {
		ka, kb := key(a), key(b)
		switch {
		case less(ka, kb):
			return -1
		case less(kb, ka):
			return 1
		}
		return 0
	})
	page, next := Slice(sorted, req, key, less)
	if next != nil {
		SetNext(h, r, *next)
	}
	if page == nil {
		page = []T{}
	}
	return page, nil
}

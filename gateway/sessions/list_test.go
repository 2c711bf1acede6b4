package sessions

import (
	"encoding/json"
	"net/http"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openclaw/cloudworkers/gateway/paging"
)

// getPage fetches one page of GET /sessions: status, sessions, X-Next-Cursor, Link and the
// error's field (on a 400).
func getPage(t *testing.T, base, query string) (int, []Session, string, string, string) {
	t.Helper()
	req, _ := http.NewRequestWithContext(testCtx(t), http.MethodGet, base+"/sessions?"+query, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		var e struct {
			Error struct{ Field, Message string } `json:"error"`
		}
		_ = json.NewDecoder(resp.Body).Decode(&e)
		return resp.StatusCode, nil, "", "", e.Error.Field
	}
	var list []Session
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, list, resp.Header.Get(paging.HeaderNext), resp.Header.Get(paging.HeaderLink), ""
}

// TestListPagesEverySessionOnce: following the pages of GET /sessions returns every session that
// existed at the first page exactly once, while new sessions are created and old ones updated
// between and during the page requests (many share a creation time: the id breaks the tie);
// the last page has no next cursor; the Link header names the next page.
func TestListPagesEverySessionOnce(t *testing.T) {
	var tick atomic.Int64
	base0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	// the clock moves a millisecond every tenth reading: runs of sessions share created_at
	s := openStore(t, filepath.Join(t.TempDir(), "gw.db"), Config{Now: func() time.Time {
		return base0.Add(time.Duration(tick.Add(1)/10) * time.Millisecond)
	}})
	ctx := testCtx(t)
	before := map[string]bool{}
	for range 250 {
		ses, err := s.Create(ctx, CreateParams{Title: "before"})
		if err != nil {
			t.Fatal(err)
		}
		before[ses.ID] = true
	}
	base := newAPIServer(t, s)

	// a writer creates sessions and updates old ones the whole time
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := s.Create(ctx, CreateParams{Title: "during"}); err != nil {
				t.Error(err)
				return
			}
			for id := range before {
				_, _ = s.AdvanceOwnerEpoch(ctx, id) // moves updated_at, not the paging order
				break
			}
		}
	}()
	seen := map[string]int{}
	cursor, pages := "", 0
	for {
		q := url.Values{"limit": {"7"}}
		if cursor != "" {
			q.Set("cursor", cursor)
		}
		status, list, next, link, _ := getPage(t, base, q.Encode())
		if status != http.StatusOK {
			t.Fatalf("page %d: status %d", pages, status)
		}
		if len(list) > 7 {
			t.Fatalf("page %d has %d sessions, limit 7", pages, len(list))
		}
		for _, ses := range list {
			seen[ses.ID]++
		}
		// a few more sessions between pages, deterministically
		for range 3 {
			if _, err := s.Create(ctx, CreateParams{Title: "between"}); err != nil {
				t.Fatal(err)
			}
		}
		pages++
		if next == "" {
			if link != "" {
				t.Fatalf("last page with a Link %q", link)
			}
			break
		}
		if !strings.Contains(link, `rel="next"`) || !strings.Contains(link, "cursor="+url.QueryEscape(next)) || !strings.Contains(link, "limit=7") {
			t.Fatalf("Link %q for next %q", link, next)
		}
		cursor = next
	}
	close(stop)
	wg.Wait()
	for id := range before {
		if seen[id] != 1 {
			t.Errorf("session %s listed %d times", id, seen[id])
		}
	}
	for id, n := range seen {
		if n > 1 {
			t.Errorf("session %s listed %d times", id, n)
		}
	}
	if pages < 250/7 {
		t.Fatalf("%d pages", pages)
	}
	// without ?limit a page holds the default number
	if _, list, next, _, _ := getPage(t, base, ""); len(list) != paging.DefaultLimit || next == "" {
		t.Fatalf("default page: %d sessions, next %q", len(list), next)
	}
}

// A bad limit or cursor is a 400 naming the parameter.
func TestListPageBadParameters(t *testing.T) {
	base := newAPIServer(t, newStore(t))
	for _, tc := range []struct{ query, field string }{
		{"limit=0", "limit"},
		{"limit=-3", "limit"},
		{"limit=1001", "limit"},
		{"limit=ten", "limit"},
		{"limit=1e3", "limit"},
		{"cursor=%25%25", "cursor"},
		{"cursor=bm90LWEtY3Vyc29y", "cursor"}, // base64 of "not-a-cursor": no id
		{"cursor=" + strings.Repeat("A", 600), "cursor"},
		{"all=maybe", "all"},
	} {
		t.Run(tc.query, func(t *testing.T) {
			status, _, _, _, field := getPage(t, base, tc.query)
			if status != http.StatusBadRequest || field != tc.field {
				t.Fatalf("status %d field %q, want 400 naming %s", status, field, tc.field)
			}
		})
	}
	// the largest limit and a well-formed cursor of no session are fine (an empty page)
	for _, q := range []string{"limit=1000", "cursor=" + paging.Encode(paging.Key{Sort: "2000-01-01T00:00:00.000Z", ID: "ses_x"})} {
		if status, list, next, _, _ := getPage(t, base, q); status != http.StatusOK || len(list) != 0 || next != "" {
			t.Fatalf("%s: %d %v %q", q, status, list, next)
		}
	}
}

package paging

import (
	"errors"
	"net/http/httptest"
	"net/url"
	"strconv"
	"testing"

	"github.com/openclaw/cloudworkers/providers"
)

func TestParse(t *testing.T) {
	cur := Encode(Key{Sort: "2026-01-02T03:04:05.000Z", ID: "ses_1"})
	for _, tc := range []struct {
		query string
		limit int
		after *Key
		field string
	}{
		{"", DefaultLimit, nil, ""},
		{"limit=1", 1, nil, ""},
		{"limit=1000", 1000, nil, ""},
		{"limit=1001", 0, nil, "limit"},
		{"limit=0", 0, nil, "limit"},
		{"limit=-1", 0, nil, "limit"},
		{"limit=+5x", 0, nil, "limit"},
		{"cursor=" + cur, DefaultLimit, &Key{Sort: "2026-01-02T03:04:05.000Z", ID: "ses_1"}, ""},
		{"cursor=!!", 0, nil, "cursor"},
		{"cursor=" + Encode(Key{Sort: "x"}), 0, nil, "cursor"}, // no id
	} {
		t.Run(tc.query, func(t *testing.T) {
			q, _ := url.ParseQuery(tc.query)
			req, err := Parse(q)
			var fe *providers.FieldError
			switch {
			case tc.field != "":
				if !errors.As(err, &fe) || fe.Field != tc.field {
					t.Fatalf("err %v, want a field error naming %s", err, tc.field)
				}
			case err != nil:
				t.Fatal(err)
			case req.Limit != tc.limit || (req.After == nil) != (tc.after == nil) || (req.After != nil && *req.After != *tc.after):
				t.Fatalf("got %+v", req)
			}
		})
	}
}

// Page walks a list in memory page by page: every item once, in order, with headers only while
// more follow.
func TestPageWalksEveryItemOnce(t *testing.T) {
	var list []int
	for i := 99; i >= 0; i-- { // unsorted on purpose: Page sorts
		list = append(list, i)
	}
	key := func(i int) Key { return Key{ID: strconv.Itoa(1000 + i)} }
	cursor, seen := "", 0
	for pages := 0; ; pages++ {
		target := "/api/v1/x?limit=7"
		if cursor != "" {
			target += "&cursor=" + url.QueryEscape(cursor)
		}
		rec := httptest.NewRecorder()
		page, err := Page(httptest.NewRequest("GET", target, nil), rec.Header(), list, key, Ascending)
		if err != nil {
			t.Fatal(err)
		}
		for _, it := range page {
			if it != seen {
				t.Fatalf("page %d: item %d, want %d", pages, it, seen)
			}
			seen++
		}
		cursor = rec.Header().Get(HeaderNext)
		if cursor == "" {
			if rec.Header().Get(HeaderLink) != "" {
				t.Fatal("Link on the last page")
			}
			break
		}
	}
	if seen != 100 {
		t.Fatalf("saw %d of 100", seen)
	}
}

// A cursor comes from the client: Decode never panics, and what it accepts round-trips.
func FuzzDecode(f *testing.F) {
	f.Add(Encode(Key{Sort: "2026", ID: "ses_1"}))
	f.Add("")
	f.Add("AAAA")
	f.Fuzz(func(t *testing.T, s string) {
		k, err := Decode(s)
		if err != nil {
			return
		}
		if k.ID == "" {
			t.Fatalf("accepted %q without an id", s)
		}
		if k2, err := Decode(Encode(k)); err != nil || k2 != k {
			t.Fatalf("round trip of %+v: %+v %v", k, k2, err)
		}
	})
}

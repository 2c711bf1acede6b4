package api

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/openclaw/cloudworkers/gateway/paging"
)

// The typed client follows X-Next-Cursor to the last page and returns every item once; a gateway
// that repeats a cursor is an error, not an endless loop.
func TestClientFollowsPages(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	for _, tc := range []struct {
		name    string
		repeat  bool
		wantErr string
	}{
		{"follows", false, ""},
		{"repeated cursor", true, "repeated the cursor"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var queries []string
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				queries = append(queries, r.URL.RawQuery)
				start := 0
				if cur := r.URL.Query().Get("cursor"); cur != "" {
					k, err := paging.Decode(cur)
					if err != nil {
						t.Errorf("cursor %q: %v", cur, err)
					}
					start, _ = strconv.Atoi(k.ID)
				}
				var names []map[string]string
				for i := start; i < start+3 && i < 8; i++ {
					names = append(names, map[string]string{"name": "c" + strconv.Itoa(i)})
				}
				if start+3 < 8 {
					next := start + 3
					if tc.repeat {
						next = 3
					}
					w.Header().Set(paging.HeaderNext, paging.Encode(paging.Key{ID: strconv.Itoa(next)}))
				}
				_ = json.NewEncoder(w).Encode(names)
			}))
			t.Cleanup(srv.Close)
			list, err := NewClient(srv.URL, "t").Credentials(ctx)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, ci := range list {
				got = append(got, ci.Name)
			}
			if strings.Join(got, ",") != "c0,c1,c2,c3,c4,c5,c6,c7" || len(queries) != 3 || !strings.Contains(queries[0], "limit=1000") {
				t.Fatalf("got %v after %v", got, queries)
			}
		})
	}
}

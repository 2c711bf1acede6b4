package api

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/openclaw/cloudworkers/gateway/auth"
	"github.com/openclaw/cloudworkers/internal/clock"
)

// records keeps every log record.
type records struct {
	mu  sync.Mutex
	all []slog.Record
}

func (h *records) Enabled(context.Context, slog.Level) bool { return true }
func (h *records) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.all = append(h.all, r.Clone())
	return nil
}
func (h *records) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *records) WithGroup(string) slog.Handler      { return h }

// 500 refused authentications at /api/v1 from one source within a minute write a bounded number
// of WARN lines (the first, then one summary), and the summary says how many were refused.
func TestRefusedAuthenticationsAreAggregated(t *testing.T) {
	var h records
	clk := clock.NewManual(time.Date(2026, 1, 2, 3, 4, 0, 0, time.UTC))
	refusals := auth.NewRefusals(slog.New(&h), clk)
	s := New(Config{Token: "right-token-0123456789abcdef0123", Refusals: refusals})
	for i := range 500 {
		r := httptest.NewRequest(http.MethodGet, "/api/v1/gateway", nil)
		r.Host, r.RemoteAddr = "127.0.0.1:7420", "192.0.2.5:40000"
		switch i % 3 {
		case 0:
			r.Header.Set("Authorization", "Bearer wrong")
		case 1:
			r.Header.Set("Authorization", "Basic d3Jvbmc6")
		}
		rec := httptest.NewRecorder()
		s.ServeHTTP(rec, r)
		if rec.Code != http.StatusUnauthorized {
			t.Fatalf("request %d: %d, want 401", i, rec.Code)
		}
		if i%50 == 0 {
			clk.Advance(5 * time.Second) // all 500 within the minute
		}
	}
	clk.Advance(time.Minute)
	refusals.Flush()
	h.mu.Lock()
	defer h.mu.Unlock()
	warns := 0
	var refused int64
	for _, r := range h.all {
		if r.Level != slog.LevelWarn {
			continue
		}
		warns++
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == "refused" {
				refused = a.Value.Int64()
			}
			return true
		})
	}
	if warns > 2 || refused != 500 {
		t.Fatalf("%d WARN lines for 500 refusals, the summary says %d refused; want at most 2 and 500", warns, refused)
	}
}

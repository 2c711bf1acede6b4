package api

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/openclaw/cloudworkers/gateway/envs"
)

// A new environment refused for capacity is HTTP 429 with Retry-After and the
// capacity-exceeded code naming the limit.
func TestCapacityRefusalIs429WithRetryAfter(t *testing.T) {
	s := New(Config{})
	rec := httptest.NewRecorder()
	c := s.Echo.NewContext(httptest.NewRequest(http.MethodPost, "/api/v1/environments", nil), rec)
	s.handleError(&envs.CapacityError{Reason: envs.EnvironmentsReason, RetryAfter: 30 * time.Second,
		Message: "the gateway holds 1 live environments, at most 1 (capacity.maxWorkers)"}, c)
	var body struct{ Error Error }
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
		t.Fatal(err)
	}
	if rec.Code != http.StatusTooManyRequests || rec.Header().Get("Retry-After") != "30" ||
		body.Error.Code != "capacity-exceeded" || body.Error.Reason != envs.EnvironmentsReason {
		t.Fatalf("status %d, Retry-After %q, body %s; want 429, 30, capacity-exceeded with the reason",
			rec.Code, rec.Header().Get("Retry-After"), rec.Body)
	}
}

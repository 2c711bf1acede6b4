package gateway

import (
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"github.com/openclaw/cloudworkers/providers"
)

// A fresh gateway without a worker profile (none built in, none configured) lists none and says
// at start how to add one; one configured profile silences that.
func TestAnUnconfiguredGatewayHasNoWorkerProfile(t *testing.T) {
	for _, tc := range []struct {
		name     string
		profiles []providers.Profile
		want     string
	}{
		{"fresh", nil, "[]"},
		{"configured", []providers.Profile{{ID: "p1", Provider: "fake"}}, `"id":"p1"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			logs := &logLines{}
			addr, token, _ := runGateway(t, Config{Profiles: tc.profiles}, slog.New(logs))
			_, body := get(t, http.DefaultClient, "http://"+addr+"/api/v1/profiles", map[string]string{"Authorization": "Bearer " + token})
			if !strings.Contains(body, tc.want) {
				t.Fatalf("profiles: %s, want %s", body, tc.want)
			}
			said := 0
			logs.mu.Lock()
			for _, r := range logs.recs {
				if strings.Contains(r.Message, "no worker profile") {
					said++
				}
			}
			logs.mu.Unlock()
			if (tc.profiles == nil) != (said == 1) {
				t.Fatalf("the start logged %q %d times with profiles %v", "no worker profile", said, tc.profiles)
			}
		})
	}
}

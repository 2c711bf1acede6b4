package remote

import (
	"testing"
	"time"
)

func TestBackoff(t *testing.T) {
	for _, r := range []float64{0, 0.5, 0.999} {
		b := backoff{min: 100 * time.Millisecond, max: time.Second, rand: func() float64 { return r }}
		want := []time.Duration{100, 200, 400, 800, 1000, 1000}
		for i, w := range want {
			w *= time.Millisecond
			got := b.next()
			if got < w/2 || got > w {
				t.Fatalf("rand %v attempt %d: delay %v, want within [%v, %v]", r, i, got, w/2, w)
			}
		}
		for range 100 {
			if got := b.next(); got > time.Second {
				t.Fatalf("delay %v beyond the cap", got)
			}
		}
		b.reset()
		if got := b.next(); got > 100*time.Millisecond {
			t.Fatalf("after reset: delay %v, want at most the minimum", got)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	cfg := Config{SocketPath: "/x", EnvironmentID: "e", Credential: "c"}
	if err := cfg.Validate(); err == nil {
		t.Fatal("Validate accepted a config without bundle hash")
	}
	cfg.BundleHash = "h"
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
}

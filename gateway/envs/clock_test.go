package envs_test

import (
	"testing"
	"time"

	"github.com/openclaw/cloudworkers/gateway/envs"
	"github.com/openclaw/cloudworkers/internal/testrig/testenv"
	"github.com/openclaw/cloudworkers/providers/fake"
)

// TestRowsAreDatedByTheInjectedClock: an environment's times (created, updated, each event) come
// from the manager's clock, so a test that advances the clock sees the dates move with it.
func TestRowsAreDatedByTheInjectedClock(t *testing.T) {
	h := newHarness(t, fake.New())
	ctx := testenv.Context(t, 20*time.Second)
	const ahead = 48 * time.Hour
	h.clock.Advance(ahead)
	e, _, err := h.mgr.Create(ctx, "p1", "")
	if err != nil {
		t.Fatal(err)
	}
	e = h.waitState(t, e.ID, envs.Bootstrapping)
	// The real clock is at least ahead behind the manual one for the whole test.
	realLimit := time.Now().Add(ahead / 2)
	if !e.CreatedAt.After(realLimit) || !e.UpdatedAt.After(realLimit) {
		t.Fatalf("created %s, updated %s: dated by the system clock, not the manager's (%s)", e.CreatedAt, e.UpdatedAt, h.clock.Now())
	}
	evs, err := h.mgr.Events(ctx, e.ID)
	if err != nil {
		t.Fatal(err)
	}
	for _, ev := range evs {
		if !ev.At.After(realLimit) {
			t.Errorf("event %s>%s at %s: dated by the system clock, not the manager's", ev.From, ev.To, ev.At)
		}
	}
}

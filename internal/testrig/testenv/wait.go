package testenv

import (
	"context"
	"testing"
	"time"
)

// EventuallyWait bounds Eventually: generous, for a loaded CI machine.
const EventuallyWait = 30 * time.Second

// Context returns a context that ends after d or when the test ends, whichever comes first.
func Context(t testing.TB, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// Eventually polls cond every few milliseconds until it holds, failing the test with what after
// EventuallyWait. For facts that no event announces; wait on the event where there is one.
func Eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.NewTimer(EventuallyWait)
	defer deadline.Stop()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-deadline.C:
			t.Fatalf("timed out waiting for %s", what)
		case <-tick.C:
		}
	}
}

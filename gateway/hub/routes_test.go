package hub

import (
	"testing"

	"github.com/openclaw/cloudworkers/protocol"
)

// TestRoutesAreTheAllowlist checks that every method a credential can grant has exactly one way of
// being served, and that nothing outside the allowlist has a route: a method added to
// protocol.WorkerMethods without a route would be granted and then refused on every call.
func TestRoutesAreTheAllowlist(t *testing.T) {
	for _, m := range protocol.WorkerMethods() {
		r, ok := routes[m]
		if !ok {
			t.Errorf("worker method %s has no route", m)
			continue
		}
		n := 0
		for _, set := range []bool{r.inline != nil, r.queue != nil, r.spawn != nil} {
			if set {
				n++
			}
		}
		if n != 1 {
			t.Errorf("route of %s sets %d ways of serving, want 1", m, n)
		}
	}
	for m := range routes {
		if !protocol.IsWorkerMethod(m) {
			t.Errorf("route for %s, which is not a worker method", m)
		}
	}
}

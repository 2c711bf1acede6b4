package turns

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/openclaw/cloudworkers/gateway/store/storetest"
	"github.com/openclaw/cloudworkers/internal/testrig/testenv"
)

// TestCloseIsBoundedByItsContext: a turn that does not stop when cancelled cannot hold the
// gateway's shutdown past its deadline; Close names what still runs, and once the turn has ended
// it returns nil.
func TestCloseIsBoundedByItsContext(t *testing.T) {
	ctx := testenv.Context(t, 10*time.Second)
	svc, err := New(ctx, Config{DB: storetest.Open(t)})
	if err != nil {
		t.Fatal(err)
	}
	svc.wg.Add(1) // a turn that ignores its cancellation
	past, cancel := context.WithCancel(ctx)
	cancel()
	if err := svc.Close(past); err == nil || !strings.Contains(err.Error(), "turns still running") {
		t.Fatalf("Close past its deadline with a turn running: %v, want an error naming the turns", err)
	}
	svc.wg.Done()
	if err := svc.Close(ctx); err != nil {
		t.Fatalf("Close once every turn ended: %v", err)
	}
}

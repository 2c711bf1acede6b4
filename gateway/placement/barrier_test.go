package placement

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openclaw/cloudworkers/gateway/sessions"
)

// TestADrainThatOutlastsItsTimeout: a dispatch that drains a turn which does not end within
// placement.drainTimeout is refused as busy (and says so in the timeline); a pull-back's drain
// cancels the turn instead, and records it. The cancel policy cancels at once.
func TestADrainThatOutlastsItsTimeout(t *testing.T) {
	ctx := context.Background()
	ps := openPlacements(t)
	st := openSessions(t, ps)
	ses, err := st.Create(ctx, sessions.CreateParams{Title: "busy", Workspace: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	var running, cancels atomic.Int32
	running.Store(1)
	d := &Dispatcher{cfg: DispatchConfig{Placements: ps, Sessions: st, DrainTimeout: 50 * time.Millisecond,
		Busy: func(string) bool { return running.Load() == 1 },
		CancelTurn: func(context.Context, string) error {
			cancels.Add(1)
			running.Store(0)
			return nil
		}}, log: slog.New(slog.DiscardHandler), active: map[string]bool{}}
	events := func() string {
		evs, err := ps.Events(ctx, ses.ID)
		if err != nil {
			t.Fatal(err)
		}
		var b strings.Builder
		for _, e := range evs {
			b.WriteString(e.Reason + "\n")
		}
		return b.String()
	}

	if err := d.WaitIdle(ctx, ses.ID, BusyDrain); !errors.Is(err, ErrBusy) || !strings.Contains(err.Error(), "placement.drainTimeout") {
		t.Fatalf("a dispatch's drain past its timeout: %v, want busy naming placement.drainTimeout", err)
	}
	if cancels.Load() != 0 || !strings.Contains(events(), "dispatch waited for the running turn") {
		t.Fatalf("a dispatch's drain canceled the turn (%d) or left no trace:\n%s", cancels.Load(), events())
	}

	if _, err := d.drain(ctx, Placement{SessionID: ses.ID}); err != nil {
		t.Fatal(err)
	}
	if cancels.Load() != 1 || !strings.Contains(events(), "barrier step 2: the running turn was canceled (the drain timed out)") {
		t.Fatalf("a pull-back's drain past its timeout: %d cancels, timeline:\n%s", cancels.Load(), events())
	}

	running.Store(1)
	if err := d.WaitIdle(ctx, ses.ID, BusyCancel); err != nil || cancels.Load() != 2 {
		t.Fatalf("the cancel policy: %v, %d cancels", err, cancels.Load())
	}
	if _, err := ParseBusyPolicy("busy", "later"); err == nil || !strings.Contains(err.Error(), "drain") {
		t.Fatalf("an unknown policy: %v", err)
	}
}

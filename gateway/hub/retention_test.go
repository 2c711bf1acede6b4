package hub_test

import (
	"testing"
	"time"

	"github.com/openclaw/cloudworkers/gateway/store"
)

// Pruning deletes dead credentials and ended calls older than the cutoff and keeps everything else.
func TestPruneCredentialsAndCalls(t *testing.T) {
	h := newHarness(t, nil)
	ctx := testContext(t)
	h.mint(envA, bundleA, 100*time.Hour, nil) // stays live
	h.mint(envB, bundleB, time.Minute, nil)   // expires
	h.offset.Store(int64(48 * time.Hour))
	h.mint(envA, bundleA, time.Minute, nil) // expired, but only just
	old, recent := store.FormatTime(time.Now().Add(-72*time.Hour)), store.FormatTime(time.Now())
	for i, row := range []struct{ outcome, finished string }{{"done", old}, {"error", old}, {"running", ""}, {"done", recent}} {
		if _, err := h.db.W.ExecContext(ctx, `INSERT INTO inference_calls(environment_id, session_id, run_epoch, turn_id, model, outcome,
			started_at, finished_at) VALUES(?,?,?,?,?,?,?,?)`, envA, "s", 1, string(rune('a'+i)), "m", row.outcome, old, row.finished); err != nil {
			t.Fatal(err)
		}
	}
	cutoff := time.Now().Add(-24 * time.Hour)
	n, err := h.creds.Prune(ctx, cutoff.Add(48*time.Hour)) // the credential clock is 48h ahead
	if err != nil || n != 1 {
		t.Fatalf("Prune credentials = %d, %v; want the one expired long ago", n, err)
	}
	var left int
	if err := h.db.R.QueryRowContext(ctx, `SELECT COUNT(*) FROM worker_credentials`).Scan(&left); err != nil || left != 2 {
		t.Fatalf("%d credentials left, %v", left, err)
	}
	n, err = h.srv.PruneCalls(ctx, cutoff)
	if err != nil || n != 2 {
		t.Fatalf("PruneCalls = %d, %v; want the two ended long ago", n, err)
	}
	if err := h.db.R.QueryRowContext(ctx, `SELECT COUNT(*) FROM inference_calls`).Scan(&left); err != nil || left != 2 {
		t.Fatalf("%d calls left (want the running and the recent one), %v", left, err)
	}
}

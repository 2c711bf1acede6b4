package placement

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/openclaw/cloudworkers/gateway/store/storetest"
)

func TestPlacementTransitionTableExhaustive(t *testing.T) {
	legal := map[[2]State]bool{}
	add := func(from State, tos ...State) {
		for _, to := range tos {
			legal[[2]State{from, to}] = true
		}
	}
	// written out from ARCHITECTURE.md section 4 and the migration barrier, independently of state.go
	add(Local, Requested)
	add(Requested, Provisioning, Failed, Local)
	add(Provisioning, Syncing, Failed, Reclaimed)
	add(Syncing, Starting, Failed, Reclaimed)
	add(Starting, Active, Failed, Reclaimed)
	add(Active, Draining, Reclaimed, Failed)
	add(Draining, Reconciling, Reclaimed, Failed)
	add(Reconciling, Local, Failed)
	add(Reclaimed, Requested, Local)
	add(Failed, Local, Requested, Reconciling)
	for _, from := range AllStates {
		for _, to := range AllStates {
			if got, want := CanTransition(from, to), legal[[2]State{from, to}]; got != want {
				t.Errorf("CanTransition(%s, %s) = %v, want %v", from, to, got, want)
			}
		}
	}
}

func openPlacements(t *testing.T) *Placements {
	t.Helper()
	db := storetest.Open(t)
	return NewPlacements(db)
}

func TestPlacementCompareAndSwap(t *testing.T) {
	ctx := context.Background()
	ps := openPlacements(t)
	p, err := ps.Get(ctx, "ses_1")
	if err != nil || p.State != Local || p.Generation != 0 {
		t.Fatalf("fresh placement %+v %v", p, err)
	}
	env := "env_1"
	p, err = ps.Transition(ctx, "ses_1", 0, Change{To: Requested, Reason: "dispatch", EnvironmentID: &env})
	if err != nil || p.Generation != 1 || p.EnvironmentID != env {
		t.Fatalf("transition: %+v %v", p, err)
	}
	if _, err := ps.Transition(ctx, "ses_1", 0, Change{To: Provisioning}); !errors.Is(err, ErrStale) {
		t.Fatalf("stale generation accepted: %v", err)
	}
	if _, err := ps.Transition(ctx, "ses_1", 1, Change{To: Active}); err == nil {
		t.Fatal("illegal move accepted")
	}
	if _, err := ps.Transition(ctx, "ses_1", 1, Change{To: Provisioning, OwnerEpoch: 0}); err != nil {
		t.Fatal(err)
	}
	if got, _ := ps.Get(ctx, "ses_1"); got.State != Provisioning || got.Generation != 2 {
		t.Fatalf("after: %+v", got)
	}
}

// A local message admitted against a stale snapshot can never race a worker turn: of many
// concurrent claims at one generation, exactly one wins, and none survives a placement move.
func TestClaimTurnExactlyOneOwner(t *testing.T) {
	ctx := context.Background()
	ps := openPlacements(t)
	var wins atomic.Int32
	var wg sync.WaitGroup
	for i := 0; i < 16; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			if ps.ClaimTurn(ctx, "ses_1", 0, false, "run_"+string(rune('a'+i))) == nil {
				wins.Add(1)
			}
		}(i)
	}
	wg.Wait()
	if wins.Load() != 1 {
		t.Fatalf("%d claims won, want 1", wins.Load())
	}
	p, _ := ps.Get(ctx, "ses_1")
	if err := ps.ReleaseTurn(ctx, "ses_1", p.TurnRunID); err != nil {
		t.Fatal(err)
	}
	// dispatch starts: a local claim against the old snapshot (generation 0) is refused
	if _, err := ps.Transition(ctx, "ses_1", 0, Change{To: Requested}); err != nil {
		t.Fatal(err)
	}
	if err := ps.ClaimTurn(ctx, "ses_1", 0, false, "run_stale"); !errors.Is(err, ErrStale) {
		t.Fatalf("stale local claim: %v", err)
	}
	if err := ps.ClaimTurn(ctx, "ses_1", 1, false, "run_local"); !errors.Is(err, ErrStale) {
		t.Fatalf("local claim while placement moves: %v", err)
	}
	if err := ps.ClaimTurn(ctx, "ses_1", 1, true, "run_remote"); !errors.Is(err, ErrStale) {
		t.Fatalf("remote claim before active: %v", err)
	}
	// a message that read the placement while it moved, and took its turn for the gateway, is
	// refused once the placement is active: a worker owns the session (two loops otherwise)
	env, gen := "env_1", uint64(1)
	for _, c := range []Change{{To: Provisioning, EnvironmentID: &env}, {To: Syncing}, {To: Starting}, {To: Active, OwnerEpoch: 2}} {
		p, err := ps.Transition(ctx, "ses_1", gen, c)
		if err != nil {
			t.Fatal(err)
		}
		gen = p.Generation
	}
	if err := ps.ClaimTurn(ctx, "ses_1", gen, false, "run_late_local"); !errors.Is(err, ErrStale) {
		t.Fatalf("local claim on an active placement: %v", err)
	}
	if err := ps.ClaimTurn(ctx, "ses_1", gen, true, "run_remote"); err != nil {
		t.Fatalf("remote claim once active: %v", err)
	}
}

// TestLastCheckpointIsANumberedOne: the checkpoint a reclaim names ("changes after checkpoint N
// were lost") is the last numbered one, not a later note that a checkpoint or its pruning failed,
// unless that failed checkpoint still saved the worker's workspace in the anchor.
func TestLastCheckpointIsANumberedOne(t *testing.T) {
	ctx := context.Background()
	ps := openPlacements(t)
	s := "ses_1"
	if got := ps.LastCheckpoint(ctx, s); got != "" {
		t.Fatalf("no checkpoint yet: %q", got)
	}
	if _, err := ps.Transition(ctx, s, 0, Change{To: Requested}); err != nil {
		t.Fatal(err)
	}
	for _, reason := range []string{"checkpoint 1: 2 files", "checkpoint 12: 3 files", "checkpoint pruning failed: disk full",
		"checkpoint failed: box manifest: connection lost"} {
		ps.Note(ctx, s, reason)
	}
	if got := ps.LastCheckpoint(ctx, s); got != "checkpoint 12" {
		t.Fatalf("last checkpoint %q, want checkpoint 12", got)
	}
	ps.Note(ctx, s, "checkpoint failed: mkdir: not a directory ("+anchorSaved+": 1 file)")
	if got := ps.LastCheckpoint(ctx, s); !strings.HasPrefix(got, "the turn saved at ") {
		t.Fatalf("last checkpoint %q, want the turn whose workspace the anchor saved", got)
	}
}

package envs

import (
	"testing"
)

func TestTransitionTableExhaustive(t *testing.T) {
	legal := map[[2]State]bool{}
	add := func(from State, tos ...State) {
		for _, to := range tos {
			legal[[2]State{from, to}] = true
		}
	}
	// Written out independently of the table in state.go, from ARCHITECTURE.md section 4.
	add(Requested, Provisioning)
	add(Provisioning, Bootstrapping)
	add(Bootstrapping, Ready)
	add(Ready, Attached, Idle)
	add(Attached, Idle)
	add(Idle, Attached)
	add(Attached, Draining)
	add(Idle, Draining)
	add(Ready, Draining)
	add(Requested, Draining)
	add(Provisioning, Draining)
	add(Bootstrapping, Draining)
	add(Draining, Destroying)
	add(Destroying, Destroyed)
	for _, s := range []State{Requested, Provisioning, Bootstrapping, Ready, Attached, Idle, Draining, Destroying} {
		add(s, Failed, Orphaned)
	}
	add(Failed, Destroying)
	add(Orphaned, Destroying)

	n := 0
	for _, from := range AllStates {
		for _, to := range AllStates {
			want := legal[[2]State{from, to}]
			t.Run(string(from)+"->"+string(to), func(t *testing.T) {
				if got := CanTransition(from, to); got != want {
					t.Fatalf("CanTransition(%s, %s) = %v, want %v", from, to, got, want)
				}
			})
			n++
		}
	}
	if n != len(AllStates)*len(AllStates) || len(AllStates) != 11 {
		t.Fatalf("checked %d pairs over %d states", n, len(AllStates))
	}
	for _, s := range AllStates {
		if s.Terminal() && len(transitions[s]) > 0 {
			t.Errorf("terminal state %s has outgoing moves", s)
		}
		if !s.Valid() {
			t.Errorf("%s not valid", s)
		}
	}
	if State("bogus").Valid() || CanTransition("bogus", Failed) {
		t.Error("unknown state accepted")
	}
}

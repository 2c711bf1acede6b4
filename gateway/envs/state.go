// Package envs owns the environment state machine: provisioning, reconciliation, orphan sweep and destroy.
package envs

import (
	"fmt"
	"slices"
)

// State is an environment lifecycle state, stored as-is in SQLite.
type State string

// The environment states (ARCHITECTURE.md section 4).
const (
	Requested     State = "requested"
	Provisioning  State = "provisioning"
	Bootstrapping State = "bootstrapping"
	Ready         State = "ready"
	Attached      State = "attached"
	Idle          State = "idle"
	Draining      State = "draining"
	Destroying    State = "destroying"
	Destroyed     State = "destroyed"
	Failed        State = "failed"
	Orphaned      State = "orphaned"
)

// AllStates lists every state, in lifecycle order.
var AllStates = []State{Requested, Provisioning, Bootstrapping, Ready, Attached, Idle, Draining, Destroying, Destroyed, Failed, Orphaned}

// transitions is the explicit table of legal moves. failed and orphaned are reachable from every
// non-terminal state; failed and orphaned lead only to destroying (cleanup); destroyed is terminal.
var transitions = map[State][]State{
	Requested:     {Provisioning, Draining, Failed, Orphaned},
	Provisioning:  {Bootstrapping, Draining, Failed, Orphaned},
	Bootstrapping: {Ready, Draining, Failed, Orphaned},
	Ready:         {Attached, Idle, Draining, Failed, Orphaned},
	Attached:      {Idle, Draining, Failed, Orphaned},
	Idle:          {Attached, Draining, Failed, Orphaned},
	Draining:      {Destroying, Failed, Orphaned},
	Destroying:    {Destroyed, Failed, Orphaned},
	Failed:        {Destroying},
	Orphaned:      {Destroying},
	Destroyed:     nil,
}

// CanTransition reports whether from → to is a legal move.
func CanTransition(from, to State) bool {
	return slices.Contains(transitions[from], to)
}

// Valid reports whether s is a known state.
func (s State) Valid() bool {
	_, ok := transitions[s]
	return ok
}

// Terminal reports whether no further move is possible.
func (s State) Terminal() bool { return s == Destroyed }

// Dead reports whether the environment is no longer in service: its lease, if any, is to be released.
func (s State) Dead() bool { return s == Destroyed || s == Failed || s == Orphaned }

// Live reports whether the environment counts against its profile's capacity.
func (s State) Live() bool { return !s.Dead() }

// HasMachine reports whether the environment is expected to hold a working lease.
func (s State) HasMachine() bool {
	switch s {
	case Bootstrapping, Ready, Attached, Idle:
		return true
	}
	return false
}

// TransitionError reports an illegal move.
type TransitionError struct {
	ID       string
	From, To State
}

func (e *TransitionError) Error() string {
	return fmt.Sprintf("environment %s: illegal transition %s → %s", e.ID, e.From, e.To)
}

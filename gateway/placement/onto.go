package placement

import (
	"context"
	"errors"
	"fmt"

	"github.com/openclaw/cloudworkers/gateway/envs"
	"github.com/openclaw/cloudworkers/gateway/store"
)

// ErrEnvironmentUnusable refuses a dispatch onto an environment that cannot take the session
// (not ready, its worker not admitted, or serving another session).
var ErrEnvironmentUnusable = errors.New("environment cannot take the session")

// DispatchToEnvironment places a session on one given environment — the dispatch target "this
// environment" — instead of a warm or new lease of a profile: the placement walks the normal
// transitions (requested → provisioning → syncing → starting → active, the workspace synced out
// and the worker bound in the start step). The environment must be ready, idle or attached with
// its worker admitted, and serve no other session.
//
// A session already active (or on its way) on that environment is left as it is. A session
// active on another environment is first pulled back (its turn in flight ends on the old worker,
// its workspace comes home into the anchor), then dispatched onto this one: the old environment
// serves until the pull-back starts. The follow-on target is kept in memory; after a gateway
// restart mid-move the session rests local and a repeated call dispatches it.
func (d *Dispatcher) DispatchToEnvironment(ctx context.Context, sessionID, envID string) (Placement, error) {
	sess, err := d.cfg.Sessions.Get(ctx, sessionID)
	if err != nil {
		return Placement{}, err
	}
	if sess.Workspace == "" {
		return Placement{}, fmt.Errorf("session %s has no workspace to send to a worker", sessionID)
	}
	if _, err := d.usableTarget(ctx, sessionID, envID); err != nil {
		return Placement{}, err
	}
	p, err := d.cfg.Placements.Get(ctx, sessionID)
	if err != nil {
		return p, err
	}
	switch {
	case p.EnvironmentID == envID && (p.State == Active || p.State.dispatching()):
		d.setNext(sessionID, nextTarget{})
		if p.State != Active {
			d.kick(sessionID) // resumes a dispatch a restarted gateway left mid-way (no-op if running)
		}
		return p, nil
	case p.State == Active:
		d.setNext(sessionID, nextTarget{env: envID})
		moved, err := d.PullBack(ctx, sessionID, false)
		if err != nil {
			d.setNext(sessionID, nextTarget{})
		}
		return moved, err
	case p.State == Draining || p.State == Reconciling:
		d.setNext(sessionID, nextTarget{env: envID}) // taken once the pull-back rests local
		d.kick(sessionID)
		return p, nil
	case p.State.dispatching():
		return p, fmt.Errorf("session %s is %s towards environment %s: dispatch it elsewhere once it rests: %w", sessionID, p.State, orNone(p.EnvironmentID), ErrStale)
	case p.State == Failed && d.failedReconciling(ctx, sessionID):
		return p, fmt.Errorf("session %s: its pull-back failed (%s); recover it (`openclaw session pullback %s`) before it moves: %w", sessionID, p.Error, sessionID, ErrPlacementFailed)
	}
	if d.cfg.Busy != nil && d.cfg.Busy(sessionID) {
		return p, fmt.Errorf("session %s: %w; dispatch after it ends", sessionID, ErrBusy)
	}
	p, err = d.onto(ctx, p, envID)
	if err != nil {
		return p, err
	}
	d.kick(sessionID)
	return p, nil
}

// onto records the dispatch of a resting (local, reclaimed or failed) placement onto envID.
func (d *Dispatcher) onto(ctx context.Context, p Placement, envID string) (Placement, error) {
	e, err := d.usableTarget(ctx, p.SessionID, envID)
	if err != nil {
		return p, err
	}
	class, zero := e.Class(), 0
	return d.cfg.Placements.Transition(ctx, p.SessionID, p.Generation, Change{To: Requested, Reason: "dispatch onto environment " + envID,
		ProfileID: &e.ProfileID, MachineClass: &class, EnvironmentID: &envID, BarrierStep: &zero, Idle: true})
}

// usableTarget returns envID if a session can be placed on it: ready, idle or attached (reserved
// for the session's owner), its worker admitted, and no other session's placement on it.
func (d *Dispatcher) usableTarget(ctx context.Context, sessionID, envID string) (envs.Environment, error) {
	e, err := d.cfg.Envs.Get(ctx, envID)
	if errors.Is(err, store.ErrNotFound) {
		return e, fmt.Errorf("environment %s: %w", envID, err)
	} else if err != nil {
		return e, err
	}
	if e.State != envs.Ready && e.State != envs.Idle && e.State != envs.Attached {
		return e, fmt.Errorf("environment %s is %s, not ready: %w", envID, e.State, ErrEnvironmentUnusable)
	}
	if !d.cfg.Admitted(envID) {
		return e, fmt.Errorf("the worker of environment %s is not admitted: %w", envID, ErrEnvironmentUnusable)
	}
	if d.claimedByOther(envID, sessionID) {
		return e, fmt.Errorf("environment %s is being taken by another session's dispatch: %w", envID, ErrEnvironmentUnusable)
	}
	if err := d.servesOnly(ctx, envID, sessionID); err != nil {
		return e, err
	}
	return e, nil
}

// servesOnly refuses an environment that another session's placement uses.
func (d *Dispatcher) servesOnly(ctx context.Context, envID, sessionID string) error {
	served, err := d.cfg.Placements.ServedBy(ctx, envID)
	if err != nil {
		return err
	}
	for _, o := range served {
		if o.SessionID != sessionID {
			return fmt.Errorf("environment %s serves session %s: %w", envID, o.SessionID, ErrEnvironmentUnusable)
		}
	}
	return nil
}

// PlacementOf returns a session's placement.
func (d *Dispatcher) PlacementOf(ctx context.Context, sessionID string) (Placement, error) {
	return d.cfg.Placements.Get(ctx, sessionID)
}

// dispatching reports whether a placement in s is on its way to a worker.
func (s State) dispatching() bool {
	return s == Requested || s == Provisioning || s == Syncing || s == Starting
}

// nextTarget is where a session goes once its pull-back rests local: one environment
// (DispatchToEnvironment) or a lease of a profile (MoveToProfile).
type nextTarget struct{ env, profile, class string }

// setNext records (or, with the zero target, clears) where a session goes once its pull-back
// rests local.
func (d *Dispatcher) setNext(sessionID string, t nextTarget) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.next.set(sessionID, t)
}

// takeNext returns and clears a session's follow-on target.
func (d *Dispatcher) takeNext(sessionID string) nextTarget {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.next.take(sessionID)
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

// LeaveEnvironment brings a session home from envID if it is placed there — a pull-back: its
// turn in flight ends, its workspace comes back into the anchor — and drops a pending move onto
// envID. It answers the placement; the session has left once it is neither active, draining nor
// reconciling on envID. A pull-back from envID that failed (the worker's results still on the
// box) is an error wrapping ErrPlacementFailed: the environment must not be released then.
func (d *Dispatcher) LeaveEnvironment(ctx context.Context, sessionID, envID string) (Placement, error) {
	d.mu.Lock()
	if d.next[sessionID].env == envID {
		delete(d.next, sessionID)
	}
	d.mu.Unlock()
	p, err := d.cfg.Placements.Get(ctx, sessionID)
	if err != nil || p.EnvironmentID != envID {
		return p, err
	}
	switch {
	case p.State == Active:
		return d.PullBack(ctx, sessionID, false)
	case p.State == Draining || p.State == Reconciling:
		d.kick(sessionID)
	case p.State == Failed && d.failedReconciling(ctx, sessionID):
		return p, fmt.Errorf("session %s: its pull-back from environment %s failed (%s): %w", sessionID, envID, p.Error, ErrPlacementFailed)
	}
	return p, nil
}

// OnEnvironment reports whether a placement keeps the session on envID: active there, or being
// brought home from it.
func (p Placement) OnEnvironment(envID string) bool {
	return p.EnvironmentID == envID && (p.State == Active || p.State == Draining || p.State == Reconciling)
}

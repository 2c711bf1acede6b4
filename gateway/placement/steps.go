package placement

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/openclaw/cloudworkers/gateway/envs"
	"github.com/openclaw/cloudworkers/gateway/sessions"
	"github.com/openclaw/cloudworkers/sync/mirror"
)

// advance runs steps until the placement rests (active, local, reclaimed or failed).
func (d *Dispatcher) advance(ctx context.Context, sessionID string) error {
	for {
		p, err := d.cfg.Placements.Get(ctx, sessionID)
		if err != nil {
			return err
		}
		var next Change
		switch p.State {
		case Requested:
			next, err = d.provision(ctx, p)
		case Provisioning:
			next, err = d.waitReady(ctx, p)
		case Syncing:
			next, err = d.syncOut(ctx, p)
		case Starting:
			next, err = d.start(ctx, p)
		case Draining:
			next, err = d.drain(ctx, p)
		case Reconciling:
			next, err = d.reconcile(ctx, p)
		case Local:
			// a pull-back that DispatchToEnvironment or MoveToProfile started goes on to its target
			next := d.takeNext(sessionID)
			switch {
			case next.env != "":
				if _, err := d.onto(ctx, p, next.env); err != nil {
					d.log.Warn("dispatch onto the next environment", "session", sessionID, "env", next.env, "err", err)
					return err
				}
			case next.profile != "":
				if _, err := d.request(ctx, p, next.profile, next.class); err != nil {
					d.log.Warn("dispatch to the next profile", "session", sessionID, "profile", next.profile, "err", err)
					d.cfg.Placements.Note(ctx, sessionID, "the move to profile "+next.profile+" stopped at the gateway: "+err.Error())
					return err
				}
			default:
				return nil
			}
			continue
		default:
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err() // stopping: the recorded step resumes on restart
		}
		if err != nil {
			next = failure(p, err)
		}
		_, err = d.cfg.Placements.transition(ctx, sessionID, p.Generation, &next)
		var also *AlsoError
		if errors.As(err, &also) && next.To != Failed && ctx.Err() == nil {
			// what moves with the placement failed (the session's binding, the environment's
			// attachment): nothing of it was written, and the step fails
			next = failure(p, also.Err)
			_, err = d.cfg.Placements.Transition(ctx, sessionID, p.Generation, next)
		}
		if err != nil {
			return err
		}
		d.log.Info("placement", "session", sessionID, "from", p.State, "to", next.To, "reason", next.Reason)
	}
}

// failure is the move to failed of a placement whose step at p failed with err, with the recovery
// action its step calls for.
func failure(p Placement, err error) Change {
	next := Change{To: Failed, Reason: err.Error(), Error: err.Error()}
	var timeout *StepTimeoutError
	switch {
	case errors.As(err, &timeout) && p.State == Reconciling:
		next.Error = err.Error() + " — recovery: the worker's results are still on the box (environment " + p.EnvironmentID +
			"); run `openclaw session pullback " + p.SessionID + "` again once it answers, or `openclaw env destroy " + p.EnvironmentID +
			" --force` to discard them"
	case errors.As(err, &timeout):
		next.Error = err.Error() + " — recovery: run `openclaw session dispatch " + p.SessionID + "` to try again (another machine is leased if this one stays silent), or `openclaw env destroy " + p.EnvironmentID + " --force`"
	case p.State == Reconciling:
		var tooMany *mirror.TooManyDeletesError
		if errors.As(err, &tooMany) {
			next.Error = err.Error() + " — recovery: if the worker meant to delete them, run `openclaw session pullback " + p.SessionID +
				" --force`; the worker's results stay on the box (environment " + p.EnvironmentID + ") until then"
		} else {
			next.Error = err.Error() + " — recovery: the worker's results are still on the box (environment " + p.EnvironmentID +
				"); resolve the conflict in " + p.AnchorDir + " and run `openclaw session pullback " + p.SessionID +
				"` again, or destroy the environment to discard them"
		}
	}
	return next
}

// provision takes the environment a dispatch named (DispatchToEnvironment), or reuses an idle
// environment of the profile (warm lease) that is not reserved, or leases a new one.
func (d *Dispatcher) provision(ctx context.Context, p Placement) (Change, error) {
	if p.EnvironmentID != "" {
		if _, err := d.usableTarget(ctx, p.SessionID, p.EnvironmentID); err != nil {
			return Change{}, err
		}
		id := p.EnvironmentID
		return Change{To: Provisioning, Reason: "onto environment " + id, EnvironmentID: &id}, nil
	}
	id, err := d.claimWarm(ctx, p.SessionID, p.ProfileID, p.MachineClass)
	if err != nil {
		return Change{}, err
	}
	if id != "" {
		return Change{To: Provisioning, Reason: "claimed ready environment " + id + " (warm or from the prepared pool)", EnvironmentID: &id}, nil
	}
	e, _, err := d.cfg.Envs.CreateClass(ctx, p.ProfileID, fmt.Sprintf("dispatch-%s-%d", p.SessionID, p.Generation), p.MachineClass)
	if err != nil {
		return Change{}, fmt.Errorf("lease a machine: %w", err)
	}
	id = e.ID
	return Change{To: Provisioning, Reason: "leasing environment " + id, EnvironmentID: &id}, nil
}

func (d *Dispatcher) waitReady(ctx context.Context, p Placement) (Change, error) {
	e, err := d.cfg.Envs.WaitFor(ctx, p.EnvironmentID, func(e envs.Environment) bool {
		return e.State == envs.Ready || e.State == envs.Idle || e.State == envs.Attached || e.State.Dead() || e.State == envs.Destroying
	})
	if err != nil {
		return Change{}, err
	}
	if e.State == envs.Attached {
		// attached for this session's owner (a dispatch onto this environment): usable while no
		// other session's placement holds it
		if err := d.servesOnly(ctx, e.ID, p.SessionID); err != nil {
			return Change{}, err
		}
	} else if e.State != envs.Ready && e.State != envs.Idle {
		return Change{}, fmt.Errorf("environment %s is %s: %s", e.ID, e.State, e.Error)
	}
	return Change{To: Syncing, Reason: "environment " + e.ID + " ready"}, nil
}

// start attaches the session to the environment's worker and fences any earlier owner.
func (d *Dispatcher) start(ctx context.Context, p Placement) (Change, error) {
	// a restarted gateway resumes here before the box's worker is re-admitted: wait for it
	for deadline := time.Now().Add(d.cfg.startAdmitWait()); !d.cfg.Admitted(p.EnvironmentID); {
		if time.Now().After(deadline) {
			return Change{}, fmt.Errorf("the worker of environment %s is not admitted after %s", p.EnvironmentID, d.cfg.startAdmitWait())
		}
		if err := d.poll(ctx); err != nil {
			return Change{}, err
		}
	}
	// The profile's setup phase runs after bootstrap and sync, before the worker takes the session
	// (a warm box that already ran it with the same cache key skips it).
	if d.cfg.Boot != nil {
		e, err := d.cfg.Envs.Get(ctx, p.EnvironmentID)
		if err != nil {
			return Change{}, err
		}
		if err := d.cfg.Boot.Setup(ctx, e, p.BoxWorkspace); err != nil {
			return Change{}, fmt.Errorf("environment %s: %w", e.ID, err)
		}
	}
	// The session is bound, the environment attached and the placement active in one transaction.
	return Change{To: Active, Also: func(ctx context.Context, tx *sql.Tx, c *Change) (func(), error) {
		epoch, err := d.cfg.Sessions.BindTx(ctx, tx, p.SessionID, p.EnvironmentID)
		if err != nil {
			return nil, err
		}
		attached, err := d.cfg.Envs.AttachTx(ctx, tx, p.EnvironmentID, p.SessionID)
		if err != nil {
			return nil, err
		}
		c.OwnerEpoch = epoch
		c.Reason = fmt.Sprintf("worker of %s owns the session (owner epoch %d)", p.EnvironmentID, epoch)
		return func() {
			d.cfg.Sessions.Notify(sessions.ChangeSessionUpdated, p.SessionID)
			attached()
		}, nil
	}}, nil
}

// unbind returns the session of a transition to the gateway inside its transaction, fencing the
// worker. When why is not "" (a pull-back's drain), the new owner epoch goes into the change and
// into its reason (why formats it).
func (d *Dispatcher) unbind(sessionID, why string) func(ctx context.Context, tx *sql.Tx, c *Change) (func(), error) {
	return func(ctx context.Context, tx *sql.Tx, c *Change) (func(), error) {
		epoch, err := d.cfg.Sessions.BindTx(ctx, tx, sessionID, "")
		if err != nil {
			return nil, err
		}
		c.OwnerEpoch = epoch
		if why != "" {
			c.Reason = fmt.Sprintf(why, epoch)
		}
		return func() { d.cfg.Sessions.Notify(sessions.ChangeSessionUpdated, sessionID) }, nil
	}
}

// reconcile is barrier step 7: bring the worker's results into the anchor, conflict-aware.
// Divergence stops with an error and changes nothing.
func (d *Dispatcher) reconcile(ctx context.Context, p Placement) (Change, error) {
	e, err := d.cfg.Envs.Get(ctx, p.EnvironmentID)
	if err != nil {
		return Change{}, err
	}
	summary, _, err := d.inbound(ctx, p, e, d.takeForce(p.SessionID))
	if err != nil {
		return Change{}, err
	}
	// barrier step 8: the gateway owns the session again, on the anchor holding the results
	if err := d.cfg.Sessions.SetWorkspace(ctx, p.SessionID, p.AnchorDir); err != nil {
		return Change{}, err
	}
	if err := d.cfg.Envs.Detach(ctx, e.ID, p.SessionID); err != nil {
		d.log.Warn("detach environment", "env", e.ID, "err", err)
	}
	step := 8
	return Change{To: Local, Reason: "pulled back: " + summary, BarrierStep: &step}, nil
}

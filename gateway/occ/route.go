package occ

import (
	"context"
	"errors"
	"time"

	"github.com/openclaw/cloudworkers/gateway/envs"
	"github.com/openclaw/cloudworkers/gateway/placement"
	"github.com/openclaw/cloudworkers/internal/clock"
)

// SessionRouter places an agent's session on a revision's environment: the placement
// dispatcher's "this environment" target and its pull-back.
type SessionRouter interface {
	DispatchToEnvironment(ctx context.Context, sessionID, envID string) (placement.Placement, error)
	LeaveEnvironment(ctx context.Context, sessionID, envID string) (placement.Placement, error)
	PlacementOf(ctx context.Context, sessionID string) (placement.Placement, error)
}

var _ SessionRouter = (*placement.Dispatcher)(nil)

// routePoll is how often a route change is looked at again while activate or stop waits for it.
const routePoll = 100 * time.Millisecond

// sessionOf returns the session that carries an agent's turns ("" when the gateway created none).
func (c *Compute) sessionOf(ctx context.Context, agentID string) (string, error) {
	var session string
	err := c.d.DB.R.QueryRowContext(ctx, `SELECT session_id FROM occ_agents WHERE id=?`, agentID).Scan(&session)
	return session, err
}

// WorkerOnly reports whether a session carries an OCC agent's turns: those run only on the
// environment of its activated revision, never on the gateway (where the catalog's credentials
// would make its model calls).
func (c *Compute) WorkerOnly(ctx context.Context, sessionID string) (bool, error) {
	var n int
	err := c.d.DB.R.QueryRowContext(ctx, `SELECT COUNT(*) FROM occ_agents WHERE session_id=?`, sessionID).Scan(&n)
	return n > 0, err
}

// routing returns the agent's session ("" when there is nothing to route: no router, or no
// session) and the context bounding one route change by occ.routeTimeout.
func (c *Compute) routing(ctx context.Context, r revisionRow) (string, context.Context, context.CancelFunc, error) {
	if c.d.Router == nil {
		return "", nil, nil, nil
	}
	session, err := c.sessionOf(ctx, r.AgentID)
	if err != nil || session == "" {
		return "", nil, nil, err
	}
	wctx, cancel := context.WithTimeout(ctx, c.d.Config.RouteTimeout.D())
	return session, wctx, cancel, nil
}

// route places the agent's session on the revision's environment through the placement state
// machine and waits, up to occ.routeTimeout, until it is active there. A session active on a
// previous revision's environment is pulled back from it first (its turn in flight ends there),
// so the previous revision serves until the move starts.
func (c *Compute) route(ctx context.Context, r revisionRow) error {
	if r.EnvironmentID == "" {
		return nil
	}
	session, wctx, cancel, err := c.routing(ctx, r)
	if err != nil || session == "" {
		return err
	}
	defer cancel()
	dispatch := true
	for {
		var p placement.Placement
		var err error
		if dispatch {
			p, err = c.d.Router.DispatchToEnvironment(wctx, session, r.EnvironmentID)
		} else {
			p, err = c.d.Router.PlacementOf(wctx, session)
		}
		switch {
		case err == nil && p.State == placement.Active && p.EnvironmentID == r.EnvironmentID:
			return nil
		case errors.Is(err, placement.ErrEnvironmentUnusable):
			c.d.Log.Info("occ activate: environment not usable yet", "revision", r.ID, "env", r.EnvironmentID, "err", err)
			return Retryable("REVISION_NOT_READY", "revision "+r.ID+"'s environment cannot take the agent's session yet; repeat the call")
		case errors.Is(err, placement.ErrPlacementFailed):
			c.d.Log.Warn("occ activate: the agent's session cannot move", "revision", r.ID, "session", session, "err", err)
			return Retryable("ROUTE_BLOCKED", "the agent's session "+session+" could not be brought home from its previous environment; the operator must resolve its pull-back")
		case err != nil && !errors.Is(err, placement.ErrStale) && !errors.Is(err, placement.ErrBusy) && wctx.Err() == nil:
			return err
		case err == nil && !dispatch && p.State == placement.Failed && p.EnvironmentID == r.EnvironmentID:
			// the dispatch onto it failed (sync out, setup): the next call dispatches again
			c.d.Log.Warn("occ activate: dispatch onto the revision's environment failed", "revision", r.ID, "session", session, "err", p.Error)
			return Retryable("ROUTE_PENDING", "the agent's session could not be placed on revision "+r.ID+"'s environment; repeat the call")
		}
		// dispatch again only when the placement rests elsewhere (a refused or lost move);
		// otherwise it is on its way
		dispatch = err != nil || p.State == placement.Local || p.State == placement.Reclaimed || p.State == placement.Failed && p.EnvironmentID != r.EnvironmentID ||
			p.State == placement.Active && p.EnvironmentID != r.EnvironmentID
		if err := clock.Sleep(wctx, c.d.Clock, routePoll); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return Retryable("ROUTE_PENDING", "the agent's session is still moving onto revision "+r.ID+"'s environment; repeat the call")
		}
	}
}

// leave brings the agent's session home from each of the environments (a pull-back: the
// workspace comes back into the anchor) and waits, up to occ.routeTimeout, until it left them.
func (c *Compute) leave(ctx context.Context, r revisionRow, envIDs []string) error {
	session, wctx, cancel, err := c.routing(ctx, r)
	if err != nil || session == "" {
		return err
	}
	defer cancel()
	for _, id := range envIDs {
		for {
			p, err := c.d.Router.LeaveEnvironment(wctx, session, id)
			if errors.Is(err, placement.ErrPlacementFailed) {
				c.d.Log.Warn("occ: the agent's workspace is still on the revision's environment", "revision", r.ID, "env", id, "err", err)
				return Retryable("WORKSPACE_NOT_RECONCILED", "the agent's workspace could not be brought home from revision "+r.ID+"'s environment "+id+
					"; the operator must resolve the session's pull-back, then repeat the call")
			}
			if err != nil && !errors.Is(err, placement.ErrBusy) && !errors.Is(err, placement.ErrStale) && wctx.Err() == nil {
				return err
			}
			if err == nil && !p.OnEnvironment(id) {
				break
			}
			if err := clock.Sleep(wctx, c.d.Clock, routePoll); err != nil {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				return Retryable("ROUTE_PENDING", "the agent's session is still being brought home from revision "+r.ID+"'s environment; repeat the call")
			}
		}
	}
	return nil
}

// keepReserved attaches again the environments of the agent's other live revisions that a
// move of its session left idle, so that none is handed out, stopped for idleness or its TTL
// until OCC stops or retires its revision.
func (c *Compute) keepReserved(ctx context.Context, r revisionRow) {
	rows, err := c.d.DB.R.QueryContext(ctx, `SELECT environment_id FROM occ_revisions WHERE agent_id=? AND id<>? AND state IN (?,?) AND environment_id<>''`,
		r.AgentID, r.ID, string(RevReady), string(RevPreparing))
	if err != nil {
		c.d.Log.Warn("occ: list the agent's revisions", "agent", r.AgentID, "err", err)
		return
	}
	var ids []string
	for rows.Next() {
		var id string
		if rows.Scan(&id) == nil {
			ids = append(ids, id)
		}
	}
	rows.Close()
	session, _ := c.sessionOf(ctx, r.AgentID)
	for _, id := range ids {
		if e, err := c.d.Envs.Get(ctx, id); err == nil && e.State == envs.Idle {
			if err := c.d.Envs.Attach(ctx, id, session); err != nil {
				c.d.Log.Warn("occ: keep a revision's environment reserved", "env", id, "err", err)
			}
		}
	}
}

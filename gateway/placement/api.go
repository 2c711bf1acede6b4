package placement

import (
	"errors"
	"net/http"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/openclaw/cloudworkers/gateway/paging"
	"github.com/openclaw/cloudworkers/internal/jsonbody"
	"github.com/openclaw/cloudworkers/providers"
)

// PullBackRequest is the (optional) body of POST /sessions/:id/pullback.
type PullBackRequest struct {
	// Force lets the reconciliation delete more than the deletion brake allows (the operator has
	// seen the worker's deletions and confirms them).
	Force bool `json:"force,omitempty"`
	// AllowSecrets lets known false positives of the secret scan through, each RULE:PATH as a
	// refusal named it (a credential the gateway holds: gateway-credential:NAME:PATH); they hold
	// for the session's later pull-backs and checkpoints too, until the gateway restarts.
	AllowSecrets []string `json:"allowSecrets,omitempty"`
	// Busy is what happens to a running turn: "drain" (the default: wait for it to end, up to
	// placement.drainTimeout, then cancel it) or "cancel" (stop it now).
	Busy string `json:"busy,omitempty"`
}

// DispatchRequest is the body of POST /sessions/:id/dispatch.
type DispatchRequest struct {
	ProfileID    string `json:"profileId"`
	MachineClass string `json:"machineClass,omitempty"`
	// Busy is what happens to a running turn: "drain" (the default: wait for it to end, up to
	// placement.drainTimeout; the request answers once the dispatch starts) or "cancel" (stop it).
	Busy string `json:"busy,omitempty"`
}

// MoveRequest is the body of POST /sessions/:id/move.
type MoveRequest struct {
	// To is where the session goes: "gateway" (also "local") or "worker" (a lease of ProfileID).
	// To the gateway, a session active on a worker is pulled back; one whose placement failed
	// (or whose worker was lost) is moved there as it is. To a worker, a session on the gateway
	// is dispatched; one active on a worker is pulled back and dispatched from there.
	To string `json:"to"`
	// ProfileID and MachineClass name the worker (To "worker").
	ProfileID    string `json:"profileId,omitempty"`
	MachineClass string `json:"machineClass,omitempty"`
	// Busy is what happens to a running turn: "drain" (the default), "cancel" or "live" (it stops
	// at its next model call and goes on, as the same turn, on the session's next owner). Live is
	// busy "live".
	Busy string `json:"busy,omitempty"`
	Live bool   `json:"live,omitempty"`
	// Force moves a session whose pull-back failed, abandoning the worker's results on the box.
	Force bool `json:"force,omitempty"`
}

// policy is the request's busy policy, checked.
func (r MoveRequest) policy() (BusyPolicy, error) {
	policy, err := ParseBusyPolicy("busy", r.Busy)
	if err != nil || !r.Live {
		return policy, err
	}
	if r.Busy != "" && policy != BusyLive {
		return "", providers.Fieldf("live", "asks for busy \"live\", and busy says %q: give one", r.Busy)
	}
	return BusyLive, nil
}

// MaxListedPlacements bounds GET /placements (the most recently updated first).
const MaxListedPlacements = 10000

// RegisterDispatchAPI adds the placement routes: dispatch, pull-back and the placement itself.
func RegisterDispatchAPI(g *echo.Group, d *Dispatcher) {
	g.POST("/sessions/:id/dispatch", func(c echo.Context) error {
		var req DispatchRequest
		if err := jsonbody.Decode(c.Request().Body, &req); err != nil {
			return err
		}
		if req.ProfileID == "" {
			return providers.Fieldf("profileId", "is required")
		}
		policy, err := ParseBusyPolicy("busy", req.Busy)
		if err != nil {
			return err
		}
		if err := d.checkDispatch(c.Request().Context(), c.Param("id"), req.ProfileID, req.MachineClass); err != nil {
			return err
		}
		if err := d.WaitIdle(c.Request().Context(), c.Param("id"), policy); err != nil {
			return placementErr(err)
		}
		p, err := d.Dispatch(c.Request().Context(), c.Param("id"), req.ProfileID, req.MachineClass)
		if err != nil {
			d.afterMove(c.Param("id")) // a turn a live policy stopped goes on where it is
			return placementErr(err)
		}
		return c.JSON(http.StatusAccepted, p)
	})
	g.POST("/sessions/:id/pullback", func(c echo.Context) error {
		var req PullBackRequest
		if err := jsonbody.DecodeOptional(c.Request().Body, &req); err != nil {
			return err
		}
		policy, err := ParseBusyPolicy("busy", req.Busy)
		if err != nil {
			return err
		}
		if err := d.allowSecrets(c.Request().Context(), c.Param("id"), req.AllowSecrets); err != nil {
			return err
		}
		p, err := d.PullBackBusy(c.Request().Context(), c.Param("id"), req.Force, policy)
		if err != nil {
			return placementErr(err)
		}
		return c.JSON(http.StatusAccepted, p)
	})
	g.POST("/sessions/:id/move", func(c echo.Context) error {
		var req MoveRequest
		if err := jsonbody.Decode(c.Request().Body, &req); err != nil {
			return err
		}
		policy, err := req.policy()
		if err != nil {
			return err
		}
		ctx, id := c.Request().Context(), c.Param("id")
		switch req.To {
		case "local", "gateway":
			cur, err := d.cfg.Placements.Get(ctx, id)
			if err != nil {
				return err
			}
			if cur.State == Active {
				p, err := d.PullBackBusy(ctx, id, req.Force, policy)
				if err != nil {
					return placementErr(err)
				}
				return c.JSON(http.StatusAccepted, p)
			}
			p, err := d.MoveLocal(ctx, id, req.Force)
			if err != nil {
				return placementErr(err)
			}
			return c.JSON(http.StatusOK, p)
		case "worker":
			if req.ProfileID == "" {
				return providers.Fieldf("profileId", "is required to move to a worker")
			}
			if err := d.checkDispatch(ctx, id, req.ProfileID, req.MachineClass); err != nil {
				return err
			}
			cur, err := d.cfg.Placements.Get(ctx, id)
			if err != nil {
				return err
			}
			if cur.State == Active {
				p, err := d.MoveToProfile(ctx, id, req.ProfileID, req.MachineClass, policy)
				if err != nil {
					return placementErr(err)
				}
				return c.JSON(http.StatusAccepted, p)
			}
			if err := d.WaitIdle(ctx, id, policy); err != nil {
				return placementErr(err)
			}
			p, err := d.Dispatch(ctx, id, req.ProfileID, req.MachineClass)
			if err != nil {
				d.afterMove(id) // a turn a live policy stopped goes on where it is
				return placementErr(err)
			}
			return c.JSON(http.StatusAccepted, p)
		}
		return providers.Fieldf("to", "must be \"gateway\" or \"worker\" (with profileId), got %q", req.To)
	})
	g.GET("/placements", func(c echo.Context) error {
		list, err := d.cfg.Placements.List(c.Request().Context(), MaxListedPlacements)
		if err != nil {
			return err
		}
		// by session id: an order a placement's progress cannot shuffle between pages
		list, err = paging.Page(c.Request(), c.Response().Header(), list,
			func(p Placement) paging.Key { return paging.Key{ID: p.SessionID} }, paging.Ascending)
		if err != nil {
			return err
		}
		return c.JSON(http.StatusOK, list)
	})
	g.GET("/sessions/:id/placement", func(c echo.Context) error {
		p, err := d.cfg.Placements.Get(c.Request().Context(), c.Param("id"))
		if err != nil {
			return err
		}
		evs, err := d.cfg.Placements.Events(c.Request().Context(), c.Param("id"))
		if err != nil {
			return err
		}
		return c.JSON(http.StatusOK, map[string]any{"placement": p, "events": evs})
	})
}

// APIError answers a refused move as 409 Conflict (a stale or busy placement, an illegal move).
func APIError(err error) error { return placementErr(err) }

func placementErr(err error) error {
	if errors.Is(err, ErrStale) || errors.Is(err, ErrBusy) || strings.Contains(err.Error(), "illegal placement") || strings.Contains(err.Error(), "not active") {
		return echo.NewHTTPError(http.StatusConflict, err.Error())
	}
	return err
}

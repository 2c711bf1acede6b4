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
	// To is where the session goes: "local" (the gateway).
	To string `json:"to"`
	// Force moves a session whose pull-back failed, abandoning the worker's results on the box.
	Force bool `json:"force,omitempty"`
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
		if req.To != "local" {
			return providers.Fieldf("to", "must be \"local\" (a session goes to a worker with POST /sessions/{id}/dispatch), got %q", req.To)
		}
		p, err := d.MoveLocal(c.Request().Context(), c.Param("id"), req.Force)
		if err != nil {
			return placementErr(err)
		}
		return c.JSON(http.StatusOK, p)
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

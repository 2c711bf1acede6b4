package agents

import (
	"errors"
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/openclaw/cloudworkers/internal/jsonbody"
	"github.com/openclaw/cloudworkers/providers"
)

// RegisterAPI adds the agents routes to the authenticated API group: a session's children (with
// their usage and cost), and the operator's door onto the spawner (the MCP server's).
func RegisterAPI(g *echo.Group, s *Spawner) {
	g.GET("/sessions/:id/children", func(c echo.Context) error {
		list, err := s.Children(c.Request().Context(), c.Param("id"))
		if err != nil {
			return err
		}
		if list == nil {
			list = []Child{}
		}
		return c.JSON(http.StatusOK, list)
	})
	g.POST("/agents/spawn", func(c echo.Context) error {
		var req OperatorSpawnRequest
		if err := jsonbody.Decode(c.Request().Body, &req); err != nil {
			return err
		}
		r := req.SpawnRequest
		r.Dir = req.Dir
		res, err := s.Spawn(c.Request().Context(), "", r)
		return answer(c, res, err)
	})
	g.GET("/agents/:id", func(c echo.Context) error {
		res, err := s.Status(c.Request().Context(), "", c.Param("id"))
		return answer(c, res, err)
	})
	g.POST("/agents/:id/send", func(c echo.Context) error {
		var req OperatorSendRequest
		if err := jsonbody.Decode(c.Request().Body, &req); err != nil {
			return err
		}
		res, err := s.Send(c.Request().Context(), "", c.Param("id"), req.Message, req.Wait == nil || *req.Wait)
		return answer(c, res, err)
	})
	g.POST("/agents/:id/pullback", func(c echo.Context) error {
		var req OperatorPullbackRequest
		if err := jsonbody.DecodeOptional(c.Request().Body, &req); err != nil {
			return err
		}
		res, err := s.Pullback(c.Request().Context(), "", c.Param("id"), req.Busy)
		return answer(c, res, err)
	})
}

// OperatorPullbackRequest is the (optional) body of POST /agents/:id/pullback.
type OperatorPullbackRequest struct {
	// Busy is what becomes of the child's running turn: "drain" (wait for it) or "cancel"; without
	// it a child whose turn runs is refused.
	Busy string `json:"busy,omitempty"`
}

// OperatorSpawnRequest is the body of POST /agents/spawn: a spawn with no parent session, forking
// the directory Dir.
type OperatorSpawnRequest struct {
	SpawnRequest
	Dir string `json:"dir,omitempty"`
}

// OperatorSendRequest is the body of POST /agents/:id/send.
type OperatorSendRequest struct {
	Message string `json:"message"`
	Wait    *bool  `json:"wait,omitempty"`
}

func answer(c echo.Context, res SpawnResult, err error) error {
	if err == nil {
		return c.JSON(http.StatusOK, res)
	}
	var fe *FieldError
	var re *RetryError
	var de *DepthError
	switch {
	case errors.As(err, &fe):
		return providers.Fieldf(fe.Field, "%s", fe.Msg)
	case errors.As(err, &re):
		c.Response().Header().Set("Retry-After", itoa(int(re.RetryAfter.Seconds())))
		return echo.NewHTTPError(http.StatusTooManyRequests, Message(err))
	case errors.As(err, &de):
		return echo.NewHTTPError(http.StatusForbidden, Message(err))
	case errors.Is(err, ErrNotChild):
		return echo.NewHTTPError(http.StatusNotFound, err.Error())
	case errors.Is(err, ErrNoDefaultProfile):
		return providers.Fieldf("profile", "is required: %v", err)
	}
	return err
}

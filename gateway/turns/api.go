package turns

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/openclaw/cloudworkers/gateway/paging"
	"github.com/openclaw/cloudworkers/gateway/placement"
	"github.com/openclaw/cloudworkers/internal/jsonbody"
	"github.com/openclaw/cloudworkers/providers"
)

// SendRequest is the body of POST /sessions/:id/messages.
type SendRequest struct {
	Text           string `json:"text"`
	IdempotencyKey string `json:"idempotencyKey,omitempty"`
}

// RegisterAPI adds the turn routes to the authenticated API group.
func RegisterAPI(g *echo.Group, s *Service) {
	g.POST("/sessions/:id/messages", func(c echo.Context) error {
		var req SendRequest
		if err := jsonbody.Decode(c.Request().Body, &req); err != nil {
			return err // a *http.MaxBytesError is 413 too-large
		}
		if req.Text == "" {
			return providers.Fieldf("text", "is required")
		}
		if len(req.Text) > 1<<20 {
			return &http.MaxBytesError{Limit: 1 << 20}
		}
		t, err := s.Send(c.Request().Context(), c.Param("id"), req.Text, req.IdempotencyKey)
		if errors.Is(err, ErrWorkerUnavailable) {
			return echo.NewHTTPError(http.StatusServiceUnavailable, err.Error())
		}
		if errors.Is(err, placement.ErrBusy) || errors.Is(err, ErrPlacementMoving) || errors.Is(err, placement.ErrPlacementFailed) ||
			errors.Is(err, ErrWorkerOnly) {
			return echo.NewHTTPError(http.StatusConflict, err.Error())
		}
		if err != nil {
			return err
		}
		status := http.StatusAccepted
		if t.Replayed {
			status = http.StatusOK
		}
		return c.JSON(status, t)
	})
	g.GET("/sessions/:id/turns", func(c echo.Context) error {
		list, err := s.List(c.Request().Context(), c.Param("id"))
		if err != nil {
			return err
		}
		// oldest first, by run epoch
		list, err = paging.Page(c.Request(), c.Response().Header(), list,
			func(t Turn) paging.Key { return paging.Key{Sort: fmt.Sprintf("%020d", t.RunEpoch), ID: t.RunID} }, paging.Ascending)
		if err != nil {
			return err
		}
		return c.JSON(http.StatusOK, list)
	})
	g.GET("/turns/:run", func(c echo.Context) error {
		t, err := s.Get(c.Request().Context(), c.Param("run"))
		if err != nil {
			return err
		}
		return c.JSON(http.StatusOK, t)
	})
	g.POST("/sessions/:id/cancel", func(c echo.Context) error {
		if _, err := s.cfg.Sessions.Get(c.Request().Context(), c.Param("id")); err != nil {
			return err // an unknown session is not-found
		}
		return c.JSON(http.StatusOK, map[string]bool{"canceled": s.Cancel(c.Param("id"))})
	})
}

// Package workspace is the work on a session's workspace that is not a move of the session: what
// came back to its anchor (changes and their diffs), publishing its managed branch, and the probes
// of an environment's sync path (`openclaw doctor`, `openclaw sync plan`). The moves themselves
// (sync out, reconcile, checkpoints) are steps of gateway/placement's state machine.
package workspace

import (
	"context"
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/openclaw/cloudworkers/gateway/envs"
	"github.com/openclaw/cloudworkers/gateway/placement"
	"github.com/openclaw/cloudworkers/gateway/publish"
	"github.com/openclaw/cloudworkers/gateway/sessions"
	"github.com/openclaw/cloudworkers/providers"
	"github.com/openclaw/cloudworkers/sync/manifest"
)

// Config is what the workspace work reads.
type Config struct {
	Placements *placement.Placements
	Envs       interface {
		Get(ctx context.Context, id string) (envs.Environment, error)
	}
	Sessions interface {
		Get(ctx context.Context, id string) (sessions.Session, error)
	}
	// Dispatcher opens the sync connection to a box (the one the moves use).
	Dispatcher *placement.Dispatcher
	// Publisher pushes a managed branch; nil: publishing is not configured.
	Publisher *publish.Publisher
	// Signing, when set, re-signs the commits a publish pushes (git.signing.key).
	Signing *SigningKey
}

// Service does the workspace work of Config.
type Service struct{ cfg Config }

// New returns the workspace service.
func New(cfg Config) *Service { return &Service{cfg: cfg} }

// RegisterAPI adds the routes: a session's changes and diffs, publish, and the sync probes.
func RegisterAPI(g *echo.Group, w *Service) {
	g.GET("/sessions/:id/changes", func(c echo.Context) error {
		ch, err := w.Changes(c.Request().Context(), c.Param("id"))
		if err != nil {
			return err
		}
		return c.JSON(http.StatusOK, ch)
	})
	g.GET("/sessions/:id/changes/:commit", func(c echo.Context) error {
		text, cut, err := w.Diff(c.Request().Context(), c.Param("id"), c.Param("commit"))
		if err != nil {
			return err
		}
		if cut {
			c.Response().Header().Set("X-Truncated", "true") // cut at MaxDiffBytes
		}
		return c.Blob(http.StatusOK, "text/plain; charset=utf-8", []byte(text))
	})
	g.POST("/sessions/:id/publish", func(c echo.Context) error {
		var req PublishRequest
		if c.Request().ContentLength != 0 {
			if err := (&echo.DefaultBinder{}).BindBody(c, &req); err != nil {
				return providers.Fieldf("body", "invalid JSON: %v", err)
			}
		}
		res, err := w.Publish(c.Request().Context(), c.Param("id"), req)
		if err != nil {
			return placement.APIError(err)
		}
		return c.JSON(http.StatusOK, res)
	})
	g.POST("/environments/:id/check-sync", func(c echo.Context) error {
		msg, err := w.CheckSync(c.Request().Context(), c.Param("id"))
		if err != nil {
			return c.JSON(http.StatusOK, map[string]any{"ok": false, "detail": err.Error()})
		}
		return c.JSON(http.StatusOK, map[string]any{"ok": true, "detail": msg})
	})
	g.GET("/environments/:id/sync/manifest", func(c echo.Context) error {
		t, err := w.BoxManifest(c.Request().Context(), c.Param("id"), c.QueryParam("dir"), manifest.Mode(c.QueryParam("mode")))
		if err != nil {
			return err
		}
		return c.JSON(http.StatusOK, t)
	})
}

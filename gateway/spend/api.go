package spend

import (
	"net/http"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/openclaw/cloudworkers/internal/jsonbody"
	"github.com/openclaw/cloudworkers/providers"
)

// RegisterAPI adds GET /usage, GET /budgets and GET /sessions/:id/spend.
func RegisterAPI(g *echo.Group, l *Ledger) {
	g.GET("/usage", func(c echo.Context) error {
		by := c.QueryParam("by")
		if by == "" {
			by = "day"
		}
		var since time.Time
		if s := c.QueryParam("since"); s != "" {
			var err error
			if since, err = ParseSince(s, l.now(), l.cfg.Zone); err != nil {
				return err
			}
		}
		rows, err := l.Usage(c.Request().Context(), by, since)
		if err != nil {
			return err
		}
		return c.JSON(http.StatusOK, rows)
	})
	g.GET("/budgets", func(c echo.Context) error {
		st, err := l.Budgets(c.Request().Context())
		if err != nil {
			return err
		}
		return c.JSON(http.StatusOK, st)
	})
	g.PUT("/budgets/:id", func(c echo.Context) error {
		var b Budget
		if err := jsonbody.Decode(c.Request().Body, &b); err != nil {
			return err
		}
		if b.ID == "" {
			b.ID = c.Param("id")
		}
		if b.ID != c.Param("id") {
			return providers.Fieldf("id", "%q differs from the path's %q", b.ID, c.Param("id"))
		}
		if err := l.Set(c.Request().Context(), b); err != nil {
			return err
		}
		st, err := l.Budgets(c.Request().Context())
		if err != nil {
			return err
		}
		for _, s := range st {
			if s.ID == b.ID {
				return c.JSON(http.StatusOK, s)
			}
		}
		return c.NoContent(http.StatusNoContent)
	})
	g.DELETE("/budgets/:id", func(c echo.Context) error {
		if err := l.Remove(c.Request().Context(), c.Param("id")); err != nil {
			return err
		}
		return c.NoContent(http.StatusNoContent)
	})
	g.GET("/sessions/:id/spend", func(c echo.Context) error {
		s, err := l.Session(c.Request().Context(), c.Param("id"))
		if err != nil {
			return err
		}
		return c.JSON(http.StatusOK, s)
	})
}

// ParseSince reads a --since: a date (2026-12-01, midnight in zone), an RFC 3339 time, or a
// duration back from now (24h, 7d).
func ParseSince(s string, now time.Time, zone *time.Location) (time.Time, error) {
	if t, err := time.ParseInLocation(time.DateOnly, s, zone); err == nil {
		return t, nil
	}
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return t, nil
	}
	if n := len(s); n > 1 && s[n-1] == 'd' {
		if d, err := time.ParseDuration(s[:n-1] + "h"); err == nil && d > 0 {
			return now.Add(-24 * d), nil
		}
	}
	if d, err := time.ParseDuration(s); err == nil && d > 0 {
		return now.Add(-d), nil
	}
	return time.Time{}, providers.Fieldf("since", "must be a date (2026-12-01), an RFC 3339 time or a duration back from now (24h, 7d), got %.40q", s)
}

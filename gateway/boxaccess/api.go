package boxaccess

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/openclaw/cloudworkers/gateway/bootstrap"
	"github.com/openclaw/cloudworkers/gateway/envs"
	"github.com/openclaw/cloudworkers/internal/jsonbody"
	"github.com/openclaw/cloudworkers/internal/untrusted"
	"github.com/openclaw/cloudworkers/providers"
)

// ExtendRequest is the body of POST /environments/:id/extend.
type ExtendRequest struct {
	// TTL is how long from now the lease is renewed for (a Go duration: 2h, 30m).
	TTL string `json:"ttl"`
}

// DefaultTailLines is what env logs shows without --tail.
const DefaultTailLines = 200

// RegisterAPI adds the box access routes to the authenticated /api/v1 group.
func RegisterAPI(g *echo.Group, s *Service) {
	g.GET("/environments/:id/exec", s.serveExec)
	g.GET("/environments/:id/logs", s.serveLogs)
	g.POST("/environments/:id/extend", s.extend)
}

func (s *Service) extend(c echo.Context) error {
	var req ExtendRequest
	if err := jsonbody.Decode(c.Request().Body, &req); err != nil {
		return err
	}
	d, err := time.ParseDuration(req.TTL)
	if err != nil {
		return providers.Fieldf("ttl", "must be a duration such as 2h or 30m, got %q", req.TTL)
	}
	e, err := s.d.Envs.Extend(c.Request().Context(), c.Param("id"), d, s.MaxExtend())
	var re *envs.RenewError
	switch {
	case errors.Is(err, envs.ErrNotRenewable):
		return echo.NewHTTPError(http.StatusConflict, err.Error())
	case errors.As(err, &re):
		return echo.NewHTTPError(http.StatusBadGateway, err.Error())
	case err != nil:
		return err
	}
	return c.JSON(http.StatusOK, e)
}

// serveLogs answers the end of the worker's log on the box (text/plain): the last ?tail lines
// (at most boxAccess.logTailBytes), then with ?follow=true what the worker appends, until the
// client leaves or the environment ends.
func (s *Service) serveLogs(c echo.Context) error {
	r := c.Request()
	tail := DefaultTailLines
	if v := c.QueryParam("tail"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n > MaxTailLines {
			return providers.Fieldf("tail", "must be a number of lines from 0 to %d, got %q", MaxTailLines, v)
		}
		tail = n
	}
	follow := false
	if v := c.QueryParam("follow"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return providers.Fieldf("follow", "must be true or false, got %q", v)
		}
		follow = b
	}
	e, err := s.d.Envs.Get(r.Context(), c.Param("id"))
	if err != nil {
		return err
	}
	if err := usable(e); err != nil {
		return err
	}
	if e.WorkerHome == "" {
		return fmt.Errorf("environment %s has no worker installed yet (it is %s): %w", e.ID, e.State, envs.ErrConflict)
	}
	release, err := s.acquire(e.ID)
	if err != nil {
		return err
	}
	defer release()
	ctx, cancel := s.sessionContext(r.Context(), e.ID)
	defer cancel()
	client, err := s.dial(ctx, e)
	if err != nil {
		return echo.NewHTTPError(http.StatusBadGateway, envs.Sanitize(err.Error()))
	}
	defer client.Close()
	inTime := s.startDeadline(client) // until the tail started, or (without follow) until it sent all
	late := func(what string) error {
		return echo.NewHTTPError(http.StatusGatewayTimeout, s.errStartTimeout(what).Error())
	}
	sess, err := client.NewSession()
	if err != nil {
		if !inTime() {
			return late("open a session")
		}
		return echo.NewHTTPError(http.StatusBadGateway, envs.Sanitize(fmt.Sprintf("open a session on the box: %v", err)))
	}
	defer sess.Close()
	logPath := path.Join(e.WorkerHome, bootstrap.StateDir(e.ID), "worker.log")
	stdout, err := sess.StdoutPipe()
	if err != nil {
		return err
	}
	var stderr bytes.Buffer
	sess.Stderr = &limitedBuffer{b: &stderr, n: 4096}
	cmd := fmt.Sprintf("tail -n %d -- %s | tail -c %d", tail, untrusted.Quote(logPath), s.cfg.LogTailBytes)
	if follow {
		cmd = fmt.Sprintf("exec tail -n %d -F -- %s 2>/dev/null", tail, untrusted.Quote(logPath))
	}
	if err := sess.Start(cmd); err != nil {
		if !inTime() {
			return late("start reading the worker log")
		}
		return echo.NewHTTPError(http.StatusBadGateway, envs.Sanitize(fmt.Sprintf("the box refused to read the worker log: %v", err)))
	}
	if !follow {
		// the box may send more than it was asked for: what passes is bounded here
		b, err := io.ReadAll(io.LimitReader(stdout, int64(s.cfg.LogTailBytes)))
		var waitErr error
		if len(b) == 0 {
			waitErr = sess.Wait()
		}
		timely := inTime()
		if err != nil && context.Cause(ctx) != nil {
			return echo.NewHTTPError(http.StatusConflict, context.Cause(ctx).Error())
		}
		if !timely {
			return late("send the worker log")
		}
		if len(b) == 0 && waitErr != nil {
			return fmt.Errorf("no worker log at %s on the box yet: %s: %w", logPath, envs.Sanitize(stderr.String()), envs.ErrConflict)
		}
		return c.Blob(http.StatusOK, "text/plain; charset=utf-8", b)
	}
	if !inTime() {
		return late("start following the worker log")
	}
	rc := http.NewResponseController(c.Response().Writer)
	_ = rc.SetReadDeadline(time.Time{})
	c.Response().Header().Set("Content-Type", "text/plain; charset=utf-8")
	c.Response().Header().Set("X-Content-Type-Options", "nosniff")
	c.Response().WriteHeader(http.StatusOK)
	_ = rc.Flush()
	limit := s.limiter()
	buf := make([]byte, s.cfg.MaxFrameBytes)
	for {
		n, err := stdout.Read(buf)
		if n > 0 {
			if limit.WaitN(ctx, n) != nil {
				return nil
			}
			_ = rc.SetWriteDeadline(time.Now().Add(writeTimeout))
			if _, err := c.Response().Write(buf[:n]); err != nil || rc.Flush() != nil {
				return nil
			}
		}
		if err != nil {
			return nil
		}
	}
}

// limitedBuffer keeps the first n bytes written to it.
type limitedBuffer struct {
	b *bytes.Buffer
	n int
}

func (l *limitedBuffer) Write(p []byte) (int, error) {
	if room := l.n - l.b.Len(); room > 0 {
		l.b.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

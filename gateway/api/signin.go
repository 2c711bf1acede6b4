package api

import (
	"net/http"
	"net/url"

	"github.com/labstack/echo/v4"

	"github.com/openclaw/cloudworkers/gateway/auth"
)

// SignInCode is a minted one-time sign-in code of the Control UI and the path that uses it.
type SignInCode struct {
	auth.Code
	// Path is the sign-in link's path, /login?code=…; `openclaw ui` prints the gateway's base
	// URL followed by it.
	Path string `json:"path"`
}

// BrowserSession is a Control UI browser session (never its cookie).
type BrowserSession = auth.Session

// SignInPath is the Control UI's sign-in path for a code.
func SignInPath(code string) string { return "/login?code=" + url.QueryEscape(code) }

func (s *Server) mintSignInCode(c echo.Context) error {
	code, err := s.cfg.Browser.MintCode(c.Request().Context())
	if err != nil {
		return err
	}
	return c.JSON(http.StatusCreated, SignInCode{Code: code, Path: SignInPath(code.Code)})
}

func (s *Server) listBrowserSessions(c echo.Context) error {
	ss, err := s.cfg.Browser.List(c.Request().Context())
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, ss)
}

func (s *Server) revokeBrowserSession(c echo.Context) error {
	ss, err := s.cfg.Browser.Revoke(c.Request().Context(), c.Param("id"), "revoked by the operator")
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, ss)
}

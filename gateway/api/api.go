// Package api serves the gateway's HTTP API (JSON under /api/v1) for the CLI and the Control UI.
package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/openclaw/cloudworkers/gateway/auth"
	"github.com/openclaw/cloudworkers/gateway/envs"
	"github.com/openclaw/cloudworkers/gateway/hub"
	"github.com/openclaw/cloudworkers/gateway/paging"
	"github.com/openclaw/cloudworkers/gateway/profiles"
	"github.com/openclaw/cloudworkers/gateway/spend"
	"github.com/openclaw/cloudworkers/gateway/store"
	"github.com/openclaw/cloudworkers/protocol"
	"github.com/openclaw/cloudworkers/providers"
)

// Config configures the API server.
type Config struct {
	Token     string
	DB        *store.DB
	Profiles  *profiles.Store
	Envs      *envs.Manager
	Registry  *prometheus.Registry
	Log       *slog.Logger
	GatewayID string
	Version   string
	// Ready reports whether the gateway has finished starting.
	Ready func() bool
	// Bootstrap reports whether environments can reach ready (a worker bootstrapper is wired).
	Bootstrap bool
	// WorkerInfo reports the worker side of an environment (admission, tunnel epoch).
	WorkerInfo func(envID string) WorkerInfo
	// Served lists the sessions an environment serves (attachedSessionIds), when set.
	Served func(ctx context.Context, envID string) []string
	// Mount adds routes of other subsystems to the authenticated /api/v1 group.
	Mount []func(g *echo.Group)
	// MaxBody bounds request bodies.
	MaxBody int64
	// AllowedHosts are the host names (without port) a request's Host header may name besides
	// IP literals and localhost: the names operators reach the gateway by. Any other Host is
	// refused with 421, so a page on another origin cannot reach the API through DNS rebinding.
	AllowedHosts []string
	// PublicMetrics serves /metrics without the token (for a separate metrics listener).
	PublicMetrics bool
	// UI, when set, serves every path outside the API (the Control UI at /), behind the same
	// Host check.
	UI http.Handler
	// Browser, when set, signs the Control UI in: its session cookie authenticates /api/v1 like
	// the bearer token, and /api/v1/ui/ mints sign-in codes and lists and revokes browser
	// sessions (bearer token only).
	Browser *auth.Browser
	// Refusals is the refused-authentication log (default: one of its own on Log).
	Refusals *auth.Refusals
	// Transport describes the listener in GET /api/v1/gateway (nil: not said).
	Transport *Transport
}

// Server is the HTTP API.
type Server struct {
	cfg  Config
	Echo *echo.Echo
	http *httpMetrics
}

// Error is the JSON error body: {"error":{"code","message"}}.
type Error struct {
	Status  int    `json:"-"`
	Code    string `json:"code"`
	Message string `json:"message"`
	Field   string `json:"field,omitempty"`
	// Reason names the limit of a capacity-exceeded refusal.
	Reason string `json:"reason,omitempty"`
}

func (e *Error) Error() string { return e.Code + ": " + e.Message }

func apiErr(status int, code, format string, args ...any) *Error {
	return &Error{Status: status, Code: code, Message: fmt.Sprintf(format, args...)}
}

// New builds the server and its routes.
func New(cfg Config) *Server {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.MaxBody == 0 {
		cfg.MaxBody = 1 << 20
	}
	if cfg.Ready == nil {
		cfg.Ready = func() bool { return true }
	}
	if cfg.Refusals == nil {
		cfg.Refusals = auth.NewRefusals(cfg.Log, nil)
	}
	e := echo.New()
	e.HideBanner = true
	e.HidePort = true
	var reg prometheus.Registerer
	if cfg.Registry != nil {
		reg = cfg.Registry
	}
	s := &Server{cfg: cfg, Echo: e, http: newHTTPMetrics(reg)}
	e.HTTPErrorHandler = s.handleError
	e.Use(s.recover, s.logRequests, s.checkHost, s.streams)

	e.GET("/healthz", func(c echo.Context) error { return c.JSON(http.StatusOK, map[string]string{"status": "ok"}) })
	e.GET("/readyz", func(c echo.Context) error {
		if !cfg.Ready() {
			return apiErr(http.StatusServiceUnavailable, "not-ready", "gateway is starting")
		}
		if err := cfg.DB.R.PingContext(c.Request().Context()); err != nil {
			return apiErr(http.StatusServiceUnavailable, "not-ready", "database: %v", err)
		}
		return c.JSON(http.StatusOK, map[string]string{"status": "ready"})
	})
	if cfg.Registry != nil {
		metrics := echo.WrapHandler(promhttp.HandlerFor(cfg.Registry, promhttp.HandlerOpts{}))
		if cfg.PublicMetrics {
			e.GET("/metrics", metrics)
		} else {
			e.GET("/metrics", metrics, s.auth)
		}
	}

	v1 := e.Group("/api/v1", s.auth, s.limitBody)
	v1.GET("/openapi.json", s.openAPI)
	v1.GET("/gateway", s.gatewayInfo)
	v1.GET("/profiles", s.listProfiles)
	v1.POST("/profiles", s.createProfile)
	v1.POST("/profiles/apply", s.applyProfiles)
	v1.GET("/profiles/:id", s.getProfile)
	v1.PUT("/profiles/:id", s.putProfile)
	v1.DELETE("/profiles/:id", s.deleteProfile)
	v1.GET("/environments", s.listEnvs)
	v1.POST("/environments", s.createEnv)
	v1.POST("/environments/sweep", s.sweep)
	v1.GET("/environments/:id", s.getEnv)
	v1.GET("/environments/:id/events", s.envEvents)
	v1.GET("/environments/:id/timeline", s.envTimeline)
	v1.DELETE("/environments/:id", s.destroyEnv)
	v1.GET("/environments/:id/worker", s.envWorker)
	v1.GET("/audit", s.audit)
	if cfg.Browser != nil {
		v1.POST("/ui/signin-codes", s.mintSignInCode, bearerOnly)
		v1.GET("/ui/sessions", s.listBrowserSessions, bearerOnly)
		v1.DELETE("/ui/sessions/:id", s.revokeBrowserSession, bearerOnly)
	}
	for _, m := range cfg.Mount {
		m(v1)
	}
	v1.Any("/*", func(c echo.Context) error {
		return apiErr(http.StatusNotFound, "not-found", "no API route %s %s", c.Request().Method, c.Request().URL.Path)
	})
	if cfg.UI != nil {
		e.Any("/*", echo.WrapHandler(cfg.UI))
	}
	return s
}

// ServeHTTP makes the server an http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.Echo.ServeHTTP(w, r) }

// auth accepts the bearer token (CLI, scripts) or the Control UI's browser session cookie. A
// request authenticated by the cookie that changes state, or opens a WebSocket, must carry an
// Origin naming this gateway, scheme included: a page on another origin cannot act with the
// operator's cookie (CSRF). Every refusal goes to the one refused-authentication log.
func (s *Server) auth(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		r := c.Request()
		if r.Header.Get("Authorization") != "" {
			if auth.BearerIs(r, s.cfg.Token) {
				c.Set(authByKey, authByBearer)
				return next(c)
			}
			if _, ok := auth.Bearer(r); ok {
				s.authFailed(c, "wrong bearer token")
			} else {
				s.authFailed(c, "Authorization header without a bearer token")
			}
			return apiErr(http.StatusUnauthorized, "unauthorized", "missing or wrong bearer token (see <data-dir>/gateway.token)")
		}
		if s.cfg.Browser != nil {
			_, err := s.cfg.Browser.Session(r)
			switch {
			case err == nil:
				if (!SafeMethod(r.Method) || r.Header.Get("Upgrade") != "") && !s.cfg.Browser.SameOrigin(r) {
					s.authFailed(c, "UI session cookie from another origin "+strconv.Quote(r.Header.Get("Origin")))
					return apiErr(http.StatusForbidden, "origin-mismatch",
						"a request signed in by the UI session cookie must come from this gateway's own pages (Origin %q, Host %q, scheme %s)",
						r.Header.Get("Origin"), r.Host, scheme(s.cfg.Browser.Secure(r)))
				}
				c.Set(authByKey, authByCookie)
				return next(c)
			case errors.Is(err, http.ErrNoCookie):
			case errors.Is(err, auth.ErrNoSession):
				s.authFailed(c, "UI session cookie: "+err.Error())
				return apiErr(http.StatusUnauthorized, "unauthorized",
					"this browser session has ended (signed out, idle, expired or revoked): run `openclaw ui` for a one-time sign-in link")
			default:
				return err
			}
		}
		s.authFailed(c, "no credentials")
		return apiErr(http.StatusUnauthorized, "unauthorized", "missing or wrong bearer token (see <data-dir>/gateway.token)")
	}
}

// What authenticated a request (the context key authByKey).
const (
	authByKey    = "openclaw.authBy"
	authByBearer = "bearer"
	authByCookie = "cookie"
)

// bearerOnly refuses a request signed in by the browser session cookie: minting sign-in codes
// and managing browser sessions need the operator token itself, so a session cannot outlive its
// lifetime by minting itself another.
func bearerOnly(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		if c.Get(authByKey) != authByBearer {
			return apiErr(http.StatusForbidden, "bearer-required", "this route needs the operator token (Authorization: Bearer), not the UI session cookie")
		}
		return next(c)
	}
}

func scheme(secure bool) string {
	if secure {
		return "https"
	}
	return "http"
}

// authFailed records a refused authentication in the refused-authentication log (aggregated
// per source and minute): what was wrong, never what was presented.
func (s *Server) authFailed(c echo.Context, why string) {
	s.cfg.Refusals.Refuse(c.Request(), "api", why)
}

// SafeMethod reports whether an HTTP method only reads (GET, HEAD, OPTIONS).
func SafeMethod(m string) bool {
	return m == http.MethodGet || m == http.MethodHead || m == http.MethodOptions
}

// checkHost refuses a request whose Host header is not an IP literal, localhost or one of the
// configured names (421 Misdirected Request).
func (s *Server) checkHost(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		if !HostAllowed(c.Request().Host, s.cfg.AllowedHosts) {
			return apiErr(http.StatusMisdirectedRequest, "host-not-allowed",
				"host %q is not this gateway's address; add it to the gateway's allowedHosts to reach the gateway by that name", c.Request().Host)
		}
		return next(c)
	}
}

// HostAllowed reports whether a Host header (host or host:port) names this gateway: an IP
// literal (a DNS-rebinding page can only send its own name), localhost, or an allowed name.
func HostAllowed(hostport string, allowed []string) bool {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.ToLower(strings.Trim(host, "[]")), ".")
	if host == "" {
		return false
	}
	if net.ParseIP(host) != nil || host == "localhost" || strings.HasSuffix(host, ".localhost") {
		return true
	}
	for _, a := range allowed {
		if strings.EqualFold(strings.TrimSuffix(a, "."), host) {
			return true
		}
	}
	return false
}

// streams lifts the server's read and write timeouts for the requests that are meant to last:
// WebSocket streams, long polls (?wait=) and transcript exports.
func (s *Server) streams(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		r := c.Request()
		if r.Header.Get("Upgrade") != "" || r.URL.Query().Has("wait") || strings.HasSuffix(r.URL.Path, "/export") {
			rc := http.NewResponseController(c.Response().Writer)
			_ = rc.SetReadDeadline(time.Time{})
			_ = rc.SetWriteDeadline(time.Time{})
		}
		return next(c)
	}
}

func (s *Server) limitBody(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		c.Request().Body = http.MaxBytesReader(c.Response(), c.Request().Body, s.cfg.MaxBody)
		return next(c)
	}
}

func (s *Server) recover(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) (err error) {
		defer func() {
			if r := recover(); r != nil {
				s.cfg.Log.Error("panic in handler", "path", c.Request().URL.Path, "panic", r)
				err = apiErr(http.StatusInternalServerError, "internal", "internal error")
			}
		}()
		return next(c)
	}
}

// logRequests writes the access log (one DEBUG line per request) and counts the request by its
// route template (never the raw path: /sessions/:id, not every session's id) and status.
func (s *Server) logRequests(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		start := time.Now()
		err := next(c)
		if err != nil {
			c.Error(err)
		}
		route := c.Path()
		if route == "" {
			route = "unmatched"
		}
		took := time.Since(start)
		s.http.observe(c.Request().Method, route, c.Response().Status, took)
		s.cfg.Log.Debug("http", "method", c.Request().Method, "route", route, "path", c.Request().URL.Path,
			"status", c.Response().Status, "ms", took.Milliseconds(), "remote", c.Request().RemoteAddr)
		return nil
	}
}

// handleError maps errors to {"error":{code,message}} with the right status.
func (s *Server) handleError(err error, c echo.Context) {
	if c.Response().Committed {
		return
	}
	var ae *Error
	var fe *providers.FieldError
	var te *envs.TransitionError
	var he *echo.HTTPError
	var mbe *http.MaxBytesError
	var ce *envs.CapacityError
	var be *spend.ExceededError
	switch {
	case errors.As(err, &ae):
	case errors.As(err, &be):
		// a budget is spent: nothing was recorded; the message names the budget, its spend and
		// limit, when it resets and how to raise it
		ae = &Error{Status: http.StatusPaymentRequired, Code: "budget-exceeded", Message: err.Error(), Reason: be.Budget}
	case errors.As(err, &ce):
		// Shedding load: nothing was recorded; the client retries after the hint.
		c.Response().Header().Set("Retry-After", strconv.Itoa(int(max(ce.RetryAfter.Round(time.Second)/time.Second, 1))))
		ae = &Error{Status: http.StatusTooManyRequests, Code: "capacity-exceeded", Message: ce.Message, Reason: ce.Reason}
	case errors.As(err, &fe):
		ae = &Error{Status: http.StatusBadRequest, Code: "invalid-field", Message: fe.Error(), Field: fe.Field}
	case errors.As(err, &mbe):
		ae = apiErr(http.StatusRequestEntityTooLarge, "too-large", "request body larger than %d bytes", mbe.Limit)
	case errors.Is(err, store.ErrNotFound):
		msg := err.Error()
		var pe interface{ Protocol() *protocol.Error }
		if errors.As(err, &pe) && pe.Protocol().Message != "" {
			msg = pe.Protocol().Message // the worker protocol's code (session-not-attached) is not the API's
		}
		ae = apiErr(http.StatusNotFound, "not-found", "%s", msg)
	case errors.Is(err, auth.ErrTooManyCodes):
		c.Response().Header().Set("Retry-After", strconv.Itoa(int(auth.CodeLifetime/time.Second)))
		ae = apiErr(http.StatusTooManyRequests, "capacity-exceeded", "%v", err)
	case errors.Is(err, envs.ErrCapacity):
		ae = apiErr(http.StatusConflict, "capacity", "%v", err)
	case errors.Is(err, envs.ErrAttached), errors.Is(err, envs.ErrConflict), errors.Is(err, profiles.ErrInUse):
		ae = apiErr(http.StatusConflict, "conflict", "%v", err)
	case errors.As(err, &te):
		ae = apiErr(http.StatusConflict, "illegal-transition", "%v", err)
	case errors.As(err, &he):
		ae = apiErr(he.Code, strings.ReplaceAll(strings.ToLower(http.StatusText(he.Code)), " ", "-"), "%v", he.Message)
	case errors.Is(err, context.DeadlineExceeded):
		ae = apiErr(http.StatusGatewayTimeout, "timeout", "%v", err)
	default:
		s.cfg.Log.Error("api error", "path", c.Request().URL.Path, "err", err)
		ae = apiErr(http.StatusInternalServerError, "internal", "%v", err)
	}
	_ = c.JSON(ae.Status, map[string]*Error{"error": ae})
}

// bind decodes a JSON body strictly.
func bind(c echo.Context, v any) error {
	dec := json.NewDecoder(c.Request().Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var mbe *http.MaxBytesError
		var fe *providers.FieldError
		if errors.As(err, &mbe) || errors.As(err, &fe) {
			return err
		}
		if errors.Is(err, io.EOF) {
			return apiErr(http.StatusBadRequest, "invalid-body", "request body is empty (expected JSON)")
		}
		var ute *json.UnmarshalTypeError
		if errors.As(err, &ute) {
			if ute.Field == "" { // the body itself is not the object the route takes
				return &providers.FieldError{Field: "body", Message: fmt.Sprintf("must be a JSON object, got %s", ute.Value)}
			}
			return &providers.FieldError{Field: ute.Field, Message: fmt.Sprintf("must be %s", ute.Type)}
		}
		msg := err.Error()
		if f, ok := strings.CutPrefix(msg, "json: unknown field "); ok {
			return &providers.FieldError{Field: strings.Trim(f, `"`), Message: "unknown field"}
		}
		return apiErr(http.StatusBadRequest, "invalid-body", "invalid JSON: %v", err)
	}
	return nil
}

func (s *Server) gatewayInfo(c echo.Context) error {
	return c.JSON(http.StatusOK, GatewayInfo{ID: s.cfg.GatewayID, Version: s.cfg.Version,
		Features: map[string]bool{"bootstrap": s.cfg.Bootstrap}, Transport: s.cfg.Transport})
}

// WorkerInfo is the worker side of an environment.
type WorkerInfo struct {
	Admitted     bool   `json:"admitted"`
	TunnelStatus string `json:"tunnelStatus"`
	TunnelEpoch  uint64 `json:"tunnelEpoch"`
	// Backpressure: the worker's requests are being refused or queued near their bound.
	Backpressure bool `json:"backpressure"`
	// Queued is the number of worker requests waiting in the gateway's stream queues.
	Queued int `json:"queued"`
	// CapacityRejections counts capacity-exceeded answers to this worker since the gateway started.
	CapacityRejections uint64 `json:"capacityRejections"`
	// Shedding, when set, says which capacity limit refused or paced this environment's load last
	// (reason) and since when it has been shed.
	Shedding *Shedding `json:"shedding,omitempty"`
	// Inference is the running total of the model calls the gateway proxied for this environment.
	Inference InferenceTotals `json:"inference"`
}

// Shedding is why an environment's load is being refused or paced, and since when (the hub's).
type Shedding = hub.Shedding

// InferenceTotals are an environment's running totals of proxied model calls (the hub's).
type InferenceTotals = hub.InferenceTotals

func (s *Server) envWorker(c echo.Context) error {
	e, err := s.cfg.Envs.Get(c.Request().Context(), c.Param("id"))
	if err != nil {
		return err
	}
	info := WorkerInfo{TunnelStatus: e.TunnelStatus}
	if s.cfg.WorkerInfo != nil {
		info = s.cfg.WorkerInfo(e.ID)
	}
	return c.JSON(http.StatusOK, info)
}

// audit answers GET /audit: audit rows newest first, paged by id (?limit, ?cursor).
func (s *Server) audit(c echo.Context) error {
	req, err := paging.Parse(c.QueryParams())
	if err != nil {
		return err
	}
	var before int64
	if req.After != nil {
		if before, err = strconv.ParseInt(req.After.ID, 10, 64); err != nil || before < 1 {
			return providers.Fieldf("cursor", "is not a cursor of this list: pass the X-Next-Cursor of the previous page as it is")
		}
	}
	rows, err := s.cfg.DB.ListAuditBefore(c.Request().Context(), c.QueryParam("environmentId"), before, req.Limit+1)
	if err != nil {
		return err
	}
	if len(rows) > req.Limit {
		rows = rows[:req.Limit]
		paging.SetNext(c.Response().Header(), c.Request(), paging.Key{ID: strconv.FormatInt(rows[len(rows)-1].ID, 10)})
	}
	if rows == nil {
		rows = []store.AuditEntry{}
	}
	return c.JSON(http.StatusOK, rows)
}

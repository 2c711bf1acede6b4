package sessions

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/coder/websocket"
	"github.com/coder/websocket/wsjson"
	"github.com/labstack/echo/v4"

	"github.com/openclaw/cloudworkers/gateway/paging"
	"github.com/openclaw/cloudworkers/gateway/store"
	"github.com/openclaw/cloudworkers/internal/jsonbody"
	"github.com/openclaw/cloudworkers/providers"
)

// streamWriteTimeout bounds one WebSocket write; a peer that stops reading is disconnected.
const streamWriteTimeout = 10 * time.Second

// Close reasons of the stream WebSockets.
const (
	CloseReasonLagged = "lagged"
	CloseReasonClosed = "closed"
)

// StreamMessage is one WebSocket message of GET /sessions/:id/stream: a live record
// ({"type":"live","cursor",...}) or, first, a gap ({"type":"gap","missed":N}) when events after the
// requested cursor are no longer retained.
type StreamMessage struct {
	Type   string `json:"type"`
	Missed uint64 `json:"missed,omitempty"`
	*LiveRecord
}

// ChangeMessage is one WebSocket message of GET /events: {"type":"change","cursor","kind","id","at"}
// or a gap.
type ChangeMessage struct {
	Type   string `json:"type"`
	Missed uint64 `json:"missed,omitempty"`
	*Change
}

// RegisterAPI mounts the session routes on g (the caller adds auth):
//
//	POST /sessions, GET /sessions, GET /sessions/:id, GET /sessions/:id/transcript,
//	GET /sessions/:id/stream?cursor=N (WebSocket), GET /events?cursor=N (WebSocket).
func RegisterAPI(g *echo.Group, s *Store, opts ...APIOption) {
	h := &handlers{s: s}
	for _, o := range opts {
		o(h)
	}
	g.POST("/sessions", h.create)
	g.GET("/sessions", h.list)
	g.GET("/sessions/:id", h.get)
	g.GET("/sessions/:id/transcript", h.transcript)
	g.GET("/sessions/:id/stream", h.stream)
	g.GET("/events", h.events)
}

type handlers struct {
	s           *Store
	dispatch    func(ctx context.Context, sessionID, profileID, machineClass string) error
	checkTarget func(ctx context.Context, profileID, machineClass string) error
}

// APIOption configures the session routes.
type APIOption func(*handlers)

// WithDispatch lets POST /sessions take a target {kind: "profile", profileId} and dispatch the new
// session to a worker of that profile right away.
func WithDispatch(f func(ctx context.Context, sessionID, profileID, machineClass string) error) APIOption {
	return func(h *handlers) { h.dispatch = f }
}

// WithTargetCheck checks a target {kind: "profile"} (the profile exists, the machine class is one it
// has) before the session row is written: a bad target leaves no session and leases nothing. The
// error wraps store.ErrNotFound for an unknown profile, or is a *providers.FieldError.
func WithTargetCheck(f func(ctx context.Context, profileID, machineClass string) error) APIOption {
	return func(h *handlers) { h.checkTarget = f }
}

// Target says where a new session runs: {kind: "gateway"} (default) or {kind: "profile", profileId}.
type Target struct {
	Kind         string `json:"kind"`
	ProfileID    string `json:"profileId,omitempty"`
	MachineClass string `json:"machineClass,omitempty"`
}

// CreateRequest is the body of POST /sessions.
type CreateRequest struct {
	CreateParams
	// Git asks for git mode: the workspace must be inside a git work tree.
	Git    bool    `json:"git,omitempty"`
	Target *Target `json:"target,omitempty"`
}

// apiError writes the gateway's JSON error body {"error":{"code","message"}}.
func apiError(c echo.Context, status int, code, format string, args ...any) error {
	return c.JSON(status, map[string]any{"error": map[string]string{"code": code, "message": fmt.Sprintf(format, args...)}})
}

// fieldError writes a 400 naming the field: {"error":{"code":"invalid-field","message","field"}}.
func fieldError(c echo.Context, fe *providers.FieldError) error {
	return c.JSON(http.StatusBadRequest, map[string]any{"error": map[string]string{"code": "invalid-field", "message": fe.Error(), "field": fe.Field}})
}

func (h *handlers) fail(c echo.Context, err error) error {
	var se *Error
	switch {
	case errors.Is(err, store.ErrNotFound) && errors.As(err, &se):
		return apiError(c, http.StatusNotFound, "not-found", "%s", se.Message) // the worker protocol's code is not the API's
	case errors.Is(err, store.ErrNotFound):
		return apiError(c, http.StatusNotFound, "not-found", "%v", err)
	case errors.As(err, &se):
		return apiError(c, http.StatusConflict, string(se.Code), "%s", se.Message)
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return apiError(c, http.StatusGatewayTimeout, "timeout", "%v", err)
	}
	h.s.cfg.Log.Error("sessions api", "path", c.Request().URL.Path, "err", err)
	return apiError(c, http.StatusInternalServerError, "internal", "%v", err)
}

// create validates everything it can before the session row is written: the title, the
// workspace (it exists and is a directory; a git work tree with git), the target's profile and
// machine class. A bad request leaves no session and leases nothing.
func (h *handlers) create(c echo.Context) error {
	var req CreateRequest
	if err := jsonbody.DecodeOptional(c.Request().Body, &req); err != nil {
		var fe *providers.FieldError
		var mbe *http.MaxBytesError
		switch {
		case errors.As(err, &mbe):
			return apiError(c, http.StatusRequestEntityTooLarge, "too-large", "request body larger than %d bytes", mbe.Limit)
		case errors.As(err, &fe):
			return fieldError(c, fe)
		}
		return apiError(c, http.StatusBadRequest, "bad-request", "%v", err)
	}
	p := req.CreateParams
	if t := req.Target; t != nil {
		switch {
		case t.Kind == "gateway" && t.ProfileID == "":
		case t.Kind == "profile" && t.ProfileID != "" && h.dispatch != nil:
			if p.Workspace == "" {
				return fieldError(c, &providers.FieldError{Field: "workspace", Message: "is required to run on a worker"})
			}
		case t.Kind == "profile" && t.ProfileID == "":
			return fieldError(c, &providers.FieldError{Field: "target.profileId", Message: "is required for kind profile"})
		default:
			return fieldError(c, &providers.FieldError{Field: "target.kind", Message: fmt.Sprintf("must be gateway or profile, got %q", t.Kind)})
		}
	}
	if len(p.Title) > MaxTitleLen {
		return fieldError(c, &providers.FieldError{Field: "title", Message: fmt.Sprintf("longer than %d bytes", MaxTitleLen)})
	}
	ctx := c.Request().Context()
	var fe *providers.FieldError
	if err := h.s.CheckParams(p); errors.As(err, &fe) {
		return fieldError(c, fe)
	}
	if p.Workspace != "" {
		if err := h.s.Roots().Check("workspace", p.Workspace); errors.As(err, &fe) {
			return fieldError(c, fe)
		}
	}
	if err := CheckWorkspace(ctx, p.Workspace, req.Git); errors.As(err, &fe) {
		return fieldError(c, fe)
	} else if err != nil {
		return h.fail(c, err)
	}
	if t := req.Target; t != nil && t.Kind == "profile" && h.checkTarget != nil {
		err := h.checkTarget(ctx, t.ProfileID, t.MachineClass)
		switch {
		case errors.Is(err, store.ErrNotFound):
			return fieldError(c, &providers.FieldError{Field: "target.profileId", Message: fmt.Sprintf("no profile %q (see `openclaw profile list`)", t.ProfileID)})
		case errors.As(err, &fe):
			return fieldError(c, &providers.FieldError{Field: "target." + fe.Field, Message: fe.Message})
		case err != nil:
			return h.fail(c, err)
		}
	}
	ses, err := h.s.Create(ctx, p)
	if err != nil {
		return h.fail(c, err)
	}
	if t := req.Target; t != nil && t.Kind == "profile" {
		if err := h.dispatch(c.Request().Context(), ses.ID, t.ProfileID, t.MachineClass); err != nil {
			return apiError(c, http.StatusConflict, "dispatch", "session %s created, but it could not be dispatched: %v", ses.ID, err)
		}
		if ses, err = h.s.Get(c.Request().Context(), ses.ID); err != nil {
			return h.fail(c, err)
		}
	}
	return c.JSON(http.StatusCreated, ses)
}

// list answers GET /sessions: the sessions that are not archived; ?all=true adds the archived
// ones, ?archived=true lists only them. It pages (?limit, ?cursor; X-Next-Cursor and Link when
// more follow), newest created first.
func (h *handlers) list(c echo.Context) error {
	all, fe := boolParam("all", c.QueryParam("all"))
	if fe != nil {
		return fieldError(c, fe)
	}
	archived, fe := boolParam("archived", c.QueryParam("archived"))
	if fe != nil {
		return fieldError(c, fe)
	}
	req, err := paging.Parse(c.QueryParams())
	var pfe *providers.FieldError
	if errors.As(err, &pfe) {
		return fieldError(c, pfe)
	}
	list, next, err := h.s.ListPage(c.Request().Context(), ListFilter{All: all, Archived: archived}, req)
	if err != nil {
		return h.fail(c, err)
	}
	if next != nil {
		paging.SetNext(c.Response().Header(), c.Request(), *next)
	}
	return c.JSON(http.StatusOK, list)
}

// boolParam parses a boolean query parameter ("" is false).
func boolParam(name, v string) (bool, *providers.FieldError) {
	if v == "" {
		return false, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, &providers.FieldError{Field: name, Message: fmt.Sprintf("must be true or false, got %.20q", v)}
	}
	return b, nil
}

func (h *handlers) get(c echo.Context) error {
	ses, err := h.s.Get(c.Request().Context(), c.Param("id"))
	if err != nil {
		return h.fail(c, err)
	}
	return c.JSON(http.StatusOK, ses)
}

// MaxTranscriptPage bounds ?limit= of GET /sessions/:id/transcript.
const MaxTranscriptPage = 10000

// TranscriptPage is GET /sessions/:id/transcript?limit=N: the newest N entries (before the
// entry ?before=ID when given), with the number of entries before them (Offset) and in all
// (Total). Without ?limit the route returns the whole Transcript.
type TranscriptPage struct {
	Transcript
	Offset int `json:"offset"`
	Total  int `json:"total"`
}

func (h *handlers) transcript(c echo.Context) error {
	var limit int
	if v := c.QueryParam("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > MaxTranscriptPage {
			return fieldError(c, &providers.FieldError{Field: "limit", Message: fmt.Sprintf("must be a number from 1 to %d, got %.20q", MaxTranscriptPage, v)})
		}
		limit = n
	}
	before := c.QueryParam("before")
	if before != "" && limit == 0 {
		return fieldError(c, &providers.FieldError{Field: "before", Message: "needs limit"})
	}
	t, err := h.s.Transcript(c.Request().Context(), c.Param("id"))
	if err != nil {
		return h.fail(c, err)
	}
	if limit == 0 {
		return c.JSON(http.StatusOK, t)
	}
	end := len(t.Entries)
	if before != "" {
		end = slices.IndexFunc(t.Entries, func(e Entry) bool { return e.ID == before })
		if end < 0 {
			return fieldError(c, &providers.FieldError{Field: "before", Message: fmt.Sprintf("no entry %.40q in session %s", before, t.Session.ID)})
		}
	}
	start := max(0, end-limit)
	page := TranscriptPage{Transcript: Transcript{Session: t.Session, Entries: t.Entries[start:end]}, Offset: start, Total: len(t.Entries)}
	return c.JSON(http.StatusOK, page)
}

func cursorParam(c echo.Context) (uint64, error) {
	v := c.QueryParam("cursor")
	if v == "" {
		return 0, nil
	}
	return strconv.ParseUint(v, 10, 64)
}

func (h *handlers) stream(c echo.Context) error {
	cursor, err := cursorParam(c)
	if err != nil {
		return apiError(c, http.StatusBadRequest, "invalid-field", "cursor: %v", err)
	}
	sub, err := h.s.Subscribe(c.Request().Context(), c.Param("id"), cursor)
	if err != nil {
		return h.fail(c, err)
	}
	defer sub.Close()
	var gap any
	if sub.Missed > 0 {
		gap = StreamMessage{Type: "gap", Missed: sub.Missed}
	}
	return serveFeed(c, sub, gap, func(r *LiveRecord) any { return StreamMessage{Type: "live", LiveRecord: r} })
}

func (h *handlers) events(c echo.Context) error {
	cursor, err := cursorParam(c)
	if err != nil {
		return apiError(c, http.StatusBadRequest, "invalid-field", "cursor: %v", err)
	}
	sub := h.s.SubscribeChanges(cursor)
	defer sub.Close()
	var gap any
	if sub.Missed > 0 {
		gap = ChangeMessage{Type: "gap", Missed: sub.Missed}
	}
	return serveFeed(c, sub, gap, func(ch *Change) any { return ChangeMessage{Type: "change", Change: ch} })
}

// serveFeed upgrades to a WebSocket and writes the subscription's items until either side ends. A
// lagged subscription closes the socket with status 1013 and reason "lagged"; the client reconnects
// with the cursor of the last item it received.
func serveFeed[T any](c echo.Context, sub *Subscription[T], first any, msg func(T) any) error {
	conn, err := websocket.Accept(c.Response(), c.Request(), nil)
	if err != nil {
		return nil // Accept has written the HTTP error
	}
	defer conn.CloseNow()
	ctx := conn.CloseRead(c.Request().Context())
	write := func(v any) error {
		wctx, cancel := context.WithTimeout(ctx, streamWriteTimeout)
		defer cancel()
		return wsjson.Write(wctx, conn, v)
	}
	if first != nil {
		if err := write(first); err != nil {
			return nil
		}
	}
	for {
		select {
		case it, ok := <-sub.C():
			if !ok {
				if errors.Is(sub.Err(), ErrLagged) {
					_ = conn.Close(websocket.StatusTryAgainLater, CloseReasonLagged)
				} else {
					_ = conn.Close(websocket.StatusGoingAway, CloseReasonClosed)
				}
				return nil
			}
			if err := write(msg(it)); err != nil {
				return nil
			}
		case <-ctx.Done():
			return nil
		}
	}
}

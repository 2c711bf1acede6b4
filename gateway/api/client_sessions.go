package api

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/coder/websocket"
	"github.com/coder/websocket/wsjson"

	"github.com/openclaw/cloudworkers/gateway/placement"
	"github.com/openclaw/cloudworkers/gateway/publish"
	"github.com/openclaw/cloudworkers/gateway/sessions"
	"github.com/openclaw/cloudworkers/gateway/spend"
	"github.com/openclaw/cloudworkers/gateway/turns"
	"github.com/openclaw/cloudworkers/gateway/workspace"
	"github.com/openclaw/cloudworkers/sync/manifest"
)

// CreateSession creates a session (and, with a profile target, dispatches it).
func (c *Client) CreateSession(ctx context.Context, req sessions.CreateRequest) (sessions.Session, error) {
	return doAs[sessions.Session](ctx, c, http.MethodPost, v1("sessions"), req)
}

// Sessions lists the sessions that are not archived (every page), most recently updated first.
func (c *Client) Sessions(ctx context.Context) ([]sessions.Session, error) {
	return c.SessionsWhere(ctx, SessionFilter{})
}

// SessionFilter selects archived sessions in SessionsWhere: All lists every session, Archived only
// the archived ones (neither: those not archived, as Sessions).
type SessionFilter struct{ All, Archived bool }

// SessionsWhere lists the sessions the filter selects (every page), most recently updated first.
func (c *Client) SessionsWhere(ctx context.Context, f SessionFilter) ([]sessions.Session, error) {
	list, err := listAs[sessions.Session](ctx, c, sessionsPath(f))
	if err != nil {
		return nil, err
	}
	// the pages come newest created first (an order updates cannot shuffle); show the latest
	// activity first
	slices.SortStableFunc(list, func(a, b sessions.Session) int {
		if c := b.UpdatedAt.Compare(a.UpdatedAt); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	return list, nil
}

// SessionsPage returns one page of the sessions the filter selects, newest created first, and
// the cursor of the next page ("" on the last).
func (c *Client) SessionsPage(ctx context.Context, f SessionFilter, o PageOptions) ([]sessions.Session, string, error) {
	return pageAs[sessions.Session](ctx, c, sessionsPath(f), o)
}

func sessionsPath(f SessionFilter) string {
	q := url.Values{}
	if f.All {
		q.Set("all", "true")
	}
	if f.Archived {
		q.Set("archived", "true")
	}
	path := v1("sessions")
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	return path
}

// Session returns one session.
func (c *Client) Session(ctx context.Context, id string) (sessions.Session, error) {
	return getAs[sessions.Session](ctx, c, v1("sessions", id))
}

// Transcript returns a session with its transcript tree.
func (c *Client) Transcript(ctx context.Context, id string) (sessions.Transcript, error) {
	return getAs[sessions.Transcript](ctx, c, v1("sessions", id, "transcript"))
}

// SendMessage starts a turn of a session (or, for a repeated idempotency key, returns the turn it
// started).
func (c *Client) SendMessage(ctx context.Context, sessionID string, req turns.SendRequest) (turns.Turn, error) {
	return doAs[turns.Turn](ctx, c, http.MethodPost, v1("sessions", sessionID, "messages"), req)
}

// Turns lists the turns of a session.
func (c *Client) Turns(ctx context.Context, sessionID string) ([]turns.Turn, error) {
	return listAs[turns.Turn](ctx, c, v1("sessions", sessionID, "turns"))
}

// Turn returns one turn by its run id.
func (c *Client) Turn(ctx context.Context, runID string) (turns.Turn, error) {
	return getAs[turns.Turn](ctx, c, v1("turns", runID))
}

// PlacementView is the body of GET /sessions/:id/placement: the placement and its steps.
type PlacementView struct {
	Placement placement.Placement `json:"placement"`
	Events    []placement.Event   `json:"events"`
}

// Placement returns where a session runs and the steps that brought it there.
func (c *Client) Placement(ctx context.Context, sessionID string) (PlacementView, error) {
	return getAs[PlacementView](ctx, c, v1("sessions", sessionID, "placement"))
}

// Dispatch moves a session to a worker of a profile; the dispatch runs on in the gateway.
func (c *Client) Dispatch(ctx context.Context, sessionID string, req placement.DispatchRequest) (placement.Placement, error) {
	return doAs[placement.Placement](ctx, c, http.MethodPost, v1("sessions", sessionID, "dispatch"), req)
}

// PullBack brings a session home from its worker; the pull-back runs on in the gateway.
func (c *Client) PullBack(ctx context.Context, sessionID string, req placement.PullBackRequest) (placement.Placement, error) {
	return doAs[placement.Placement](ctx, c, http.MethodPost, v1("sessions", sessionID, "pullback"), req)
}

// MoveLocal moves a session whose worker placement failed (or was lost) to the gateway.
func (c *Client) MoveLocal(ctx context.Context, sessionID string, force bool) (placement.Placement, error) {
	return c.Move(ctx, sessionID, placement.MoveRequest{To: "local", Force: force})
}

// Move moves a session to the gateway or to a worker of a profile (POST /sessions/{id}/move).
func (c *Client) Move(ctx context.Context, sessionID string, req placement.MoveRequest) (placement.Placement, error) {
	return doAs[placement.Placement](ctx, c, http.MethodPost, v1("sessions", sessionID, "move"), req)
}

// SyncCheck is the body of POST /environments/:id/check-sync.
type SyncCheck struct {
	OK     bool   `json:"ok"`
	Detail string `json:"detail"`
}

// CheckSync round-trips a small workspace through an environment's box.
func (c *Client) CheckSync(ctx context.Context, envID string) (SyncCheck, error) {
	return doAs[SyncCheck](ctx, c, http.MethodPost, v1("environments", envID, "check-sync"), nil)
}

// BoxManifest lists the tree on an environment's box: dir (default the workspace of the session
// it serves), selected in mode (default the session's).
func (c *Client) BoxManifest(ctx context.Context, envID, dir string, mode manifest.Mode) (workspace.BoxTree, error) {
	q := make([]string, 0, 2)
	if dir != "" {
		q = append(q, "dir="+url.QueryEscape(dir))
	}
	if mode != "" {
		q = append(q, "mode="+url.QueryEscape(string(mode)))
	}
	return getAs[workspace.BoxTree](ctx, c, v1("environments", envID, "sync", "manifest")+"?"+strings.Join(q, "&"))
}

// WaitPlacement polls a session's placement until it rests (local, active, failed or reclaimed)
// or ctx ends. Each step after the first skip is passed to each (when set) as it is seen.
func (c *Client) WaitPlacement(ctx context.Context, sessionID string, skip int, each func(placement.Event)) (PlacementView, error) {
	seen := skip
	for {
		v, err := c.Placement(ctx, sessionID)
		if err != nil {
			return v, err
		}
		if each != nil {
			for _, ev := range v.Events[min(seen, len(v.Events)):] {
				each(ev)
			}
		}
		seen = len(v.Events)
		switch v.Placement.State {
		case placement.Local, placement.Active, placement.Failed, placement.Reclaimed:
			return v, nil
		}
		select {
		case <-ctx.Done():
			return v, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// SessionStream is one WebSocket connection following a session's live events.
type SessionStream struct {
	conn *websocket.Conn
}

// StreamSession follows a session's live events: the retained ones after cursor (0: all), then
// new ones. A watcher that falls behind is disconnected with websocket.StatusTryAgainLater and
// reconnects from the last cursor it saw.
func (c *Client) StreamSession(ctx context.Context, sessionID string, cursor uint64) (*SessionStream, error) {
	u := "ws" + strings.TrimPrefix(c.BaseURL, "http") + v1("sessions", sessionID, "stream") + "?cursor=" + strconv.FormatUint(cursor, 10)
	conn, resp, err := websocket.Dial(ctx, u, &websocket.DialOptions{
		HTTPHeader: http.Header{"Authorization": []string{"Bearer " + c.Token}},
		HTTPClient: c.streamHTTP(),
	})
	if err != nil {
		if resp != nil && resp.StatusCode == http.StatusNotFound {
			return nil, fmt.Errorf("session %s not found", sessionID)
		}
		return nil, fmt.Errorf("watch session %s: %w", sessionID, err)
	}
	conn.SetReadLimit(32 << 20)
	return &SessionStream{conn: conn}, nil
}

// Next reads the next message: a live record, or a gap of events no longer retained.
func (s *SessionStream) Next(ctx context.Context) (sessions.StreamMessage, error) {
	var m sessions.StreamMessage
	err := wsjson.Read(ctx, s.conn, &m)
	return m, err
}

// Close closes the connection.
func (s *SessionStream) Close() error { return s.conn.CloseNow() }

// Publish pushes a session's managed branch with the gateway's forge credential (and opens its
// pull request when req.PR).
func (c *Client) Publish(ctx context.Context, sessionID string, req workspace.PublishRequest) (publish.Result, error) {
	return doAs[publish.Result](ctx, c, http.MethodPost, v1("sessions", sessionID, "publish"), req)
}

// RemoveSession removes a session (DELETE /sessions/:id); mode says what to do with the work of a
// session a worker holds ("" refuses it).
func (c *Client) RemoveSession(ctx context.Context, id string, mode turns.RemoveMode) (turns.RemoveReport, error) {
	path := v1("sessions", id)
	if mode != "" {
		path += "?" + url.Values{"force": {string(mode)}}.Encode()
	}
	return doAs[turns.RemoveReport](ctx, c, http.MethodDelete, path, nil)
}

// ArchiveSession archives (archive true) or unarchives a session.
func (c *Client) ArchiveSession(ctx context.Context, id string, archive bool) (sessions.Session, error) {
	verb := "unarchive"
	if archive {
		verb = "archive"
	}
	return doAs[sessions.Session](ctx, c, http.MethodPost, v1("sessions", id, verb), nil)
}

// SessionSpend returns what a session and its tree have spent (GET /sessions/{id}/spend).
func (c *Client) SessionSpend(ctx context.Context, id string) (spend.SessionSpend, error) {
	return doAs[spend.SessionSpend](ctx, c, http.MethodGet, v1("sessions", id, "spend"), nil)
}

// Usage returns the spend ledger grouped by by (session, profile, agent, model, kind or day), from
// since (a date, an RFC 3339 time or a duration back; "" for all) (GET /usage).
func (c *Client) Usage(ctx context.Context, by, since string) ([]spend.UsageRow, error) {
	q := url.Values{"by": {by}}
	if since != "" {
		q.Set("since", since)
	}
	return doAs[[]spend.UsageRow](ctx, c, http.MethodGet, v1("usage")+"?"+q.Encode(), nil)
}

// Budgets returns every configured budget with its spend now (GET /budgets).
func (c *Client) Budgets(ctx context.Context) ([]spend.Status, error) {
	return doAs[[]spend.Status](ctx, c, http.MethodGet, v1("budgets"), nil)
}

// SetBudget sets a budget at run time (PUT /budgets/{id}).
func (c *Client) SetBudget(ctx context.Context, b spend.Budget) (spend.Status, error) {
	return doAs[spend.Status](ctx, c, http.MethodPut, v1("budgets", b.ID), b)
}

// RemoveBudget removes a budget set at run time (DELETE /budgets/{id}).
func (c *Client) RemoveBudget(ctx context.Context, id string) error {
	_, err := c.Do(ctx, http.MethodDelete, v1("budgets", id), nil, nil)
	return err
}

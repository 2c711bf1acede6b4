package turns

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/openclaw/cloudworkers/gateway/envs"
	"github.com/openclaw/cloudworkers/gateway/placement"
	"github.com/openclaw/cloudworkers/gateway/sessions"
	"github.com/openclaw/cloudworkers/internal/jsonbody"
	"github.com/openclaw/cloudworkers/providers"
)

// RemoveMode says what `session rm --force` does with the work of a session a worker holds.
type RemoveMode string

// The remove modes: none (refused while a worker holds the session), pull back its work first, or
// discard it. The environment is released in both forced modes.
const (
	RemoveRefuseHeld RemoveMode = ""
	RemovePullBack   RemoveMode = "pull-back"
	RemoveDiscard    RemoveMode = "discard"
)

// RemoveReport is the body of DELETE /sessions/:id: what the removal did.
type RemoveReport struct {
	SessionID string `json:"sessionId"`
	// CanceledTurn is set when a turn was running on the gateway and was canceled first.
	CanceledTurn bool `json:"canceledTurn,omitempty"`
	// PulledBack and Discarded say what happened to the work of a session a worker held.
	PulledBack bool `json:"pulledBack,omitempty"`
	Discarded  bool `json:"discarded,omitempty"`
	// EnvironmentID is the environment that served the session, released by the removal when it
	// served no other session; EnvironmentState is its state afterwards.
	EnvironmentID    string `json:"environmentId,omitempty"`
	EnvironmentState string `json:"environmentState,omitempty"`
	// Removed lists the files, worktrees and refs removed besides the session's rows; Kept what
	// stays (the branch openclaw/<name>, which holds the work that came back).
	Removed []string `json:"removed"`
	Kept    []string `json:"kept,omitempty"`
}

// RemoverEnvs is the environment manager as removal uses it; *envs.Manager implements it.
type RemoverEnvs interface {
	Get(ctx context.Context, id string) (envs.Environment, error)
	RequestDestroy(ctx context.Context, id string, force bool) (envs.Environment, error)
}

// RemoverConfig wires a Remover.
type RemoverConfig struct {
	Turns      *Service
	Dispatcher *placement.Dispatcher
	Envs       RemoverEnvs
	// AlsoDelete delete the rows other packages keep of a removed session (spawn options), in the
	// removal's transaction.
	AlsoDelete []func(ctx context.Context, tx *sql.Tx, sessionID string) error
	// PullBackWait bounds a forced removal's pull-back: the gateway's box.reconcileTimeout
	// (default 10 minutes); past it nothing is removed.
	PullBackWait time.Duration
}

// Remover removes and archives sessions: `session rm` and `session archive`.
type Remover struct{ cfg RemoverConfig }

// NewRemover returns a Remover.
func NewRemover(cfg RemoverConfig) *Remover {
	if cfg.PullBackWait == 0 {
		cfg.PullBackWait = 10 * time.Minute
	}
	return &Remover{cfg: cfg}
}

func conflict(format string, args ...any) error {
	return echo.NewHTTPError(http.StatusConflict, fmt.Sprintf(format, args...))
}

// held reports whether a worker holds the session's work: it is active on a worker, or its
// pull-back failed with the worker's results still on the box. A placement on its way (dispatch
// or pull-back under way) is refused with the reason.
func (r *Remover) held(ctx context.Context, id string, p placement.Placement) (bool, error) {
	switch p.State {
	case placement.Local, placement.Reclaimed:
		return false, nil
	case placement.Active:
		return true, nil
	case placement.Failed:
		return r.cfg.Turns.cfg.Placements.ResultsOnBox(ctx, p)
	}
	return false, conflict("session %s is %s (its placement is moving): remove it once it is active, local or failed", id, p.State)
}

// Remove removes a session: a turn running on the gateway is canceled first; a session a worker
// holds is refused unless mode says what to do with its work (pull it back first, or discard it;
// its environment is released either way). Its rows, transcript, anchor or managed worktree and
// refs/openclaw/* refs go; the branch openclaw/<name> stays (session prune removes it once merged).
func (r *Remover) Remove(ctx context.Context, id string, mode RemoveMode) (RemoveReport, error) {
	rep := RemoveReport{SessionID: id, Removed: []string{}}
	switch mode {
	case RemoveRefuseHeld, RemovePullBack, RemoveDiscard:
	default:
		return rep, providers.Fieldf("force", "must be %q or %q, got %.40q", RemovePullBack, RemoveDiscard, string(mode))
	}
	s := r.cfg.Turns
	sess, err := s.cfg.Sessions.Get(ctx, id)
	if err != nil {
		return rep, err
	}
	if kids, err := s.cfg.Sessions.ChildIDs(ctx, id); err != nil {
		return rep, err
	} else if len(kids) > 0 {
		return rep, conflict("session %s has %d child session(s) spawned by its agent (%s): remove them first", id, len(kids), strings.Join(kids, ", "))
	}
	p, err := s.cfg.Placements.Get(ctx, id)
	if err != nil {
		return rep, err
	}
	held, err := r.held(ctx, id, p)
	if err != nil {
		return rep, err
	}
	if held && mode == RemoveRefuseHeld {
		return rep, conflict("session %s is held by a worker (environment %s, placement %s): "+
			"`openclaw session rm %s --force --pull-back` brings its work home first, `--force --discard` drops it; the environment is released either way",
			id, p.EnvironmentID, p.State, id)
	}
	rep.EnvironmentID = p.EnvironmentID
	if s.Busy(id) {
		rep.CanceledTurn = true
		if err := s.CancelAndWait(ctx, id); err != nil {
			return rep, err
		}
	}
	if held {
		switch mode {
		case RemovePullBack:
			if err := r.pullBack(ctx, id); err != nil {
				return rep, err
			}
			rep.PulledBack = true
		case RemoveDiscard:
			// fence the worker: nothing it sends is accepted from now on
			if _, err := s.cfg.Sessions.AdvanceOwnerEpoch(ctx, id); err != nil {
				return rep, err
			}
			rep.Discarded = true
		}
	}
	if rep.EnvironmentID != "" {
		rep.EnvironmentState = r.release(ctx, id, rep.EnvironmentID, mode == RemoveDiscard)
	}
	if p, err = s.cfg.Placements.Get(ctx, id); err != nil {
		return rep, err
	}
	removed, kept, err := r.cfg.Dispatcher.RemoveFiles(ctx, sess, p)
	rep.Removed, rep.Kept = append(rep.Removed, removed...), kept
	if err != nil {
		return rep, fmt.Errorf("remove the files of session %s (the session is kept; run rm again once fixed): %w", id, err)
	}
	err = s.cfg.DB.InTx(ctx, func(tx *sql.Tx) error {
		dels := append([]func(context.Context, *sql.Tx, string) error{s.DeleteTx, s.cfg.Placements.DeleteTx}, r.cfg.AlsoDelete...)
		for _, del := range append(dels, s.cfg.Sessions.DeleteTx) {
			if err := del(ctx, tx, id); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return rep, err
	}
	s.cfg.Sessions.Forget(id)
	s.log.Info("session removed", "session", id, "pulledBack", rep.PulledBack, "discarded", rep.Discarded, "env", rep.EnvironmentID)
	return rep, nil
}

// pullBack brings a held session's work home and waits until its placement rests.
func (r *Remover) pullBack(ctx context.Context, id string) error {
	if _, err := r.cfg.Dispatcher.PullBack(ctx, id, false); err != nil {
		return fmt.Errorf("pull back session %s before removing it: %w", id, err)
	}
	wctx, cancel := context.WithTimeout(ctx, r.cfg.PullBackWait)
	defer cancel()
	ps := r.cfg.Turns.cfg.Placements
	var p placement.Placement
	err := ps.Await(wctx, id, 0, func() (bool, error) {
		var err error
		if p, err = ps.Get(wctx, id); err != nil {
			return false, err
		}
		switch p.State {
		case placement.Local:
			return true, nil
		case placement.Failed:
			return false, conflict("pull-back of session %s failed, nothing was removed: %s; pull back again (`openclaw session pullback %s`) or drop the work with `openclaw session rm %s --force --discard`",
				id, p.Error, id, id)
		}
		return false, nil
	})
	if err != nil && wctx.Err() != nil && errors.Is(err, wctx.Err()) {
		return fmt.Errorf("pull-back of session %s did not finish (it is %s), nothing was removed: %w", id, p.State, err)
	}
	return err
}

// release destroys the environment that served a removed session, unless it serves another one,
// and returns its state.
func (r *Remover) release(ctx context.Context, id, envID string, force bool) string {
	e, err := r.cfg.Envs.Get(ctx, envID)
	if err != nil {
		return "unknown: " + err.Error()
	}
	switch e.State {
	case envs.Destroyed, envs.Destroying, envs.Draining:
		return string(e.State)
	}
	if slices.ContainsFunc(e.AttachedSessionIDs, func(s string) bool { return s != id }) {
		return string(e.State) + " (kept: it serves " + strings.Join(e.AttachedSessionIDs, ", ") + ")"
	}
	got, err := r.cfg.Envs.RequestDestroy(ctx, envID, force || len(e.AttachedSessionIDs) > 0)
	if err != nil {
		r.cfg.Turns.log.Warn("release the environment of a removed session", "session", id, "env", envID, "err", err)
		return string(e.State) + " (release failed: " + err.Error() + "; `openclaw env destroy " + envID + "`)"
	}
	return string(got.State)
}

// Archive archives a session (hidden from session lists, read-only, its transcript kept), or
// unarchives it. A session a worker holds or that runs a turn is refused.
func (r *Remover) Archive(ctx context.Context, id string, archive bool) (sessions.Session, error) {
	s := r.cfg.Turns
	if !archive {
		return s.cfg.Sessions.SetArchived(ctx, id, false)
	}
	if _, err := s.cfg.Sessions.Get(ctx, id); err != nil {
		return sessions.Session{}, err
	}
	p, err := s.cfg.Placements.Get(ctx, id)
	if err != nil {
		return sessions.Session{}, err
	}
	if p.State.Remote() || p.State == placement.Failed {
		return sessions.Session{}, conflict("session %s is %s on a worker: bring it home first (`openclaw session pullback %s`, or `openclaw session move %s --local`)", id, p.State, id, id)
	}
	if s.Busy(id) {
		return sessions.Session{}, conflict("session %s: %v; wait for it to end, or stop it with: openclaw session cancel %s", id, placement.ErrBusy, id)
	}
	return s.cfg.Sessions.SetArchived(ctx, id, true)
}

// RegisterRemoveAPI adds DELETE /sessions/:id (?force=pull-back|discard), POST
// /sessions/:id/archive and POST /sessions/:id/unarchive.
func RegisterRemoveAPI(g *echo.Group, r *Remover) {
	g.DELETE("/sessions/:id", func(c echo.Context) error {
		rep, err := r.Remove(c.Request().Context(), c.Param("id"), RemoveMode(c.QueryParam("force")))
		if err != nil {
			return err
		}
		return c.JSON(http.StatusOK, rep)
	})
	for path, archive := range map[string]bool{"/sessions/:id/archive": true, "/sessions/:id/unarchive": false} {
		g.POST(path, func(c echo.Context) error {
			if err := decodeEmpty(c); err != nil {
				return err
			}
			ses, err := r.Archive(c.Request().Context(), c.Param("id"), archive)
			if err != nil {
				return err
			}
			return c.JSON(http.StatusOK, ses)
		})
	}
}

// ArchiveRequest is the (optional, empty) body of POST /sessions/:id/archive and /unarchive.
type ArchiveRequest struct{}

func decodeEmpty(c echo.Context) error {
	var req ArchiveRequest
	return jsonbody.DecodeOptional(c.Request().Body, &req)
}

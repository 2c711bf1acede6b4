package placement

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/openclaw/cloudworkers/gateway/envs"
	"github.com/openclaw/cloudworkers/providers"
)

// ErrPlacementFailed marks a message refused because the session's placement failed: a session
// asked for a worker never runs on the gateway unless the user moves it there (MoveLocal).
var ErrPlacementFailed = errors.New("the session's placement failed")

// PlacementFailedError refuses a message to a session whose placement failed, naming the failure
// and the recovery actions.
type PlacementFailedError struct {
	SessionID string
	ProfileID string
	// From is the step that failed (requested … starting: the dispatch; draining, reconciling:
	// the pull-back).
	From   State
	Reason string
	// Workspace is where the session would run on the gateway after `session move --local`.
	Workspace string
}

func (e *PlacementFailedError) Error() string {
	id := e.SessionID
	reason := e.Reason
	if reason == "" {
		reason = "no reason recorded"
	}
	if e.From.pullingBack() {
		// The reason carries its own recovery (pull back again, with --force for the brake).
		return fmt.Sprintf("session %s: its pull-back from the worker failed: %s. It does not run on the gateway until then; "+
			"`openclaw session move %s --local --force` abandons the worker's results and runs it on the gateway in %s", id, reason, id, e.Workspace)
	}
	profile := e.ProfileID
	if profile == "" {
		profile = "P"
	}
	return fmt.Sprintf("session %s: its dispatch to a worker of profile %s failed: %s. It does not run on the gateway unless you move it there: "+
		"run `openclaw session dispatch %s --profile %s` to try again, or `openclaw session move %s --local` to run it on the gateway in %s",
		id, profile, reason, id, profile, id, e.Workspace)
}

// Unwrap makes the error ErrPlacementFailed.
func (e *PlacementFailedError) Unwrap() error { return ErrPlacementFailed }

// pullingBack reports whether a failure in this step left the worker's results on the box.
func (s State) pullingBack() bool { return s == Draining || s == Reconciling }

// failedFrom returns the state the placement left for failed in its last transition.
func failedFrom(evs []Event) State {
	for i := len(evs) - 1; i >= 0; i-- {
		if ev := evs[i]; ev.From != ev.To && ev.To == Failed {
			return ev.From
		}
	}
	return ""
}

// homeWorkspace is where a session runs on the gateway once it is moved back: its workspace, or —
// when its last stint on a worker did not end in a completed pull-back (the worker was lost, or the
// pull-back failed) — the anchor, which holds the worker's work as of its last checkpoint.
func homeWorkspace(p Placement, evs []Event, workspace string) string {
	if p.AnchorDir == "" {
		return workspace
	}
	for i := len(evs) - 1; i >= 0; i-- {
		ev := evs[i]
		if ev.From == ev.To {
			continue
		}
		if ev.To == Local && ev.From == Reconciling {
			return workspace // pulled back: the workspace already is the anchor
		}
		if ev.To == Active {
			return p.AnchorDir
		}
	}
	return workspace
}

// FailedError describes the failed placement p of a session whose workspace is ws (a
// *PlacementFailedError naming the recovery actions).
func (ps *Placements) FailedError(ctx context.Context, p Placement, ws string) error {
	evs, err := ps.Events(ctx, p.SessionID)
	if err != nil {
		return err
	}
	return &PlacementFailedError{SessionID: p.SessionID, ProfileID: p.ProfileID, From: failedFrom(evs), Reason: p.Error,
		Workspace: homeWorkspace(p, evs, ws)}
}

// MoveLocal moves a session whose placement failed (or whose worker was lost) back to the gateway,
// explicitly, through the transition table: the only way such a session runs turns on the gateway.
// It runs in its workspace, or in the anchor when the anchor holds worker work the workspace lacks.
// A failed pull-back left the worker's results on the box: moving then abandons them and needs
// force. A session that is active on a worker is brought home with PullBack instead.
func (d *Dispatcher) MoveLocal(ctx context.Context, sessionID string, force bool) (Placement, error) {
	sess, err := d.cfg.Sessions.Get(ctx, sessionID)
	if err != nil {
		return Placement{}, err
	}
	p, err := d.cfg.Placements.Get(ctx, sessionID)
	if err != nil {
		return p, err
	}
	switch p.State {
	case Local:
		return p, nil
	case Failed, Reclaimed:
	case Active:
		return p, fmt.Errorf("session %s is active on a worker: bring it home with `openclaw session pullback %s`: %w", sessionID, sessionID, ErrStale)
	default:
		return p, fmt.Errorf("session %s is %s: move it once its placement rests: %w", sessionID, p.State, ErrStale)
	}
	if d.cfg.Busy != nil && d.cfg.Busy(sessionID) {
		return p, fmt.Errorf("session %s: %w; move it after it ends", sessionID, ErrBusy)
	}
	evs, err := d.cfg.Placements.Events(ctx, sessionID)
	if err != nil {
		return p, err
	}
	from := failedFrom(evs)
	abandoned := p.State == Failed && from.pullingBack()
	if abandoned && !force {
		return p, providers.Fieldf("force", "session %s: its pull-back failed and the worker's results are still on the box (environment %s): "+
			"pull back again (`openclaw session pullback %s`), or confirm that they are abandoned with --force", sessionID, p.EnvironmentID, sessionID)
	}
	ws := homeWorkspace(p, evs, sess.Workspace)
	if ws != sess.Workspace {
		if fi, err := os.Stat(ws); err != nil || !fi.IsDir() {
			return p, fmt.Errorf("session %s: the anchor %s that holds its worker's work is not a directory: %v", sessionID, ws, err)
		}
	}
	reason := "moved to the gateway by the user"
	switch {
	case abandoned:
		reason += " (--force: the worker's results on environment " + p.EnvironmentID + " are abandoned)"
	case p.State == Reclaimed:
		reason += " (the worker was lost)"
	}
	if ws != sess.Workspace {
		reason += "; runs in the anchor " + ws + ", which holds the worker's work as of its last checkpoint"
	}
	// The workspace is changed before the move is recorded, and the worker (if any still holds the
	// session) fenced in the move's transaction, so no turn can run on the gateway in the wrong
	// place or beside a worker.
	if ws != sess.Workspace {
		if err := d.cfg.Sessions.SetWorkspace(ctx, sessionID, ws); err != nil {
			return p, err
		}
	}
	move := Change{To: Local, Reason: reason, Idle: true}
	if sess.EnvironmentID != "" {
		move.Also = d.unbind(sessionID, "")
	}
	moved, err := d.cfg.Placements.Transition(ctx, sessionID, p.Generation, move)
	if err != nil {
		if ws != sess.Workspace {
			if rerr := d.cfg.Sessions.SetWorkspace(context.WithoutCancel(ctx), sessionID, sess.Workspace); rerr != nil {
				d.log.Warn("restore workspace after a refused move", "session", sessionID, "err", rerr)
			}
		}
		return p, err
	}
	if p.EnvironmentID != "" {
		if e, err := d.cfg.Envs.Get(ctx, p.EnvironmentID); err == nil && e.State == envs.Attached {
			if err := d.cfg.Envs.Detach(ctx, e.ID, sessionID); err != nil && !strings.Contains(err.Error(), "not attached") {
				d.log.Warn("detach environment", "env", e.ID, "session", sessionID, "err", err)
			}
		}
	}
	return moved, nil
}

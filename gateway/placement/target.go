package placement

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/openclaw/cloudworkers/gateway/envs"
	"github.com/openclaw/cloudworkers/gateway/sessions"
	"github.com/openclaw/cloudworkers/gateway/store"
	"github.com/openclaw/cloudworkers/providers"
)

// CheckTarget refuses a dispatch target before anything is written or leased: the profile must
// exist (the error wraps store.ErrNotFound otherwise) and the machine class must be one its
// provider has (a *providers.FieldError naming machineClass).
func (d *Dispatcher) CheckTarget(ctx context.Context, profileID, machineClass string) error {
	prof, err := d.cfg.Envs.Profile(ctx, profileID)
	if err != nil {
		return err
	}
	if machineClass != "" {
		if _, err := envs.WithClass(prof, machineClass); err != nil {
			return err
		}
	}
	return nil
}

// checkDispatch refuses to dispatch a session whose workspace is gone or was never a directory
// (moved or deleted since the session was created) before a machine is leased for it.
func (d *Dispatcher) checkDispatch(ctx context.Context, sessionID, profileID, machineClass string) error {
	sess, err := d.cfg.Sessions.Get(ctx, sessionID)
	if err != nil {
		return err
	}
	if sess.ArchivedAt != nil {
		return echo.NewHTTPError(http.StatusConflict, sessions.ArchivedError(sessionID).Error())
	}
	if sess.Workspace == "" {
		return echo.NewHTTPError(http.StatusConflict, fmt.Sprintf("session %s has no workspace to send to a worker", sessionID))
	}
	if err := d.cfg.Sessions.Roots().CheckStored("workspace", sess.Workspace); err != nil {
		return fmt.Errorf("session %s: %w", sessionID, err)
	}
	if err := sessions.CheckWorkspace(ctx, sess.Workspace, false); err != nil {
		return fmt.Errorf("session %s: %w", sessionID, err)
	}
	err = d.CheckTarget(ctx, profileID, machineClass)
	if errors.Is(err, store.ErrNotFound) {
		return providers.Fieldf("profileId", "no profile %q (see `openclaw profile list`)", profileID)
	}
	return err
}

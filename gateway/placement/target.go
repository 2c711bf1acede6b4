package placement

import (
	"context"
	"fmt"

	"github.com/openclaw/cloudworkers/gateway/envs"
	"github.com/openclaw/cloudworkers/gateway/sessions"
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
	if sess.Workspace == "" {
		return fmt.Errorf("session %s has no workspace to send to a worker", sessionID)
	}
	if err := sessions.CheckWorkspace(ctx, sess.Workspace, false); err != nil {
		return fmt.Errorf("session %s: %w", sessionID, err)
	}
	return d.CheckTarget(ctx, profileID, machineClass)
}

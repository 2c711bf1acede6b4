package turns

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/openclaw/cloudworkers/gateway/sessions"
	"github.com/openclaw/cloudworkers/protocol"
)

// turnStartTimeout bounds the wait for a worker to acknowledge worker.turn.start.
const turnStartTimeout = 30 * time.Second

// workerGoneGrace fails a worker turn whose worker stays disconnected this long: a tunnel drop the
// worker recovers from does not fail the turn, a dead box does.
const workerGoneGrace = 2 * time.Minute

// startOnWorker hands an admitted turn to the session's worker (worker.turn.start) and follows its
// lifecycle events to record the outcome. release ends the turn's admission.
func (s *Service) startOnWorker(ctx, tctx context.Context, sess sessions.Session, t Turn, text string, release func()) error {
	// Follow the session's live events from the admission cursor before the worker can publish any.
	sub, err := s.cfg.Sessions.Subscribe(ctx, sess.ID, t.Cursor)
	if err != nil {
		s.finish(t, TurnFailed, err.Error())
		release()
		return err
	}
	rctx, cancel := context.WithTimeout(ctx, turnStartTimeout)
	_, err = s.cfg.Workers.Request(rctx, sess.EnvironmentID, protocol.MethodTurnStart, protocol.TurnStartParams{
		SessionID: sess.ID, OwnerEpoch: sess.OwnerEpoch, RunEpoch: t.RunEpoch, RunID: t.RunID, ModelRef: t.Model,
		Text: text, Workspace: sess.Workspace, GatewayTools: s.gatewayToolSchemas()})
	cancel()
	if err != nil {
		sub.Close()
		err = fmt.Errorf("start turn on the worker of %s: %w", sess.EnvironmentID, err)
		s.finish(t, TurnFailed, err.Error())
		release()
		return err
	}
	s.mu.Lock()
	// Cancel of a worker turn asks the worker; the outcome still arrives as a lifecycle event.
	s.running[sess.ID] = func() {
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			cctx, cancel := context.WithTimeout(s.ctx, 10*time.Second)
			defer cancel()
			if _, err := s.cfg.Workers.Request(cctx, sess.EnvironmentID, protocol.MethodTurnCancel,
				protocol.TurnCancelParams{SessionID: sess.ID, RunID: t.RunID}); err != nil {
				s.log.Warn("cancel worker turn", "session", sess.ID, "run", t.RunID, "err", err)
			}
		}()
	}
	s.mu.Unlock()
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer release()
		status, msg := s.follow(tctx, sub, t, sess.EnvironmentID)
		if status == "" {
			return // the gateway is stopping; the next start marks the turn failed
		}
		// The session is free before its turn reads as ended (the checkpoint claims it itself).
		release()
		s.finish(t, status, msg)
		if s.cfg.AfterWorkerTurn != nil {
			s.cfg.AfterWorkerTurn(sess.ID)
		}
	}()
	return nil
}

// follow waits for the run's lifecycle_end or lifecycle_error, resubscribing after a lag.
func (s *Service) follow(ctx context.Context, sub *sessions.Subscription[*sessions.LiveRecord], t Turn, envID string) (status TurnStatus, msg string) {
	cursor := t.Cursor
	defer func() { sub.Close() }()
	tick := time.NewTicker(workerGoneGrace / 8)
	defer tick.Stop()
	var goneSince time.Time
	for {
		select {
		case <-ctx.Done():
			return "", ""
		case now := <-tick.C:
			switch {
			case s.cfg.Workers.Admitted(envID):
				goneSince = time.Time{}
			case goneSince.IsZero():
				goneSince = now
			case now.Sub(goneSince) >= workerGoneGrace:
				return TurnFailed, "the worker of " + envID + " disconnected during the turn; send the message again to retry"
			}
		case r, ok := <-sub.C():
			if !ok {
				if !errors.Is(sub.Err(), sessions.ErrLagged) {
					return "", ""
				}
				next, err := s.cfg.Sessions.Subscribe(ctx, t.SessionID, cursor)
				if err != nil {
					return TurnFailed, "lost the turn's live events: " + err.Error()
				}
				sub = next
				continue
			}
			cursor = r.Cursor
			if r.RunID != t.RunID {
				continue
			}
			switch r.Event.Type {
			case protocol.LiveLifecycleEnd:
				return TurnDone, ""
			case protocol.LiveLifecycleError:
				if strings.HasSuffix(r.Event.Error, context.Canceled.Error()) {
					return TurnCanceled, "canceled"
				}
				return TurnFailed, r.Event.Error
			}
		}
	}
}

// finish records a turn's outcome: its move from running to status, with its event row.
func (s *Service) finish(t Turn, status TurnStatus, msg string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.cfg.DB.InTx(ctx, func(tx *sql.Tx) error {
		return transitionTurn(ctx, tx, s.clock().Now(), t.RunID, TurnRunning, status, msg)
	}); err != nil {
		s.log.Error("record turn outcome", "run", t.RunID, "err", err)
		return
	}
	s.metrics.finished.WithLabelValues(t.Placement, string(status)).Inc()
	if status == TurnFailed {
		s.log.Warn("turn failed", "session", t.SessionID, "run", t.RunID, "placement", t.Placement, "err", msg)
		return
	}
	s.log.Info("turn finished", "session", t.SessionID, "run", t.RunID, "placement", t.Placement, "status", status)
}

// gatewayToolSchemas are the schemas of the gateway-resident tools offered to worker turns.
func (s *Service) gatewayToolSchemas() []protocol.Tool {
	var out []protocol.Tool
	for _, t := range s.cfg.ExtraTools {
		out = append(out, t.Schema())
	}
	return out
}

package turns

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/openclaw/cloudworkers/gateway/envs"
	"github.com/openclaw/cloudworkers/gateway/sessions"
	"github.com/openclaw/cloudworkers/internal/backoff"
	"github.com/openclaw/cloudworkers/internal/clock"
	"github.com/openclaw/cloudworkers/protocol"
	"github.com/openclaw/cloudworkers/worker/tools"
)

// turnStartTimeout bounds the wait for a worker to acknowledge worker.turn.start.
const turnStartTimeout = 30 * time.Second

// workerGoneGrace fails a worker turn whose worker stays disconnected this long: a tunnel drop the
// worker recovers from does not fail the turn, a dead box does.
const workerGoneGrace = 2 * time.Minute

// startOnWorker hands an admitted turn to the session's worker (worker.turn.start) and follows its
// lifecycle events to record the outcome. release ends the turn's admission.
func (s *Service) startOnWorker(ctx, tctx context.Context, sess sessions.Session, t Turn, text string, cont bool, release func()) error {
	// Follow the session's live events from the admission cursor before the worker can publish any.
	sub, err := s.cfg.Sessions.Subscribe(ctx, sess.ID, t.Cursor)
	if err != nil {
		s.finish(t, TurnFailed, err.Error())
		release()
		return err
	}
	// A cancel that arrives before the worker acknowledged the start is recorded here and sent
	// once it has (the worker cannot cancel a run it has not started). One that came between
	// admission and this point has already cancelled tctx.
	s.mu.Lock()
	requested := tctx.Err() != nil && s.ctx.Err() == nil
	s.running[sess.ID] = func() { requested = true }
	s.mu.Unlock()
	rctx, cancel := context.WithTimeout(ctx, turnStartTimeout)
	start := protocol.TurnStartParams{SessionID: sess.ID, OwnerEpoch: sess.OwnerEpoch, RunEpoch: t.RunEpoch, RunID: t.RunID,
		ModelRef: t.Model, Text: text, Continue: cont, Workspace: sess.Workspace, GatewayTools: s.gatewayToolSchemas(ctx)}
	for {
		_, err = s.cfg.Workers.Request(rctx, sess.EnvironmentID, protocol.MethodTurnStart, start)
		// A worker still ending a run of an earlier owner (fenced: its next commit or model call is
		// refused, which ends it) answers busy, retryable: the start is sent again, within the wait.
		var perr *protocol.Error
		if err == nil || !errors.As(err, &perr) || perr.Code != protocol.CodeBusy || !perr.Retryable {
			break
		}
		if clock.Sleep(rctx, s.clock(), min(max(time.Duration(perr.RetryAfterMs)*time.Millisecond, 100*time.Millisecond), 2*time.Second)) != nil {
			break
		}
	}
	cancel()
	if err != nil {
		sub.Close()
		err = fmt.Errorf("start turn on the worker of %s: %w", sess.EnvironmentID, err)
		s.mu.Lock()
		cancelled := requested || ctx.Err() != nil
		s.mu.Unlock()
		if cancelled {
			// Cancelled while the start was in flight: the worker may have started the run before
			// the wait ended, so it is asked to cancel it too (bounded).
			s.finish(t, TurnCanceled, "canceled")
			release()
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				cctx, cancel := context.WithTimeout(s.ctx, cancelDeliveryWait)
				defer cancel()
				s.cancelOnWorker(cctx, sess.EnvironmentID, sess.ID, t.RunID)
			}()
			return err
		}
		s.finish(t, TurnFailed, err.Error())
		release()
		return err
	}
	// The turn is followed on a context of its own: tctx may already be cancelled by a cancel that
	// came during the start, and the turn must still be seen to its end.
	fctx, stopFollow := context.WithCancel(s.ctx)
	s.mu.Lock()
	// Cancel of a worker turn asks the worker, until it has answered; the outcome still arrives as
	// a lifecycle event.
	var once sync.Once
	notRunning := make(chan struct{}, 1) // the worker answered the cancel: it does not run the turn
	cancelTurn := func() {
		once.Do(func() {
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				if s.cancelOnWorker(fctx, sess.EnvironmentID, sess.ID, t.RunID) {
					notRunning <- struct{}{}
				}
			}()
		})
	}
	s.running[sess.ID] = cancelTurn
	if requested {
		cancelTurn()
	}
	s.mu.Unlock()
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer release()
		defer stopFollow()
		status, msg := s.follow(fctx, sub, t, sess.EnvironmentID, notRunning)
		if status == "" {
			return // the gateway is stopping; the next start marks the turn failed
		}
		s.settleTurn(t, status, msg, release)
		if s.cfg.AfterWorkerTurn != nil && status != TurnMoving {
			s.cfg.AfterWorkerTurn(sess.ID)
		}
	}()
	return nil
}

// cancelOnWorker asks envID's worker to cancel the run until the worker has answered, the turn
// has ended (ctx ends with it) or the gateway stops. A cancel sent while the worker's connection is
// being replaced fails; it is sent again, with backoff, once the worker is admitted again.
// It reports whether the worker answered that it does not run the turn (a relaunched worker lost
// it): no end event will come from it.
func (s *Service) cancelOnWorker(ctx context.Context, envID, sessionID, runID string) (notRunning bool) {
	bo := backoff.Backoff{Min: cancelRetryMin, Max: cancelRetryMax, Clock: s.cfg.Clock}
	for attempt := 1; ; attempt++ {
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		raw, err := s.cfg.Workers.Request(rctx, envID, protocol.MethodTurnCancel,
			protocol.TurnCancelParams{SessionID: sessionID, RunID: runID})
		cancel()
		var perr *protocol.Error
		switch {
		case err == nil:
			if attempt > 1 {
				s.log.Info("worker turn cancel delivered", "session", sessionID, "run", runID, "attempt", attempt)
			}
			var res struct {
				Canceled *bool `json:"canceled"`
			}
			return json.Unmarshal(raw, &res) == nil && res.Canceled != nil && !*res.Canceled
		case errors.As(err, &perr) && !perr.Retryable:
			s.log.Warn("cancel worker turn refused", "session", sessionID, "run", runID, "err", err)
			return false
		}
		if ctx.Err() != nil {
			return false
		}
		s.log.Warn("cancel worker turn; sending it again", "session", sessionID, "run", runID, "attempt", attempt, "err", err)
		if bo.Wait(ctx) != nil {
			return false
		}
	}
}

// The delays between attempts at delivering a turn's cancel to its worker.
const (
	cancelRetryMin = 200 * time.Millisecond
	cancelRetryMax = 5 * time.Second
	// cancelDeliveryWait bounds the attempts at cancelling a run whose start was abandoned.
	cancelDeliveryWait = 30 * time.Second
)

// follow waits for the run's lifecycle_end or lifecycle_error, resubscribing after a lag.
func (s *Service) follow(ctx context.Context, sub *sessions.Subscription[*sessions.LiveRecord], t Turn, envID string, notRunning <-chan struct{}) (status TurnStatus, msg string) {
	cursor := t.Cursor
	defer func() { sub.Close() }()
	// The worker's departures come from the hub's admission changes: gone, a grace timer starts;
	// back before it fires, the timer stops.
	grace := s.cfg.WorkerGoneGrace
	if grace <= 0 {
		grace = workerGoneGrace
	}
	var gone clock.Timer
	var graceC <-chan time.Time
	defer func() {
		if gone != nil {
			gone.Stop()
		}
	}()
	changed := s.cfg.Workers.AdmissionChanged()
	// A worker that comes back may be a relaunched one, which lost the run: it is asked, and a
	// run it no longer has fails the turn once its end event has had lostEndWait to arrive (a
	// worker holds a run until its end is acknowledged, so an end that was sent is not missed).
	answers := make(chan bool, 1)
	canceled := false
	var lost clock.Timer
	var lostC <-chan time.Time
	defer func() {
		if lost != nil {
			lost.Stop()
		}
	}()
	check := func() {
		switch admitted := s.cfg.Workers.Admitted(envID); {
		case admitted && gone != nil:
			gone.Stop()
			gone, graceC = nil, nil
		case !admitted && gone == nil:
			gone = s.clock().NewTimer(grace)
			graceC = gone.C()
		}
	}
	check()
	for {
		select {
		case <-ctx.Done():
			return "", ""
		case <-changed:
			changed = s.cfg.Workers.AdmissionChanged()
			back := gone != nil && s.cfg.Workers.Admitted(envID)
			check()
			if back {
				s.askRunning(ctx, envID, t, answers)
			}
		case running := <-answers:
			if !running && lost == nil {
				lost = s.clock().NewTimer(lostEndWait)
				lostC = lost.C()
			}
		case <-notRunning:
			// canceled, and the worker does not have the run: its end event, if it sent one, has
			// lostEndWait to arrive
			canceled = true
			if lost == nil {
				lost = s.clock().NewTimer(lostEndWait)
				lostC = lost.C()
			}
		case <-lostC:
			if canceled {
				return TurnCanceled, "canceled (its worker no longer ran it)"
			}
			return TurnFailed, "the worker of " + envID + " was restarted during the turn and lost its run; the transcript holds every step it committed: send the message again to carry on"
		case <-graceC:
			if !s.cfg.Workers.Admitted(envID) {
				return TurnFailed, "the worker of " + envID + " disconnected during the turn; send the message again to retry"
			}
			gone, graceC = nil, nil
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
			case protocol.LiveLifecycleYield:
				if !s.yieldGranted(t.SessionID, t.RunID) {
					// no live move asked it: a worker cannot park a turn where nothing goes on with it
					return TurnFailed, "the worker stopped the run for a move nobody asked for; send the message again to carry on"
				}
				return TurnMoving, ""
			case protocol.LiveLifecycleError:
				if strings.HasSuffix(r.Event.Error, context.Canceled.Error()) {
					return TurnCanceled, "canceled"
				}
				// the worker's words go to the turn's row, its event and the log: printable and bounded
				return TurnFailed, envs.Sanitize(r.Event.Error)
			}
		}
	}
}

// settleTurn records how a turn's run ended and frees its session. An ended turn frees the session
// first: whoever sees the outcome may send the next message (or dispatch) at once, without a busy
// refusal (a checkpoint claims the session itself). A moving turn is recorded first: the live
// move that waits for the session to be free then finds it moving, to go on with it.
func (s *Service) settleTurn(t Turn, status TurnStatus, msg string, release func()) {
	if status == TurnMoving {
		s.finish(t, status, msg)
		release()
		return
	}
	release()
	s.finish(t, status, msg)
}

// lostEndWait is how long a turn whose worker came back without its run waits for the run's end
// event before it fails.
const lostEndWait = 5 * time.Second

// askRunning asks envID's worker, in the background and bounded, whether it still runs t's run,
// and sends the answer (none when the worker cannot be asked: the next return asks again).
func (s *Service) askRunning(ctx context.Context, envID string, t Turn, answers chan<- bool) {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		raw, err := s.cfg.Workers.Request(rctx, envID, protocol.MethodTurnStatus, protocol.TurnCancelParams{SessionID: t.SessionID, RunID: t.RunID})
		var res protocol.TurnStatusResult
		if err != nil || json.Unmarshal(raw, &res) != nil {
			return
		}
		select {
		case answers <- res.Running:
		default:
		}
	}()
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
	if status == TurnMoving {
		s.log.Info("turn stopped at a model call for a live move", "session", t.SessionID, "run", t.RunID, "placement", t.Placement)
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
func (s *Service) gatewayToolSchemas(ctx context.Context) []protocol.Tool {
	var out []protocol.Tool
	for _, t := range s.offeredTools(ctx) {
		out = append(out, t.Schema())
	}
	return out
}

// offeredTools are the gateway-resident tools a turn is offered now: the spawn tools only while a
// worker profile exists.
func (s *Service) offeredTools(ctx context.Context) []tools.Tool {
	if len(s.cfg.SpawnTools) == 0 || s.cfg.WorkerProfiles == nil || !s.cfg.WorkerProfiles(ctx) {
		return s.cfg.ExtraTools
	}
	return append(slices.Clone(s.cfg.ExtraTools), s.cfg.SpawnTools...)
}

package placement

import (
	"context"
	"fmt"
	"time"

	"github.com/openclaw/cloudworkers/internal/clock"
	"github.com/openclaw/cloudworkers/providers"
)

// BusyPolicy says what a move does with a session whose turn runs.
type BusyPolicy string

// Busy policies.
const (
	// BusyDrain (the default) waits for the turn to end, up to DispatchConfig.DrainTimeout.
	BusyDrain BusyPolicy = "drain"
	// BusyCancel stops the turn at its next safe point (a model call or a tool's end) and waits
	// for its end.
	BusyCancel BusyPolicy = "cancel"
	// BusyLive stops the turn at its next model call (after its tool results are committed) and
	// goes on with the same turn on the session's next owner, from the transcript, without new
	// user input (a live move). A turn that ends before its next model call simply ends.
	BusyLive BusyPolicy = "live"
)

// ParseBusyPolicy checks a policy given in a request ("" is drain); field names it in the error.
func ParseBusyPolicy(field, s string) (BusyPolicy, error) {
	switch BusyPolicy(s) {
	case "", BusyDrain:
		return BusyDrain, nil
	case BusyCancel:
		return BusyCancel, nil
	case BusyLive:
		return BusyLive, nil
	}
	return "", providers.Fieldf(field, "must be drain (wait for the running turn to end), cancel (stop it) or live (stop it at its next model call and go on with it after the move), got %q", s)
}

// settled says how the barrier's step 2 ended the session's running turn.
type settled struct {
	ran     bool
	how     string
	elapsed time.Duration
}

func (s settled) String() string {
	if !s.ran {
		return "no turn was running"
	}
	return fmt.Sprintf("the running turn %s in %s", s.how, s.elapsed.Round(time.Millisecond))
}

// settle is step 2 of the barrier: it ends the session's running turn by policy. A drain that
// outlasts DrainTimeout gives up (the caller decides: a dispatch is refused, a pull-back cancels).
func (d *Dispatcher) settle(ctx context.Context, sessionID string, policy BusyPolicy) (settled, error) {
	clk := clock.Or(d.cfg.Clock)
	start := clk.Now()
	busy := func() bool { return d.cfg.Busy != nil && d.cfg.Busy(sessionID) }
	if !busy() {
		return settled{}, nil
	}
	out := settled{ran: true, how: "ended (drained)"}
	if policy == BusyLive && d.cfg.YieldTurn != nil {
		if runID := d.cfg.YieldTurn(sessionID); runID != "" {
			err := d.waitIdle(ctx, sessionID, d.cfg.drainTimeout())
			out.how, out.elapsed = "stopped at a model-call boundary to go on after the move, or ended before one (policy live)", clk.Now().Sub(start)
			if err == nil {
				return out, nil
			}
			// not stopped in time: the run goes on where it is. One whose model call was just
			// answered run-yield ends in a moment, moving: once it has (bounded), the refused move
			// is told to the turns, which go on with it where it is.
			if d.cfg.Unyield != nil {
				d.cfg.Unyield(sessionID, runID)
			}
			if ctx.Err() == nil {
				_ = d.waitIdle(ctx, sessionID, yieldSettleWait)
			}
			d.afterMove(sessionID)
			if ctx.Err() != nil {
				return out, ctx.Err()
			}
			return out, fmt.Errorf("session %s: the running turn made no model call within placement.drainTimeout (%s) to stop at: %w",
				sessionID, d.cfg.drainTimeout(), ErrBusy)
		}
	}
	if policy == BusyCancel {
		err := d.cancelAndWait(ctx, sessionID)
		out.how, out.elapsed = "was canceled (policy cancel)", clk.Now().Sub(start)
		return out, err
	}
	if err := d.waitIdle(ctx, sessionID, d.cfg.drainTimeout()); err != nil {
		out.elapsed = clk.Now().Sub(start)
		if ctx.Err() != nil {
			return out, ctx.Err()
		}
		return out, fmt.Errorf("session %s: the running turn did not end within placement.drainTimeout (%s): %w",
			sessionID, d.cfg.drainTimeout(), ErrBusy)
	}
	out.elapsed = clk.Now().Sub(start)
	return out, nil
}

// yieldSettleWait bounds how long a live move that gave up waits for a run that may have stopped
// at that moment to record that it did.
const yieldSettleWait = 30 * time.Second

// cancelWait bounds the wait for a canceled turn to record its end (a worker's turn ends when its
// cancel reaches the worker and the worker's end event comes back).
const cancelWait = time.Minute

// cancelAndWait cancels the session's running turn and waits until no turn holds the session, so
// that the turn's end is recorded before the barrier fences its worker.
func (d *Dispatcher) cancelAndWait(ctx context.Context, sessionID string) error {
	if err := d.cancelTurn(ctx, sessionID); err != nil {
		return err
	}
	if err := d.waitIdle(ctx, sessionID, cancelWait); err != nil && ctx.Err() == nil {
		// the turn's worker does not answer: fencing it (step 6) ends what is left of the turn
		d.cfg.Placements.Note(ctx, sessionID, fmt.Sprintf("the canceled turn did not record its end within %s; its worker is fenced", cancelWait))
	}
	return ctx.Err()
}

// waitIdle waits until no turn holds the session, at most limit.
func (d *Dispatcher) waitIdle(ctx context.Context, sessionID string, limit time.Duration) error {
	wait, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	// a turn's end releases its claim (a change); the poll covers a local turn's own record
	return d.cfg.Placements.Await(wait, sessionID, pollInterval, func() (bool, error) {
		return d.cfg.Busy == nil || !d.cfg.Busy(sessionID), nil
	})
}

func (d *Dispatcher) cancelTurn(ctx context.Context, sessionID string) error {
	if d.cfg.CancelTurn == nil {
		return fmt.Errorf("session %s: %w (this gateway cannot cancel it)", sessionID, ErrBusy)
	}
	if err := d.cfg.CancelTurn(ctx, sessionID); err != nil {
		return fmt.Errorf("cancel the running turn of session %s: %w", sessionID, err)
	}
	return nil
}

// WaitIdle readies a session with a running turn for a dispatch by policy: drain waits for the
// turn to end (placement.drainTimeout, then busy), cancel stops it. The step is recorded in the
// placement's timeline when a turn ran.
func (d *Dispatcher) WaitIdle(ctx context.Context, sessionID string, policy BusyPolicy) error {
	s, err := d.settle(ctx, sessionID, policy)
	if err != nil {
		if s.ran {
			d.cfg.Placements.Note(ctx, sessionID, "dispatch waited for the running turn: "+err.Error())
		}
		return err
	}
	if s.ran {
		d.cfg.Placements.Note(ctx, sessionID, "before the dispatch: "+s.String())
	}
	return nil
}

// setBusyPolicy holds a pull-back's policy for its drain step (in memory: a drain resumed after a
// restart drains).
func (d *Dispatcher) setBusyPolicy(sessionID string, p BusyPolicy) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.busyPolicy.set(sessionID, p)
}

func (d *Dispatcher) takeBusyPolicy(sessionID string) BusyPolicy {
	d.mu.Lock()
	defer d.mu.Unlock()
	p := d.busyPolicy.take(sessionID)
	if p == "" {
		return BusyDrain
	}
	return p
}

// drain passes barrier steps 2–6, each recorded in the placement's timeline: end the running turn
// by the pull-back's policy (a drain that outlasts placement.drainTimeout cancels it); from then
// no run holds the session, so any call of the old run is refused (3); its transcript commits and
// live events were delivered before its end was (4); its end stopped every process it started
// (5, see worker/tools); then advance the owner epoch so the worker is fenced (6).
func (d *Dispatcher) drain(ctx context.Context, p Placement) (Change, error) {
	policy := d.takeBusyPolicy(p.SessionID)
	s, err := d.settle(ctx, p.SessionID, policy)
	if err != nil && ctx.Err() == nil && s.ran {
		d.cfg.Placements.Note(ctx, p.SessionID, "barrier step 2: "+err.Error()+"; canceling it")
		start := clock.Or(d.cfg.Clock).Now()
		if err = d.cancelAndWait(ctx, p.SessionID); err == nil {
			s = settled{ran: true, how: "was canceled (the drain timed out)", elapsed: clock.Or(d.cfg.Clock).Now().Sub(start) + s.elapsed}
		}
	}
	if err != nil {
		return Change{}, err
	}
	note := func(step int, what string) {
		d.cfg.Placements.Note(ctx, p.SessionID, fmt.Sprintf("barrier step %d: %s", step, what))
	}
	note(2, s.String())
	note(3, "no run holds the session: a tool or model call of an ended run is refused")
	note(4, "the run's transcript commits and live events were delivered before its end")
	note(5, "the run's end stops every process it started, detached ones included ("+d.lastStopped(ctx, p.SessionID)+")")
	step := 6
	return Change{To: Reconciling, BarrierStep: &step, Also: d.unbind(p.SessionID, "drained; worker fenced (owner epoch %d)")}, nil
}

// lastStopped says what the last run's end event reported it stopped.
func (d *Dispatcher) lastStopped(ctx context.Context, sessionID string) string {
	if d.cfg.Sessions == nil {
		return "no run reported"
	}
	ev, ok, err := d.cfg.Sessions.LastRunEnd(ctx, sessionID)
	switch {
	case err != nil || !ok:
		return "no run end on record"
	case ev.StoppedProcesses == 1:
		return "the last run's end reported 1 process stopped"
	}
	return fmt.Sprintf("the last run's end reported %d processes stopped", ev.StoppedProcesses)
}

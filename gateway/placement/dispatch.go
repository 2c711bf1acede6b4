package placement

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/openclaw/cloudworkers/gateway/bootstrap"
	"github.com/openclaw/cloudworkers/gateway/envs"
	"github.com/openclaw/cloudworkers/gateway/sessions"
	"github.com/openclaw/cloudworkers/gateway/store"
	"github.com/openclaw/cloudworkers/internal/clock"
	"github.com/openclaw/cloudworkers/internal/shutdown"
	"github.com/openclaw/cloudworkers/sync/gitsync"
	"github.com/openclaw/cloudworkers/sync/secretscan"
	"github.com/openclaw/cloudworkers/sync/stream"
)

// DispatchConfig configures a Dispatcher.
type DispatchConfig struct {
	Placements *Placements
	Sessions   *sessions.Store
	Envs       *envs.Manager
	Boot       *bootstrap.Bootstrapper
	// Admitted reports whether an environment's worker is admitted.
	Admitted func(envID string) bool
	// Busy reports whether a session has a turn in flight (turn admission owns that fact).
	Busy func(sessionID string) bool
	// CancelTurn cancels the session's running turn and waits for its end (the cancel policy,
	// and a drain that timed out during a pull-back).
	CancelTurn func(ctx context.Context, sessionID string) error
	// YieldTurn asks the session's running turn to stop at its next model call (the live
	// policy) and returns its run id ("" when none runs); Unyield withdraws that of a move that
	// did not happen. AfterMove is told when a move of the session rests (or was refused), so a
	// turn a live move stopped goes on there. nil: no live moves.
	YieldTurn func(sessionID string) string
	Unyield   func(sessionID, runID string)
	AfterMove func(sessionID string)
	// DrainTimeout bounds the drain policy's wait for a running turn (0: DefaultDrainTimeout).
	DrainTimeout time.Duration
	// ReclaimInterval is how often active placements are checked for a lost worker (default 2s);
	// ReclaimGrace is how long a worker may stay unreachable before its session is reclaimed
	// (default 2m).
	ReclaimInterval, ReclaimGrace time.Duration
	DataDir                       string
	Log                           *slog.Logger
	// Compression encodes workspace syncs to boxes (stream.CompressAuto when empty); Channels is
	// how many SSH channels a cold sync of a large workspace uses (0: stream.DefaultChannels).
	Compression stream.Compression
	Channels    int
	// ReserveFreeBytes and ReserveFreePercent: what a pull-back leaves free on the anchor's and
	// the data directory's filesystems, the larger of the two (0: stream.DefaultReserveBytes,
	// stream.DefaultReservePercent).
	ReserveFreeBytes   int64
	ReserveFreePercent float64
	// CheckpointKeep is how many of a session's newest checkpoints are kept (0:
	// checkpoint.DefaultKeep); older ones are pruned after each checkpoint.
	CheckpointKeep int
	// SyncTimeout bounds one sync out to a box (default 30m); ReconcileTimeout bounds one
	// pull-back or checkpoint from a box (default 10m). A step past its deadline fails the
	// placement with a recovery action instead of holding it.
	SyncTimeout, ReconcileTimeout time.Duration
	// SnapshotAuthor signs the commit that carries a git checkout's uncommitted work at dispatch
	// (gitsync.DefaultIdentity when empty).
	SnapshotAuthor gitsync.Identity
	// Secrets returns the credential values the gateway holds (name → value), which the secret
	// scan of every pull-back and checkpoint looks for; nil: none (the patterns still apply).
	Secrets func(ctx context.Context) (map[string]string, error)
	// MaxAllowedSecrets bounds the secret scan's false positives let through for one session
	// (default DefaultMaxAllowedSecrets).
	MaxAllowedSecrets int
	// Clock paces the dispatcher's polls (a worker's admission, a turn's end); the real clock
	// when nil.
	Clock clock.Clock
	// GitAuthor is the identity of the worker's commits in box repositories (config git.author),
	// unless the profile names one; zero: none is set.
	GitAuthor gitsync.Identity
	// CheckpointWait bounds how long a pull-back waits for a running checkpoint before it answers
	// that the session is busy (0: DefaultCheckpointWait).
	CheckpointWait time.Duration
	// StartAdmitWait bounds how long the start step waits for the environment's worker to be
	// admitted (0: DefaultStartAdmitWait).
	StartAdmitWait time.Duration
	// PoolCap bounds the machines the prepared pools hold unassigned, gateway-wide (nil:
	// DefaultPoolCap; 0 drains the pools: none is leased for them).
	PoolCap *int
	// Reserved reports environments that are never handed out as a warm lease (an OCC revision's
	// environment: only DispatchToEnvironment places a session on it); nil: none.
	Reserved func(envs.Environment) bool
}

// Defaults of DispatchConfig.
const (
	DefaultCheckpointWait = 2 * time.Minute
	// DefaultDrainTimeout is DispatchConfig.DrainTimeout's default.
	DefaultDrainTimeout   = 10 * time.Minute
	DefaultStartAdmitWait = time.Minute
)

func (c *DispatchConfig) drainTimeout() time.Duration {
	return orDefault(c.DrainTimeout, DefaultDrainTimeout)
}
func (c *DispatchConfig) checkpointWait() time.Duration {
	return orDefault(c.CheckpointWait, DefaultCheckpointWait)
}
func (c *DispatchConfig) startAdmitWait() time.Duration {
	return orDefault(c.StartAdmitWait, DefaultStartAdmitWait)
}

func orDefault(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}

// StepTimeoutError is a placement step that passed its deadline because the box did not answer
// in time.
type StepTimeoutError struct {
	Step    string        // "sync" or "reconcile"
	Setting string        // the config setting that bounds it
	Timeout time.Duration // its value
}

func (e *StepTimeoutError) Error() string {
	return fmt.Sprintf("%s did not finish within %s (%s): the box did not answer in time", e.Step, e.Timeout, e.Setting)
}

// withStepDeadline bounds ctx by a step's timeout; the returned wrap turns an error that the
// deadline caused into its *StepTimeoutError.
func withStepDeadline(ctx context.Context, te *StepTimeoutError) (context.Context, context.CancelFunc, func(error) error) {
	sctx, cancel := context.WithTimeoutCause(ctx, te.Timeout, te)
	wrap := func(err error) error {
		if err != nil && ctx.Err() == nil && errors.Is(context.Cause(sctx), te) {
			return fmt.Errorf("%w (last error: %v)", te, err)
		}
		return err
	}
	return sctx, cancel, wrap
}

// Dispatcher moves sessions between the gateway and workers: dispatch (local → … → active) and
// pull-back (active → draining → reconciling → local). Every step is recorded in the placement
// state machine before and after it runs, so a restarted gateway resumes from the recorded step.
type Dispatcher struct {
	cfg DispatchConfig
	log *slog.Logger

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	mu     sync.Mutex
	active map[string]bool  // session ids with a step running
	force  held[bool]       // session ids whose next reconciliation may pass the deletion brake
	next   held[nextTarget] // session id → where it goes once its pull-back rests (DispatchToEnvironment, MoveToProfile)
	// busyPolicy: a pull-back's policy for its drain step
	busyPolicy held[BusyPolicy]
	claims     map[string]claim // environment id → the dispatch that took it in its provision step
	backoff    map[string]*poolBackoff
	held       map[string]bool // PoolHolds' set, computed at heldAt
	heldAt     time.Time
	sync       *syncMetrics
	// allowed: the secret scan's false positives each session's operator let through (in memory:
	// after a restart they are named again)
	allowed map[string][]secretscan.Allow
}

// NewDispatcher returns a Dispatcher; call Resume after the environment manager has started.
func NewDispatcher(cfg DispatchConfig) *Dispatcher {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.ReclaimInterval == 0 {
		cfg.ReclaimInterval = 2 * time.Second
	}
	if cfg.ReclaimGrace == 0 {
		cfg.ReclaimGrace = 2 * time.Minute
	}
	if cfg.SyncTimeout == 0 {
		cfg.SyncTimeout = 30 * time.Minute
	}
	if cfg.ReconcileTimeout == 0 {
		cfg.ReconcileTimeout = 10 * time.Minute
	}
	if cfg.MaxAllowedSecrets == 0 {
		cfg.MaxAllowedSecrets = DefaultMaxAllowedSecrets
	}
	ctx, cancel := context.WithCancel(context.Background())
	d := &Dispatcher{cfg: cfg, log: cfg.Log, ctx: ctx, cancel: cancel, active: map[string]bool{}, sync: newSyncMetrics()}
	d.wg.Add(1)
	go d.reclaimLoop(cfg.ReclaimInterval, cfg.ReclaimGrace)
	return d
}

// AfterTurn checkpoints a session in the background after one of its worker turns ended.
func (d *Dispatcher) AfterTurn(sessionID string) {
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		if !d.checkpointDue(d.ctx, sessionID) {
			return
		}
		if err := d.Checkpoint(d.ctx, sessionID); err != nil && d.ctx.Err() == nil {
			d.log.Warn("checkpoint", "session", sessionID, "err", err)
		}
	}()
}

// checkpointDue applies the profile's checkpoint cadence after a worker turn: "turn" (the
// default) checkpoints after every turn; a duration ("10m") only once the last checkpoint is at
// least that old.
func (d *Dispatcher) checkpointDue(ctx context.Context, sessionID string) bool {
	p, err := d.cfg.Placements.Get(ctx, sessionID)
	if err != nil || p.EnvironmentID == "" {
		return true
	}
	e, err := d.cfg.Envs.Get(ctx, p.EnvironmentID)
	if err != nil {
		return true
	}
	every := e.Profile.Checkpoint.Interval()
	if every <= 0 {
		return true
	}
	age, ok := d.cfg.Placements.checkpointAge(ctx, sessionID)
	if !ok {
		return true
	}
	if age < every {
		d.log.Debug("checkpoint not due", "session", sessionID, "age", age, "every", every)
		return false
	}
	return true
}

// Close stops background steps and waits for them until ctx ends (an error then names what still
// runs); they resume on the next start.
func (d *Dispatcher) Close(ctx context.Context) error {
	d.cancel()
	return shutdown.Wait(ctx, &d.wg, "placement steps")
}

// Resume restarts every placement that a previous gateway left mid-way.
func (d *Dispatcher) Resume(ctx context.Context) error {
	ids, err := store.Strings(ctx, d.cfg.Placements.db.R, `SELECT session_id FROM placements WHERE state IN (?,?,?,?,?,?)`,
		string(Requested), string(Provisioning), string(Syncing), string(Starting), string(Draining), string(Reconciling))
	if err != nil {
		return err
	}
	for _, id := range ids {
		d.log.Info("resuming placement", "session", id)
		d.kick(id)
	}
	return nil
}

// kick runs the state machine of a session in the background unless it already runs.
func (d *Dispatcher) kick(sessionID string) {
	d.mu.Lock()
	if d.active[sessionID] {
		d.mu.Unlock()
		return
	}
	d.active[sessionID] = true
	d.wg.Add(1)
	d.mu.Unlock()
	go func() {
		defer d.wg.Done()
		defer func() {
			d.mu.Lock()
			delete(d.active, sessionID)
			d.mu.Unlock()
		}()
		if err := d.advance(d.ctx, sessionID); err != nil && d.ctx.Err() == nil {
			d.log.Warn("placement step failed", "session", sessionID, "err", err)
		}
		if d.ctx.Err() == nil {
			d.afterMove(sessionID) // a turn a live move stopped goes on where the session rests
		}
	}()
}

// Dispatch starts moving a local session to a worker of the profile. It returns once the intent
// is recorded; the steps run in the background (follow them with Get or the events).
func (d *Dispatcher) Dispatch(ctx context.Context, sessionID, profileID, machineClass string) (Placement, error) {
	sess, err := d.cfg.Sessions.Get(ctx, sessionID)
	if err != nil {
		return Placement{}, err
	}
	if sess.ArchivedAt != nil {
		return Placement{}, sessions.ArchivedError(sessionID)
	}
	if sess.Workspace == "" {
		return Placement{}, fmt.Errorf("session %s has no workspace to send to a worker", sessionID)
	}
	prof, err := d.cfg.Envs.Profile(ctx, profileID)
	if err != nil {
		return Placement{}, err
	}
	if machineClass != "" {
		if _, err := envs.WithClass(prof, machineClass); err != nil {
			return Placement{}, err
		}
	}
	if d.cfg.Busy != nil && d.cfg.Busy(sessionID) {
		return Placement{}, fmt.Errorf("session %s: %w; dispatch after it ends", sessionID, ErrBusy)
	}
	p, err := d.cfg.Placements.Get(ctx, sessionID)
	if err != nil {
		return p, err
	}
	p, err = d.request(ctx, p, profileID, machineClass)
	if err != nil {
		return p, err
	}
	d.kick(sessionID)
	return p, nil
}

// request records the dispatch of the resting placement p to a lease of the profile.
func (d *Dispatcher) request(ctx context.Context, p Placement, profileID, machineClass string) (Placement, error) {
	reason := "dispatch to profile " + profileID
	if machineClass != "" {
		reason += " (machine class " + machineClass + ")"
	}
	zero, none := 0, "" // a new dispatch: no barrier passed yet, no environment chosen (provision picks one)
	return d.cfg.Placements.Transition(ctx, p.SessionID, p.Generation, Change{To: Requested, Reason: reason, ProfileID: &profileID, MachineClass: &machineClass,
		EnvironmentID: &none, BarrierStep: &zero, Idle: true})
}

// MoveToProfile moves a session active on a worker to a lease of another profile (or a fresh
// lease of the same one): it is pulled back by policy (its work comes home into the anchor), then
// dispatched from there. With the live policy, a running turn stops at its next model call and
// goes on on the new worker. The follow-on target is kept in memory; after a gateway restart
// mid-move the session rests on the gateway (and a moving turn goes on there).
func (d *Dispatcher) MoveToProfile(ctx context.Context, sessionID, profileID, machineClass string, policy BusyPolicy) (Placement, error) {
	p, err := d.cfg.Placements.Get(ctx, sessionID)
	if err != nil {
		return p, err
	}
	if p.State != Active {
		return p, fmt.Errorf("session %s is %s, not active on a worker: %w", sessionID, p.State, ErrStale)
	}
	d.setNext(sessionID, nextTarget{profile: profileID, class: machineClass})
	moved, err := d.PullBackBusy(ctx, sessionID, false, policy)
	if err != nil {
		d.setNext(sessionID, nextTarget{})
	}
	return moved, err
}

// afterMove tells the turns that a move of the session rested or was refused (DispatchConfig.AfterMove).
func (d *Dispatcher) afterMove(sessionID string) {
	if d.cfg.AfterMove != nil {
		d.cfg.AfterMove(sessionID)
	}
}

// PullBack starts bringing a session home: drain, reconcile the workspace, activate local.
func (d *Dispatcher) PullBack(ctx context.Context, sessionID string, force bool) (Placement, error) {
	return d.PullBackBusy(ctx, sessionID, force, BusyDrain)
}

// PullBackBusy is PullBack with a policy for a running turn (barrier step 2): drain waits for it
// (placement.drainTimeout, then cancels it), cancel stops it.
func (d *Dispatcher) PullBackBusy(ctx context.Context, sessionID string, force bool, policy BusyPolicy) (Placement, error) {
	if d.cfg.Sessions != nil {
		if _, err := d.cfg.Sessions.Get(ctx, sessionID); err != nil {
			return Placement{}, err // an unknown session is not-found, not "local"
		}
	}
	p, err := d.cfg.Placements.Get(ctx, sessionID)
	if err != nil {
		return p, err
	}
	if p.State == Failed && d.failedReconciling(ctx, sessionID) {
		// Reconciling failed (deletion brake, drift, divergence, a lost link): the worker is
		// drained and fenced; try the reconciliation again, confirming deletions when forced.
		reason := "pull-back retried"
		if force {
			reason += " with --force (deletions confirmed)"
		}
		// The confirmation is in place before the move is recorded (a step loop still running
		// could take the reconciliation at once) and withdrawn if the move is refused; reconcile
		// consumes it.
		d.setForce(sessionID, force)
		p, err = d.cfg.Placements.Transition(ctx, sessionID, p.Generation, Change{To: Reconciling, Reason: reason})
		if err != nil {
			d.setForce(sessionID, false)
			return p, err
		}
		d.kick(sessionID)
		return p, nil
	}
	if p.State != Active {
		return p, fmt.Errorf("session %s is %s, not active on a worker", sessionID, p.State)
	}
	step := 1 // barrier step 1: stop new turn admission (the placement leaves active)
	d.setForce(sessionID, force)
	wait, cancel := context.WithTimeout(ctx, d.cfg.checkpointWait())
	defer cancel()
	// Not while a checkpoint holds the session: it brings the box's work into the anchor and then
	// records the new base at the generation it claimed. Leaving active first would refuse that
	// record, and the reconciliation would find the anchor drifted from a base that no longer
	// describes it. A checkpoint starts only while the session is active, so once this move is
	// made none can.
	err = d.cfg.Placements.Await(wait, sessionID, pollInterval, func() (bool, error) {
		moved, err := d.cfg.Placements.Transition(ctx, sessionID, p.Generation,
			Change{To: Draining, Reason: "pull-back requested", BarrierStep: &step, UnlessClaim: checkpointRun})
		switch {
		case err == nil:
			// held for the drain step, which only the kick below starts: a pull-back that lost
			// the race for this move never touches it
			d.setBusyPolicy(sessionID, policy)
			p = moved
			return true, nil
		case errors.Is(err, ErrBusy):
			return false, nil // a checkpoint holds it: its end is a change
		}
		return false, err
	})
	if err != nil {
		d.setForce(sessionID, false)
		if ctx.Err() == nil && wait.Err() != nil && errors.Is(err, wait.Err()) {
			err = fmt.Errorf("session %s: a checkpoint has been bringing the worker's workspace into the anchor for over %s; pull back again once it is done: %w", sessionID, d.cfg.checkpointWait(), ErrBusy)
		}
		return p, err
	}
	d.kick(sessionID)
	return p, nil
}

// failedReconciling reports whether a session's placement failed in its reconciliation step (its
// last transition was reconciling → failed): only then is the worker drained and fenced, with the
// recorded base and box workspace still those of the reconciliation.
func (d *Dispatcher) failedReconciling(ctx context.Context, sessionID string) bool {
	evs, err := d.cfg.Placements.Events(ctx, sessionID)
	if err != nil {
		return false
	}
	for i := len(evs) - 1; i >= 0; i-- {
		if ev := evs[i]; ev.From != ev.To { // notes keep the state
			return ev.From == Reconciling && ev.To == Failed
		}
	}
	return false
}

// setForce records whether the next reconciliation of a session may delete more than the
// deletion brake allows. It is kept in memory: after a gateway restart the brake applies again,
// and the operator confirms once more.
func (d *Dispatcher) setForce(sessionID string, force bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.force.set(sessionID, force)
}

// takeForce returns and clears a session's confirmation: it holds for one reconciliation.
func (d *Dispatcher) takeForce(sessionID string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.force.take(sessionID)
}

// held keeps one value per session, in memory, until it is taken; setting the zero value clears
// it. Its users hold Dispatcher.mu.
type held[T comparable] map[string]T

func (h *held[T]) set(sessionID string, v T) {
	var zero T
	if v == zero {
		delete(*h, sessionID)
		return
	}
	if *h == nil {
		*h = held[T]{}
	}
	(*h)[sessionID] = v
}

func (h held[T]) take(sessionID string) T {
	v := h[sessionID]
	delete(h, sessionID)
	return v
}

// pollInterval is how often the dispatcher looks again at a fact it waits for.
const pollInterval = 100 * time.Millisecond

// poll waits pollInterval on the dispatcher's clock, or until ctx ends.
func (d *Dispatcher) poll(ctx context.Context) error {
	return clock.Sleep(ctx, d.cfg.Clock, pollInterval)
}

package placement

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/openclaw/cloudworkers/gateway/store"
	"github.com/openclaw/cloudworkers/internal/clock"
)

// State is a session's placement state, stored as-is.
type State string

// The placement states (ARCHITECTURE.md section 4).
const (
	Local        State = "local"
	Requested    State = "requested"
	Provisioning State = "provisioning"
	Syncing      State = "syncing"
	Starting     State = "starting"
	Active       State = "active"
	Draining     State = "draining"
	Reconciling  State = "reconciling"
	Reclaimed    State = "reclaimed"
	Failed       State = "failed"
)

// AllStates lists every placement state.
var AllStates = []State{Local, Requested, Provisioning, Syncing, Starting, Active, Draining, Reconciling, Reclaimed, Failed}

// transitions is the explicit table of legal moves. Dispatch walks local → … → active; pull-back
// walks active → draining → reconciling → local; a lost worker ends in reclaimed, from which the
// next message dispatches again (reclaimed → requested) or the session comes home (→ local);
// failed needs an operator's recovery (→ local after the workspace is reconciled by hand, a retry,
// or — when reconciling failed, the worker already fenced — a second pull-back: → reconciling).
var transitions = map[State][]State{
	Local:        {Requested},
	Requested:    {Provisioning, Failed, Local},
	Provisioning: {Syncing, Failed, Reclaimed},
	Syncing:      {Starting, Failed, Reclaimed},
	Starting:     {Active, Failed, Reclaimed},
	Active:       {Draining, Reclaimed, Failed},
	Draining:     {Reconciling, Reclaimed, Failed},
	Reconciling:  {Local, Failed},
	Reclaimed:    {Requested, Local},
	Failed:       {Local, Requested, Reconciling},
}

// CanTransition reports whether from → to is legal.
func CanTransition(from, to State) bool { return slices.Contains(transitions[from], to) }

// Remote reports whether turns of a session in this state run (or are being set up) on a worker:
// a local turn must not be admitted.
func (s State) Remote() bool { return s != Local && s != Reclaimed && s != Failed }

// WorkerOwned reports whether the session's worker owns its turns in this state: from the start
// step that binds it (→ active) until the drain that fences it (draining → reconciling).
func (s State) WorkerOwned() bool { return s == Active || s == Draining }

// ErrBusy is returned when a session already has a turn (or a checkpoint) in flight.
var ErrBusy = errors.New("session has a turn in progress")

// ErrCheckpointing is the ErrBusy of a session held by a checkpoint, which lasts a moment: turn
// admission waits for it rather than refusing the message.
var ErrCheckpointing = fmt.Errorf("%w (a checkpoint is reading the worker's workspace)", ErrBusy)

// ErrStale is returned when the placement changed since the caller read it (generation mismatch).
var ErrStale = errors.New("placement changed meanwhile")

// Placement is the persisted placement of one session.
type Placement struct {
	SessionID      string `json:"sessionId"`
	State          State  `json:"state"`
	Generation     uint64 `json:"generation"`
	ProfileID      string `json:"profileId,omitempty"`
	MachineClass   string `json:"machineClass,omitempty"`
	EnvironmentID  string `json:"environmentId,omitempty"`
	AnchorDir      string `json:"anchorDir,omitempty"`
	BoxWorkspace   string `json:"boxWorkspace,omitempty"`
	SyncMode       string `json:"syncMode,omitempty"`
	OwnerEpoch     uint64 `json:"ownerEpoch"`
	BaseManifestID string `json:"baseManifestId,omitempty"`
	BundleHash     string `json:"bundleHash,omitempty"`
	BarrierStep    int    `json:"barrierStep,omitempty"`
	TurnRunID      string `json:"turnRunId,omitempty"`
	Error          string `json:"error,omitempty"`
	UpdatedAt      string `json:"updatedAt"`
}

// ChangePlacementUpdated is the kind of the gateway-wide feed's change (GET /api/v1/events) that
// a session's placement changed: a transition, a step noted, a turn claimed or let go. Its id is
// the session's.
const ChangePlacementUpdated = "placement.updated"

// Placements stores the placement state machine.
type Placements struct {
	db *store.DB
	// Clock dates the rows (the real clock when nil).
	Clock clock.Clock
	// Notify, when set, publishes each committed change of a session's placement on the
	// gateway-wide feed (sessions.Store.Notify with ChangePlacementUpdated); it must not block.
	Notify func(kind, id string)

	wmu     sync.Mutex
	waiters map[string]chan struct{} // Changes
}

func (ps *Placements) now() string { return store.FormatTime(clock.Or(ps.Clock).Now()) }

// changed announces a committed change of the session's placement.
func (ps *Placements) changed(sessionID string) {
	ps.wmu.Lock()
	if ch, ok := ps.waiters[sessionID]; ok {
		close(ch)
		delete(ps.waiters, sessionID)
	}
	ps.wmu.Unlock()
	if ps.Notify != nil {
		ps.Notify(ChangePlacementUpdated, sessionID)
	}
}

// Changes returns a channel closed at the next committed change of the session's placement (a
// transition, a turn claimed or released, a note). Take it before reading the state it waits on,
// so that a change between the read and the wait is not missed.
func (ps *Placements) Changes(sessionID string) <-chan struct{} {
	ps.wmu.Lock()
	defer ps.wmu.Unlock()
	if ps.waiters == nil {
		ps.waiters = map[string]chan struct{}{}
	}
	ch, ok := ps.waiters[sessionID]
	if !ok {
		ch = make(chan struct{})
		ps.waiters[sessionID] = ch
	}
	return ch
}

// Await waits until done reports true or an error: it calls done now and again after each
// committed change of the session's placement (taking Changes before each call, so that no change
// is missed). poll > 0 also calls it that often on the store's clock, for what done reads beyond
// the placement (a turn's end on this gateway, a worker's admission, a read that failed). It
// returns ctx's error when ctx ends first.
func (ps *Placements) Await(ctx context.Context, sessionID string, poll time.Duration, done func() (bool, error)) error {
	for {
		changed := ps.Changes(sessionID)
		if ok, err := done(); ok || err != nil {
			return err
		}
		var tick clock.Timer
		var tickC <-chan time.Time
		if poll > 0 {
			tick = clock.Or(ps.Clock).NewTimer(poll)
			tickC = tick.C()
		}
		select {
		case <-ctx.Done():
		case <-changed:
		case <-tickC:
		}
		if tick != nil {
			tick.Stop()
		}
		if err := ctx.Err(); err != nil {
			return err
		}
	}
}

// NewPlacements returns the placement store.
func NewPlacements(db *store.DB) *Placements { return &Placements{db: db} }

// placementCols reads the owner epoch from the session's row, where it is stored once: the
// placement shows the epoch of the session's current owner, never a copy of its own.
const placementCols = `session_id, state, generation, profile_id, machine_class, environment_id, anchor_dir, box_workspace, sync_mode,
	COALESCE((SELECT s.owner_epoch FROM sessions s WHERE s.id = placements.session_id), 1),
	base_manifest_id, bundle_hash, barrier_step, turn_run_id, error, updated_at`

func scanPlacement(row store.Scanner) (Placement, error) {
	var p Placement
	err := row.Scan(&p.SessionID, &p.State, &p.Generation, &p.ProfileID, &p.MachineClass, &p.EnvironmentID, &p.AnchorDir, &p.BoxWorkspace, &p.SyncMode,
		&p.OwnerEpoch, &p.BaseManifestID, &p.BundleHash,
		&p.BarrierStep, &p.TurnRunID, &p.Error, &p.UpdatedAt)
	return p, err
}

// ServedBy returns the placements that use an environment (every state but local, reclaimed and
// failed), most recently updated first.
func (ps *Placements) ServedBy(ctx context.Context, envID string) ([]Placement, error) {
	return ps.query(ctx, `WHERE environment_id=? AND state NOT IN (?,?,?) ORDER BY updated_at DESC`,
		envID, string(Local), string(Reclaimed), string(Failed))
}

// query returns the placement rows that the rest of a SELECT (where, order, limit) picks.
func (ps *Placements) query(ctx context.Context, rest string, args ...any) ([]Placement, error) {
	return store.Query(ctx, ps.db.R, scanPlacement, `SELECT `+placementCols+` FROM placements `+rest, args...)
}

// List returns every placement row (sessions never dispatched have none), most recently updated
// first, at most limit rows.
func (ps *Placements) List(ctx context.Context, limit int) ([]Placement, error) {
	return ps.query(ctx, `ORDER BY updated_at DESC LIMIT ?`, limit)
}

// Get returns a session's placement; a session never dispatched is local at generation 0.
func (ps *Placements) Get(ctx context.Context, sessionID string) (Placement, error) {
	p, err := scanPlacement(ps.db.R.QueryRowContext(ctx, `SELECT `+placementCols+` FROM placements WHERE session_id=?`, sessionID))
	if errors.Is(err, sql.ErrNoRows) {
		p = Placement{SessionID: sessionID, State: Local, OwnerEpoch: 1}
		err = ps.db.R.QueryRowContext(ctx, `SELECT owner_epoch FROM sessions WHERE id=?`, sessionID).Scan(&p.OwnerEpoch)
		if errors.Is(err, sql.ErrNoRows) {
			err = nil
		}
	}
	return p, err
}

// Change describes one transition; the zero value of a field leaves it unchanged (except Error,
// which is replaced).
type Change struct {
	To            State
	Reason        string
	ProfileID     *string
	MachineClass  *string
	EnvironmentID *string
	AnchorDir     *string
	BoxWorkspace  *string
	SyncMode      *string
	// OwnerEpoch is the epoch the binding of Also advanced the session to (it is stored only in
	// the session's row); the placement the transition returns shows it.
	OwnerEpoch     uint64
	BaseManifestID *string
	BundleHash     *string
	BarrierStep    *int
	Error          string
	// UnlessClaim refuses the move (ErrBusy) while the session's turn is held by this claim.
	UnlessClaim string
	// Idle refuses the move (ErrBusy) while any turn holds the session: a move that starts from
	// rest is decided against turn admission in this one transaction, so a message that arrives
	// during a dispatch either runs before the move (which is then refused) or is refused.
	Idle bool
	// Also runs inside the transition's transaction once the move passed its checks, before the
	// placement row is written: the session's binding and the environment's attachment change
	// with the placement or not at all. It may fill in the change (the owner epoch a binding
	// advanced to); committed, when not nil, runs after the commit. Its error (an *AlsoError)
	// refuses the move.
	Also func(ctx context.Context, tx *sql.Tx, c *Change) (committed func(), err error)
}

// AlsoError is the error of a transition's Also: the move was refused because the work that
// moves with it failed.
type AlsoError struct{ Err error }

func (e *AlsoError) Error() string { return e.Err.Error() }
func (e *AlsoError) Unwrap() error { return e.Err }

// Transition moves the placement from the state the caller read at generation gen to c.To, in one
// transaction with its event row, failing with ErrStale if anything moved meanwhile and with an
// error if the table forbids the move. It returns the new placement (generation gen+1).
func (ps *Placements) Transition(ctx context.Context, sessionID string, gen uint64, c Change) (Placement, error) {
	return ps.transition(ctx, sessionID, gen, &c)
}

// transition is Transition on the caller's change, which sees what its Also filled in.
func (ps *Placements) transition(ctx context.Context, sessionID string, gen uint64, c *Change) (Placement, error) {
	var out Placement
	var committed func()
	err := ps.db.InTx(ctx, func(tx *sql.Tx) error {
		committed = nil
		p, err := scanPlacement(tx.QueryRowContext(ctx, `SELECT `+placementCols+` FROM placements WHERE session_id=?`, sessionID))
		if errors.Is(err, sql.ErrNoRows) {
			p, err = Placement{SessionID: sessionID, State: Local, OwnerEpoch: 1}, nil
			if _, ierr := tx.ExecContext(ctx, `INSERT INTO placements(session_id, state, generation, updated_at) VALUES(?,?,0,?)`,
				sessionID, string(Local), ps.now()); ierr != nil {
				return ierr
			}
		}
		if err != nil {
			return err
		}
		if p.Generation != gen {
			return fmt.Errorf("session %s placement is %s at generation %d, not %d: %w", sessionID, p.State, p.Generation, gen, ErrStale)
		}
		if (c.UnlessClaim != "" && p.TurnRunID == c.UnlessClaim) || (c.Idle && p.TurnRunID != "") {
			return fmt.Errorf("session %s: %w (run %s)", sessionID, ErrBusy, p.TurnRunID)
		}
		if !CanTransition(p.State, c.To) {
			return fmt.Errorf("session %s: illegal placement transition %s → %s", sessionID, p.State, c.To)
		}
		if c.Also != nil {
			if committed, err = c.Also(ctx, tx, c); err != nil {
				return &AlsoError{Err: err}
			}
		}
		from := p.State
		p.State, p.Generation, p.Error, p.UpdatedAt = c.To, p.Generation+1, c.Error, ps.now()
		for _, f := range []struct{ dst, src *string }{{&p.ProfileID, c.ProfileID}, {&p.MachineClass, c.MachineClass}, {&p.EnvironmentID, c.EnvironmentID},
			{&p.AnchorDir, c.AnchorDir}, {&p.BoxWorkspace, c.BoxWorkspace}, {&p.SyncMode, c.SyncMode}} {
			if f.src != nil {
				*f.dst = *f.src
			}
		}
		if c.OwnerEpoch != 0 {
			if c.OwnerEpoch < p.OwnerEpoch {
				return fmt.Errorf("session %s: owner epoch may only advance (%d → %d)", sessionID, p.OwnerEpoch, c.OwnerEpoch)
			}
			p.OwnerEpoch = c.OwnerEpoch
		}
		if c.BaseManifestID != nil {
			p.BaseManifestID = *c.BaseManifestID
		}
		if c.BundleHash != nil {
			p.BundleHash = *c.BundleHash
		}
		if c.BarrierStep != nil {
			p.BarrierStep = *c.BarrierStep
		}
		_, err = tx.ExecContext(ctx, `UPDATE placements SET state=?, generation=?, profile_id=?, machine_class=?, environment_id=?, anchor_dir=?,
			box_workspace=?, sync_mode=?, base_manifest_id=?, bundle_hash=?, barrier_step=?, error=?, updated_at=?
			WHERE session_id=?`,
			string(p.State), p.Generation, p.ProfileID, p.MachineClass, p.EnvironmentID, p.AnchorDir, p.BoxWorkspace, p.SyncMode,
			p.BaseManifestID, p.BundleHash, p.BarrierStep, p.Error, p.UpdatedAt, sessionID)
		if err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, `INSERT INTO placement_events(session_id, at, from_state, to_state, generation, reason) VALUES(?,?,?,?,?,?)`,
			sessionID, p.UpdatedAt, string(from), string(c.To), p.Generation, c.Reason)
		out = p
		return err
	})
	if err == nil {
		ps.changed(sessionID)
		if committed != nil {
			committed()
		}
	}
	return out, err
}

// ClaimTurn is turn admission: it records runID as the session's turn only if the placement is
// still at generation gen (compare-and-swap) and no turn holds it, so a local message admitted
// against a stale snapshot can never race a worker turn. wantRemote says which loop claims.
func (ps *Placements) ClaimTurn(ctx context.Context, sessionID string, gen uint64, wantRemote bool, runID string) error {
	err := ps.db.InTx(ctx, func(tx *sql.Tx) error { return ps.ClaimTurnTx(ctx, tx, sessionID, gen, wantRemote, runID) })
	if err == nil {
		ps.changed(sessionID)
	}
	return err
}

// ClaimTurnTx is ClaimTurn inside the caller's transaction (turn admission writes the turn's row
// in the same one); the caller calls Changed once it has committed.
func (ps *Placements) ClaimTurnTx(ctx context.Context, tx *sql.Tx, sessionID string, gen uint64, wantRemote bool, runID string) error {
	p, err := scanPlacement(tx.QueryRowContext(ctx, `SELECT `+placementCols+` FROM placements WHERE session_id=?`, sessionID))
	if errors.Is(err, sql.ErrNoRows) {
		p = Placement{SessionID: sessionID, State: Local}
		if _, err := tx.ExecContext(ctx, `INSERT INTO placements(session_id, state, generation, updated_at) VALUES(?,?,0,?)`,
			sessionID, string(Local), ps.now()); err != nil {
			return err
		}
	} else if err != nil {
		return err
	}
	switch {
	case p.Generation != gen:
		return fmt.Errorf("session %s placement moved to %s (generation %d): %w", sessionID, p.State, p.Generation, ErrStale)
	case p.TurnRunID == checkpointRun:
		return fmt.Errorf("session %s: %w", sessionID, ErrCheckpointing)
	case p.TurnRunID != "":
		return fmt.Errorf("session %s: %w (run %s)", sessionID, ErrBusy, p.TurnRunID)
	case p.State == Failed:
		// Only an explicit move (MoveLocal) or a new dispatch lets its turns run again.
		return fmt.Errorf("session %s: %w", sessionID, ErrPlacementFailed)
	case p.State != Local && p.State != Active && p.State != Reclaimed:
		return fmt.Errorf("session %s is %s (message refused while the placement moves): %w", sessionID, p.State, ErrStale)
	case wantRemote && p.State != Active:
		return fmt.Errorf("session %s is %s, not active on a worker: %w", sessionID, p.State, ErrStale)
	case !wantRemote && p.State == Active:
		// the caller read a moving placement and took the turn for the gateway; a worker owns
		// the session now
		return fmt.Errorf("session %s is active on a worker, not on the gateway: %w", sessionID, ErrStale)
	}
	_, err = tx.ExecContext(ctx, `UPDATE placements SET turn_run_id=? WHERE session_id=? AND generation=?`, runID, sessionID, gen)
	return err
}

// Changed tells the change feed that the session's placement row changed (after a commit of the
// caller's own transaction).
func (ps *Placements) Changed(sessionID string) { ps.changed(sessionID) }

// ReleaseAllTurns clears every turn claim: claims (turns, checkpoints) die with the gateway that
// held them; left set, they would refuse every message and hold a pull-back in draining forever.
func (ps *Placements) ReleaseAllTurns(ctx context.Context) error {
	_, err := ps.db.W.ExecContext(ctx, `UPDATE placements SET turn_run_id='' WHERE turn_run_id<>''`)
	return err
}

// ReleaseTurn clears the session's turn if it is runID.
func (ps *Placements) ReleaseTurn(ctx context.Context, sessionID, runID string) error {
	res, err := ps.db.W.ExecContext(ctx, `UPDATE placements SET turn_run_id='' WHERE session_id=? AND turn_run_id=?`, sessionID, runID)
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n > 0 {
		ps.changed(sessionID)
	}
	return nil
}

// Event is one recorded placement change.
type Event struct {
	At         string `json:"at"`
	From       State  `json:"from"`
	To         State  `json:"to"`
	Generation uint64 `json:"generation"`
	Reason     string `json:"reason,omitempty"`
}

// Events returns a session's placement changes, oldest first.
func (ps *Placements) Events(ctx context.Context, sessionID string) ([]Event, error) {
	return store.Query(ctx, ps.db.R, func(r store.Scanner) (Event, error) {
		var e Event
		err := r.Scan(&e.At, &e.From, &e.To, &e.Generation, &e.Reason)
		return e, err
	}, `SELECT at, from_state, to_state, generation, reason FROM placement_events WHERE session_id=? ORDER BY id`, sessionID)
}

// Note records a placement event without a state change.
func (ps *Placements) Note(ctx context.Context, sessionID, reason string) {
	p, err := ps.Get(ctx, sessionID)
	if err != nil {
		return
	}
	if _, err := ps.db.W.ExecContext(ctx, `INSERT INTO placement_events(session_id, at, from_state, to_state, generation, reason) VALUES(?,?,?,?,?,?)`,
		sessionID, ps.now(), string(p.State), string(p.State), p.Generation, reason); err == nil {
		ps.changed(sessionID)
	}
}

// RecordBase records a new base manifest for the placement of a session whose turn claim is held by
// claim (the checkpoint): a pull-back that started meanwhile waits for that claim, so the base it
// reconciles against is this one.
func (ps *Placements) RecordBase(ctx context.Context, sessionID, claim string, gen uint64, baseFile, reason string) error {
	err := ps.db.InTx(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `UPDATE placements SET base_manifest_id=? WHERE session_id=? AND turn_run_id=? AND generation=?`, baseFile, sessionID, claim, gen)
		if err != nil {
			return err
		}
		if n, _ := res.RowsAffected(); n != 1 {
			return fmt.Errorf("session %s: %w", sessionID, ErrStale)
		}
		var st string
		_ = tx.QueryRowContext(ctx, `SELECT state FROM placements WHERE session_id=?`, sessionID).Scan(&st)
		_, err = tx.ExecContext(ctx, `INSERT INTO placement_events(session_id, at, from_state, to_state, generation, reason) VALUES(?,?,?,?,?,?)`,
			sessionID, ps.now(), st, st, gen, reason)
		return err
	})
	if err == nil {
		ps.changed(sessionID)
	}
	return err
}

// checkpointAge is how long ago the session's last checkpoint was recorded (ok false: none yet).
func (ps *Placements) checkpointAge(ctx context.Context, sessionID string) (time.Duration, bool) {
	var at string
	err := ps.db.R.QueryRowContext(ctx, `SELECT at FROM placement_events WHERE session_id=?
		AND (reason GLOB 'checkpoint [0-9]*:*' OR instr(reason, ?) > 0) ORDER BY id DESC LIMIT 1`, sessionID, anchorSaved).Scan(&at)
	if err != nil {
		return 0, false
	}
	return clock.Or(ps.Clock).Now().Sub(store.ParseTime(at)), true
}

// LastCheckpoint names the last time the anchor took in the session's worker workspace: its last
// numbered checkpoint ("checkpoint N"), or a checkpoint that could not be made but whose base was
// recorded ("the turn saved at <time>"); "" when there is none.
func (ps *Placements) LastCheckpoint(ctx context.Context, sessionID string) string {
	var reason, at string
	// Not "checkpoint failed: …" (unless the anchor was saved) nor "checkpoint pruning failed: …".
	err := ps.db.R.QueryRowContext(ctx, `SELECT reason, at FROM placement_events WHERE session_id=?
		AND (reason GLOB 'checkpoint [0-9]*:*' OR instr(reason, ?) > 0) ORDER BY id DESC LIMIT 1`, sessionID, anchorSaved).Scan(&reason, &at)
	if err != nil {
		return ""
	}
	if strings.Contains(reason, anchorSaved) {
		return "the turn saved at " + at
	}
	name, _, _ := strings.Cut(reason, ":")
	return name
}

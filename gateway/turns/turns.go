// Package turns admits and runs a session's turns: on the gateway (the local backend) or on the
// worker of the environment its placement names.
package turns

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"
	"time"

	"github.com/openclaw/cloudworkers/gateway/inference"
	"github.com/openclaw/cloudworkers/gateway/placement"
	"github.com/openclaw/cloudworkers/gateway/sessions"
	"github.com/openclaw/cloudworkers/gateway/store"
	"github.com/openclaw/cloudworkers/internal/clock"
	"github.com/openclaw/cloudworkers/internal/ids"
	"github.com/openclaw/cloudworkers/internal/shutdown"
	"github.com/openclaw/cloudworkers/protocol"
	"github.com/openclaw/cloudworkers/worker/runner"
	"github.com/openclaw/cloudworkers/worker/tools"
)

// ErrPlacementMoving refuses a message while the session's placement moves (dispatch or pull-back).
var ErrPlacementMoving = errors.New("the session is moving between the gateway and a worker; send the message when it is active again")

// Busy reports whether a session has a turn in flight on this gateway.
func (s *Service) Busy(sessionID string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.running[sessionID]
	return ok
}

// Turn is one run of a session.
type Turn struct {
	SessionID      string     `json:"sessionId"`
	RunEpoch       uint64     `json:"runEpoch"`
	RunID          string     `json:"runId"`
	IdempotencyKey string     `json:"idempotencyKey,omitempty"`
	Placement      string     `json:"placement"`
	Model          string     `json:"model"`
	Status         TurnStatus `json:"status"`
	Error          string     `json:"error,omitempty"`
	CreatedAt      string     `json:"createdAt"`
	FinishedAt     string     `json:"finishedAt,omitempty"`
	// Cursor is the session's live-event cursor when the turn was admitted: a stream opened
	// from it sees every event of the turn.
	Cursor   uint64 `json:"cursor"`
	Replayed bool   `json:"replayed,omitempty"`
}

// Config configures the turn service.
type Config struct {
	// Clock dates the turns and their events (the real clock when nil).
	Clock    clock.Clock
	DB       *store.DB
	Sessions *sessions.Store
	Catalog  *inference.Catalog
	DataDir  string
	Log      *slog.Logger
	MaxSteps int
	// Workers reaches admitted workers; nil means worker placement is unavailable.
	Workers Workers
	// AfterWorkerTurn is called when a turn on a worker has ended (the dispatcher checkpoints).
	AfterWorkerTurn func(sessionID string)
	// Redispatch is asked to bring a reclaimed session back onto a fresh worker; the message that
	// found it reclaimed is queued until the placement is active again.
	Redispatch func(ctx context.Context, sessionID string) error
	// ExtraTools are gateway-resident tools (web_search) offered in turns run on the gateway.
	ExtraTools []tools.Tool
	// SpawnTools (sessions_spawn and friends) are offered as ExtraTools are, but only while
	// WorkerProfiles says a worker profile exists: an install without one offers no way to lease.
	SpawnTools     []tools.Tool
	WorkerProfiles func(ctx context.Context) bool
	// Placements is the placement state machine; turn admission claims it (compare-and-swap on
	// its generation), so a message admitted against a stale snapshot can never race a move.
	Placements *placement.Placements
	// WorkerOnly reports sessions whose turns never run on the gateway (an OCC agent's session:
	// its model calls go only through its revision's credentials); nil: none.
	WorkerOnly func(ctx context.Context, sessionID string) (bool, error)
	// Budget refuses a new turn of a session while a spend budget it counts against has less left
	// than atLeast, the least the turn's first model call reserves (gateway/spend); nil: none.
	Budget func(ctx context.Context, sessionID string, atLeast float64) error
	// WorkerGoneGrace fails a worker turn whose worker stays disconnected this long (default 2m).
	WorkerGoneGrace time.Duration
}

// Workers is the worker endpoint as turn placement uses it; *hub.Server implements it.
type Workers interface {
	Admitted(envID string) bool
	// WaitAdmitted returns once the environment's worker is admitted (nil), or with ctx's error.
	WaitAdmitted(ctx context.Context, envID string) error
	// AdmissionChanged is closed at the next admission or departure of a worker.
	AdmissionChanged() <-chan struct{}
	Request(ctx context.Context, envID, method string, params any) (json.RawMessage, error)
}

// workerWait is how long a message waits for a reconnecting worker (a tunnel blip or a gateway
// restart is invisible at the session level) before it is refused.
const workerWait = 30 * time.Second

// waitAdmitted reports whether the environment's worker is (or becomes, within workerWait) admitted.
// It waits on the hub's admission events, not by polling.
func (s *Service) waitAdmitted(ctx context.Context, envID string) bool {
	ctx, cancel := context.WithTimeout(ctx, workerWait)
	defer cancel()
	return s.cfg.Workers.WaitAdmitted(ctx, envID) == nil
}

// ErrWorkerOnly refuses a message to a session whose turns run only on a worker (an OCC agent's
// session) while it is not active on one.
var ErrWorkerOnly = errors.New("the session's turns run only on a worker, and it is not active on one")

// ErrWorkerUnavailable is a session placed on a worker that is not connected.
var ErrWorkerUnavailable = errors.New("the session's worker is not connected")

// Service admits and runs turns.
type Service struct {
	cfg    Config
	owner  string // tools.OwnerOf the data dir: the owner of the local turns' tool sets
	log    *slog.Logger
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	running map[string]context.CancelFunc // session id → cancel of its turn
	// yielding: session id → the run a live move asked to stop at its next model call; granted:
	// → the run whose model call was answered run-yield
	yielding, granted map[string]string
	ended             map[string]chan struct{} // session id → closed once its local turn is recorded ended

	metrics *metrics
}

// New returns the service. Turns left running by a gateway that died are marked failed: a turn
// whose gateway died mid-call is retried as a new turn, never replayed into the provider.
func New(ctx context.Context, cfg Config) (*Service, error) {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	// the worker runs of turns a dead gateway left running: a worker keeps running one (its next
	// commit is refused once it is fenced, and it waits), so it is canceled once its worker is back
	orphans, err := workerRuns(ctx, cfg.DB)
	if err != nil {
		return nil, fmt.Errorf("recover turns: %w", err)
	}
	if err := failRunningTurns(ctx, cfg.DB, clock.Or(cfg.Clock)); err != nil {
		return nil, fmt.Errorf("recover turns: %w", err)
	}
	// Turn claims (turns, checkpoints) die with the gateway that held them; left set, they would
	// refuse every message and hold a pull-back in draining forever.
	if cfg.Placements != nil {
		if err := cfg.Placements.ReleaseAllTurns(ctx); err != nil {
			return nil, fmt.Errorf("recover turn claims: %w", err)
		}
	}
	// A gateway of this data dir that died in the middle of a local turn stopped nothing: what the
	// turn's commands left running is stopped before a turn runs here again.
	owner := tools.OwnerOf(cfg.DataDir)
	if st, err := tools.StopLeftovers(ctx, owner); err != nil {
		cfg.Log.Warn("stop what an earlier gateway's local turns left running", "err", err, "stopped", st.Processes)
	} else if st.Processes > 0 {
		cfg.Log.Info("stopped what an earlier gateway's local turns left running", "processes", st.Processes)
	}
	c, cancel := context.WithCancel(context.Background())
	s := &Service{cfg: cfg, owner: owner, log: cfg.Log, ctx: c, cancel: cancel, running: map[string]context.CancelFunc{}, yielding: map[string]string{}, granted: map[string]string{}, ended: map[string]chan struct{}{}, metrics: newMetrics()}
	s.cancelOrphans(orphans)
	return s, nil
}

// orphan is a worker run whose turn a dead gateway left running.
type orphan struct{ session, env, run string }

// workerRuns returns the worker runs of the turns left running.
func workerRuns(ctx context.Context, db *store.DB) ([]orphan, error) {
	return store.Query(ctx, db.R, func(r store.Scanner) (orphan, error) {
		var o orphan
		err := r.Scan(&o.session, &o.env, &o.run)
		return o, err
	}, `SELECT t.session_id, COALESCE(s.environment_id, ''), t.run_id FROM turns t LEFT JOIN sessions s ON s.id = t.session_id
		WHERE t.status = ? AND t.placement = 'worker'`, string(TurnRunning))
}

// cancelOrphans asks each orphan's worker, once admitted (within orphanWait), to cancel the run: a
// worker still running it would refuse the next turn of any session (busy) until it ended.
func (s *Service) cancelOrphans(orphans []orphan) {
	if s.cfg.Workers == nil {
		return
	}
	for _, o := range orphans {
		if o.env == "" {
			continue
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			ctx, cancel := context.WithTimeout(s.ctx, orphanWait)
			defer cancel()
			if s.cfg.Workers.WaitAdmitted(ctx, o.env) != nil {
				return
			}
			s.cancelOnWorker(ctx, o.env, o.session, o.run)
			s.log.Info("asked the worker to stop a run a stopped gateway left", "session", o.session, "env", o.env, "run", o.run)
		}()
	}
}

// orphanWait bounds the wait for an orphaned run's worker to be admitted again.
const orphanWait = 2 * time.Minute

// Close cancels running turns and waits for them until ctx ends (an error then names what still
// runs).
func (s *Service) Close(ctx context.Context) error {
	s.cancel()
	return shutdown.Wait(ctx, &s.wg, "turns")
}

// checkpointWait bounds how long a message waits for the checkpoint that holds its session.
const checkpointWait = 2 * time.Minute

// Send admits a turn for the session and starts it. A repeated idempotency key returns the turn it
// started. A session that is already running a turn is refused with placement.ErrBusy.
func (s *Service) Send(ctx context.Context, sessionID, text, idempotencyKey string) (Turn, error) {
	if s.cfg.Placements != nil && s.cfg.Redispatch != nil {
		if p, err := s.cfg.Placements.Get(ctx, sessionID); err == nil && p.State == placement.Reclaimed {
			return s.queueAfterRedispatch(ctx, sessionID, text, idempotencyKey)
		}
	}
	return s.send(ctx, sessionID, text, idempotencyKey, ids.New("run_", 8))
}

// queueAfterRedispatch brings a reclaimed session back onto a fresh worker (restored from its
// last checkpoint) and runs the message there once the placement is active.
func (s *Service) queueAfterRedispatch(ctx context.Context, sessionID, text, key string) (Turn, error) {
	if err := s.cfg.Redispatch(ctx, sessionID); err != nil {
		return Turn{}, fmt.Errorf("bring reclaimed session %s back: %w", sessionID, err)
	}
	cursor, err := s.cfg.Sessions.LiveCursor(ctx, sessionID)
	if err != nil {
		return Turn{}, err
	}
	runID := ids.New("run_", 8)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		wctx, cancel := context.WithTimeout(s.ctx, 15*time.Minute)
		defer cancel()
		errDropped := errors.New("dropped")
		// the poll reads again after a failed read (no change may come)
		if err := s.cfg.Placements.Await(wctx, sessionID, 200*time.Millisecond, func() (bool, error) {
			p, err := s.cfg.Placements.Get(wctx, sessionID)
			switch {
			case err != nil:
				return false, nil
			case p.State == placement.Failed || p.State == placement.Local:
				s.log.Warn("queued message dropped: placement did not become active", "session", sessionID, "state", p.State, "err", p.Error)
				return false, errDropped
			}
			return p.State == placement.Active, nil
		}); err != nil {
			return
		}
		if _, err := s.send(wctx, sessionID, text, key, runID); err != nil {
			s.log.Warn("queued message", "session", sessionID, "err", err)
		}
	}()
	return Turn{SessionID: sessionID, RunID: runID, IdempotencyKey: key, Placement: "worker", Status: TurnQueued,
		CreatedAt: store.FormatTime(s.clock().Now()), Cursor: cursor}, nil
}

func (s *Service) send(ctx context.Context, sessionID, text, idempotencyKey, runID string) (Turn, error) {
	if text == "" {
		return Turn{}, errors.New("text is empty")
	}
	sess, err := s.cfg.Sessions.Get(ctx, sessionID)
	if err != nil {
		return Turn{}, err
	}
	if sess.ArchivedAt != nil {
		return Turn{}, sessions.ArchivedError(sessionID)
	}
	if idempotencyKey != "" {
		if t, err := s.turnByKey(ctx, sessionID, idempotencyKey); err == nil {
			t.Replayed = true
			return t, nil
		}
	}
	return s.begin(ctx, sess, text, idempotencyKey, runID, nil)
}

// begin places and starts a turn of sess: a new one (text), or the moving turn cont goes on
// where the session now rests (a live move's continuation, with no text).
func (s *Service) begin(ctx context.Context, sess sessions.Session, text, idempotencyKey, runID string, cont *Turn) (Turn, error) {
	sessionID := sess.ID
	var err error
	// Where the turn runs is read from the placement row, its one copy.
	where := "local"
	if s.cfg.Placements != nil {
		p, err := s.cfg.Placements.Get(ctx, sessionID)
		if err != nil {
			return Turn{}, err
		}
		switch {
		case p.State == placement.Failed:
			// A session asked for a worker whose placement failed never runs here unless the user
			// moves it (MoveLocal): the gateway would otherwise run the agent in the user's own
			// checkout.
			return Turn{}, s.cfg.Placements.FailedError(ctx, p, sess.Workspace)
		case p.State.WorkerOwned():
			if s.cfg.Workers == nil || !s.waitAdmitted(ctx, p.EnvironmentID) {
				return Turn{}, fmt.Errorf("session %s on environment %s: %w", sessionID, p.EnvironmentID, ErrWorkerUnavailable)
			}
			where = "worker"
			// The session row read above may predate the transition that bound it to its worker
			// (it commits with the move to active): read it again, after the placement.
			if sess, err = s.cfg.Sessions.Get(ctx, sessionID); err != nil {
				return Turn{}, err
			}
			if sess.EnvironmentID != p.EnvironmentID {
				return Turn{}, fmt.Errorf("%w: session %s is bound to %q, its placement to %q", ErrPlacementMoving, sessionID, sess.EnvironmentID, p.EnvironmentID)
			}
		}
	}
	if where == "local" && s.cfg.WorkerOnly != nil {
		only, err := s.cfg.WorkerOnly(ctx, sessionID)
		if err != nil {
			return Turn{}, err
		}
		if only {
			return Turn{}, fmt.Errorf("session %s: %w", sessionID, ErrWorkerOnly)
		}
	}
	model := sess.Model
	if model == "" {
		model = s.cfg.Catalog.Default()
	}
	if cont != nil {
		model = cont.Model
	}
	m, err := s.cfg.Catalog.Resolve(model)
	if err != nil {
		return Turn{}, err
	}
	if s.cfg.Budget != nil && cont == nil {
		// a turn that cannot pay for one model call's output is refused before it is recorded
		if err := s.cfg.Budget(ctx, sessionID, inference.WorstCost(m, protocol.Context{}, inference.Options{})); err != nil {
			return Turn{}, err
		}
	}
	// A checkpoint holds the session for a moment after each worker turn: a message that arrives
	// then waits for it (bounded) instead of being refused, since its sender saw the turn end.
	var t Turn
	deadline := s.clock().Now().Add(checkpointWait)
	for {
		var changed <-chan struct{}
		if s.cfg.Placements != nil {
			changed = s.cfg.Placements.Changes(sessionID)
		}
		t, err = s.admit(ctx, &sess, where, model, idempotencyKey, runID, cont)
		if !errors.Is(err, placement.ErrCheckpointing) || !s.clock().Now().Before(deadline) {
			break
		}
		timer := s.clock().NewTimer(deadline.Sub(s.clock().Now()))
		select {
		case <-changed:
		case <-ctx.Done():
		case <-timer.C():
		}
		timer.Stop()
		if ctx.Err() != nil {
			return Turn{}, ctx.Err()
		}
	}
	if err != nil {
		return Turn{}, s.admissionError(ctx, sessionID, sess.Workspace, err)
	}
	// admit returned holding s.mu: the turn is in s.running before anyone may look (a cancel
	// that arrives now finds it)
	if s.cfg.Placements != nil {
		s.cfg.Placements.Changed(sessionID)
	}
	tctx, cancel := context.WithCancel(s.ctx)
	s.running[sessionID] = cancel
	s.mu.Unlock()
	var once sync.Once
	release := func() {
		once.Do(func() {
			if s.cfg.Placements != nil {
				if err := s.cfg.Placements.ReleaseTurn(context.WithoutCancel(s.ctx), sessionID, runID); err != nil {
					s.log.Warn("release turn claim", "session", sessionID, "err", err)
				}
			}
			s.mu.Lock()
			delete(s.running, sessionID)
			if s.yielding[sessionID] == runID {
				delete(s.yielding, sessionID) // asked or not, the run has ended
			}
			if s.granted[sessionID] == runID {
				delete(s.granted, sessionID)
			}
			s.mu.Unlock()
			cancel()
		})
	}
	// The live cursor from which the turn's events are followed: read before the worker (or the
	// local loop) can publish any.
	if t.Cursor, err = s.cfg.Sessions.LiveCursor(ctx, sessionID); err != nil {
		release()
		s.finish(t, TurnFailed, err.Error())
		return Turn{}, err
	}
	s.metrics.started.WithLabelValues(where).Inc()
	if where == "worker" {
		if err := s.startOnWorker(ctx, tctx, sess, t, text, cont != nil, release); err != nil {
			return Turn{}, err
		}
		return t, nil
	}
	ws := sess.Workspace
	if ws == "" {
		ws = filepath.Join(s.cfg.DataDir, "workspaces", sessionID)
	}
	ended := make(chan struct{})
	s.mu.Lock()
	s.ended[sessionID] = ended
	s.mu.Unlock()
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer func() {
			s.mu.Lock()
			if s.ended[sessionID] == ended {
				delete(s.ended, sessionID)
			}
			s.mu.Unlock()
			close(ended)
		}()
		defer release()
		status, msg := s.run(tctx, t, ws, text, cont != nil)
		s.settleTurn(t, status, msg, release)
	}()
	return t, nil
}

// run runs a local turn (or goes on with a moving one: cont) and returns its outcome.
func (s *Service) run(ctx context.Context, t Turn, workspace, text string, cont bool) (TurnStatus, string) {
	set := tools.NewSet(tools.Config{Workspace: workspace, Extra: s.offeredTools(ctx), Owner: s.owner})
	defer set.Close(context.WithoutCancel(ctx))
	r := runner.New(runner.Config{
		Model:    catalogModel{c: s.cfg.Catalog, session: t.SessionID, yield: func() bool { return s.Yielding(t.SessionID, t.RunID) }},
		Backend:  &LocalBackend{Store: s.cfg.Sessions},
		Tools:    set,
		MaxSteps: s.cfg.MaxSteps,
	})
	err := ensureDir(workspace)
	if err == nil {
		err = r.Run(ctx, runner.Turn{SessionID: t.SessionID, RunEpoch: t.RunEpoch, RunID: t.RunID, ModelRef: t.Model, Text: text, Continue: cont})
	}
	status, msg := TurnDone, ""
	switch {
	case errors.Is(err, runner.ErrYielded):
		status = TurnMoving
	case errors.Is(err, context.Canceled):
		status, msg = TurnCanceled, "canceled"
	case err != nil:
		status, msg = TurnFailed, err.Error()
	}
	return status, msg
}

// admissionError says why a turn was not admitted.
func (s *Service) admissionError(ctx context.Context, sessionID, workspace string, err error) error {
	switch {
	case errors.Is(err, placement.ErrPlacementFailed):
		if p, gerr := s.cfg.Placements.Get(ctx, sessionID); gerr == nil && p.State == placement.Failed {
			return s.cfg.Placements.FailedError(ctx, p, workspace)
		}
		return err
	case errors.Is(err, placement.ErrStale):
		return fmt.Errorf("%w: %v", ErrPlacementMoving, err)
	case errors.Is(err, placement.ErrBusy):
		return err
	}
	return fmt.Errorf("admit turn: %w", err)
}

func (s *Service) clock() clock.Clock { return clock.Or(s.cfg.Clock) }

// RunningTurn returns the session's running worker turn (hub.Runs): the one run whose model and
// tool calls the hub serves. The turn's row is the record: written running in the transaction
// that admits it, ended by finish.
func (s *Service) RunningTurn(ctx context.Context, sessionID string) (string, uint64, bool, error) {
	var runID string
	var epoch uint64
	err := s.cfg.DB.R.QueryRowContext(ctx, `SELECT run_id, run_epoch FROM turns WHERE session_id=? AND status=? AND placement='worker'
		ORDER BY run_epoch DESC LIMIT 1`, sessionID, string(TurnRunning)).Scan(&runID, &epoch)
	if errors.Is(err, sql.ErrNoRows) {
		return "", 0, false, nil
	}
	return runID, epoch, err == nil, err
}

// Cancel cancels the session's running turn, if any.
func (s *Service) Cancel(sessionID string) bool {
	s.mu.Lock()
	c, ok := s.running[sessionID]
	if ok {
		c()
	}
	s.mu.Unlock()
	if !ok {
		return s.cancelMoving(sessionID) // between owners in a live move: it does not go on
	}
	return ok
}

// CancelAndWait cancels the session's running turn on this gateway, if any, and waits (bounded by
// ctx) until a local one has recorded its end: nothing of it writes to the session afterwards.
func (s *Service) CancelAndWait(ctx context.Context, sessionID string) error {
	s.mu.Lock()
	if c, ok := s.running[sessionID]; ok {
		c()
	}
	ended := s.ended[sessionID]
	s.mu.Unlock()
	if ended == nil {
		return nil
	}
	select {
	case <-ended:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("wait for the canceled turn of %s to end: %w", sessionID, ctx.Err())
	}
}

// DeleteTx deletes a removed session's turns and their events in tx.
func (s *Service) DeleteTx(ctx context.Context, tx *sql.Tx, sessionID string) error {
	if _, err := tx.ExecContext(ctx, `DELETE FROM turn_events WHERE run_id IN (SELECT run_id FROM turns WHERE session_id = ?)`, sessionID); err != nil {
		return fmt.Errorf("remove turns of %s: %w", sessionID, err)
	}
	if _, err := tx.ExecContext(ctx, `DELETE FROM turns WHERE session_id = ?`, sessionID); err != nil {
		return fmt.Errorf("remove turns of %s: %w", sessionID, err)
	}
	return nil
}

const turnCols = `session_id, run_epoch, run_id, COALESCE(idempotency_key,''), placement, model, status, error, created_at, finished_at`

func scanTurn(row store.Scanner) (Turn, error) {
	var t Turn
	err := row.Scan(&t.SessionID, &t.RunEpoch, &t.RunID, &t.IdempotencyKey, &t.Placement, &t.Model, &t.Status, &t.Error, &t.CreatedAt, &t.FinishedAt)
	return t, err
}

func (s *Service) turnByKey(ctx context.Context, sessionID, key string) (Turn, error) {
	return scanTurn(s.cfg.DB.R.QueryRowContext(ctx, `SELECT `+turnCols+` FROM turns WHERE session_id=? AND idempotency_key=?`, sessionID, key))
}

// Get returns one turn by run id.
func (s *Service) Get(ctx context.Context, runID string) (Turn, error) {
	t, err := scanTurn(s.cfg.DB.R.QueryRowContext(ctx, `SELECT `+turnCols+` FROM turns WHERE run_id=?`, runID))
	if errors.Is(err, sql.ErrNoRows) {
		return t, fmt.Errorf("turn %q: %w", runID, store.ErrNotFound)
	}
	return t, err
}

// List returns a session's turns, oldest first.
func (s *Service) List(ctx context.Context, sessionID string) ([]Turn, error) {
	return store.Query(ctx, s.cfg.DB.R, scanTurn, `SELECT `+turnCols+` FROM turns WHERE session_id=? ORDER BY run_epoch`, sessionID)
}

// catalogModel makes the gateway's catalog a runner.Model for one session (local placement calls
// it directly). A worker's calls reach the same Catalog.Stream through the hub with the same
// options, so a request is built by one function from the same inputs on either placement.
type catalogModel struct {
	c       *inference.Catalog
	session string
	// yield reports a live move's request to stop the run at this call (the hub's check for a
	// worker's run)
	yield func() bool
}

func (m catalogModel) Stream(ctx context.Context, ref string, c protocol.Context, emit func(protocol.StreamEvent) error) (protocol.Message, error) {
	if m.yield != nil && m.yield() {
		return protocol.Message{}, protocol.Errorf(protocol.CodeRunYield, "the session moves live: the turn goes on on its next owner")
	}
	return m.c.Stream(ctx, ref, c, inference.Options{Session: m.session}, emit)
}

// admit is turn admission: one turn per session at a time. The claim on the placement
// (compare-and-swap on its generation, read again now that the session is ours to admit) and the
// turn's row, the one record of the running turn, are written in one transaction. A worker turn
// runs in the box's workspace: admit sets sess.Workspace to it. On success admit returns holding
// s.mu, so the caller records the turn's cancel before anyone can look for it.
func (s *Service) admit(ctx context.Context, sess *sessions.Session, where, model, idempotencyKey, runID string, cont *Turn) (Turn, error) {
	sessionID := sess.ID
	s.mu.Lock()
	if _, busy := s.running[sessionID]; busy {
		s.mu.Unlock()
		return Turn{}, fmt.Errorf("session %s: %w; wait for it to end, or stop it with: openclaw session cancel %s", sessionID, placement.ErrBusy, sessionID)
	}
	var gen uint64
	if s.cfg.Placements != nil {
		p, err := s.cfg.Placements.Get(ctx, sessionID)
		if err != nil {
			s.mu.Unlock()
			return Turn{}, err
		}
		if where == "worker" && p.BoxWorkspace != "" {
			sess.Workspace = p.BoxWorkspace
		}
		gen = p.Generation
	}
	t := Turn{SessionID: sessionID, RunID: runID, IdempotencyKey: idempotencyKey, Placement: where,
		Model: model, Status: TurnRunning, CreatedAt: store.FormatTime(s.clock().Now())}
	err := s.cfg.DB.InTx(ctx, func(tx *sql.Tx) error {
		if s.cfg.Placements != nil {
			if err := s.cfg.Placements.ClaimTurnTx(ctx, tx, sessionID, gen, where == "worker", runID); err != nil {
				return err
			}
		}
		if err := tx.QueryRowContext(ctx, `SELECT COALESCE(MAX(run_epoch),0)+1 FROM turns WHERE session_id=?`, sessionID).Scan(&t.RunEpoch); err != nil {
			return err
		}
		if cont != nil {
			return s.continueTx(ctx, tx, &t, *cont)
		}
		// a turn moving live between owners goes on first: no message runs beside it
		moving, err := store.Strings(ctx, tx, `SELECT run_id FROM turns WHERE session_id=? AND status=?`, sessionID, string(TurnMoving))
		if err != nil {
			return err
		}
		if len(moving) > 0 {
			return fmt.Errorf("session %s: %w: its turn %s is moving live to the session's next owner and goes on there; send the message once it ends, or stop it with: openclaw session cancel %s",
				sessionID, placement.ErrBusy, moving[0], sessionID)
		}
		var key any
		if idempotencyKey != "" {
			key = idempotencyKey
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO turns(session_id, run_epoch, run_id, idempotency_key, placement, model, status, created_at) VALUES(?,?,?,?,?,?,?,?)`,
			sessionID, t.RunEpoch, t.RunID, key, t.Placement, t.Model, string(t.Status), t.CreatedAt); err != nil {
			return err
		}
		return turnEvent(ctx, tx, t.RunID, t.CreatedAt, "", t.Status, "admitted ("+where+")")
	})
	if err != nil {
		s.mu.Unlock()
	}
	return t, err
}

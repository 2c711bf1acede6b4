package sessions

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"sync"
	"time"

	"github.com/openclaw/cloudworkers/gateway/store"
	"github.com/openclaw/cloudworkers/internal/ids"
	"github.com/openclaw/cloudworkers/providers"
)

// Defaults of Config.
const (
	DefaultRetention        = 2000
	DefaultSubscriberBuffer = 256
	DefaultChangesRetention = 1024
	// DefaultAgent is the agent of a session created without one.
	DefaultAgent = "main"
	// MaxTitleLen bounds a session title, in bytes.
	MaxTitleLen = 512
)

// Config configures a Store.
type Config struct {
	DB *store.DB
	// Retention is how many live events are kept (in memory and in SQLite) per session for replay (default 2000).
	Retention int
	// SubscriberBuffer is how many items a subscriber may fall behind before it is dropped (default 256).
	SubscriberBuffer int
	// ChangesRetention is how many gateway-wide changes are kept for replay (default 1024).
	ChangesRetention int
	Log              *slog.Logger
	// Now is the clock (default time.Now).
	Now func() time.Time
	// Roots confine the workspaces sessions may name (the zero value refuses only the data dir's
	// and system directories; the gateway always sets workspaces.roots).
	Roots Roots
	// CheckModel, when set, refuses a model reference that is not in the catalog; Create calls
	// it before anything is written.
	CheckModel func(model string) error
}

func (c *Config) setDefaults() {
	if c.Retention == 0 {
		c.Retention = DefaultRetention
	}
	if c.SubscriberBuffer == 0 {
		c.SubscriberBuffer = DefaultSubscriberBuffer
	}
	if c.ChangesRetention == 0 {
		c.ChangesRetention = DefaultChangesRetention
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
}

// Validate reports a config that cannot work.
func (c Config) Validate() error {
	switch {
	case c.DB == nil:
		return errors.New("sessions: DB is required")
	case c.Retention < 1 || c.SubscriberBuffer < 1 || c.ChangesRetention < 1:
		return errors.New("sessions: Retention, SubscriberBuffer and ChangesRetention must be positive")
	}
	return nil
}

// PlacementState is where a session's agent loop runs, as the session shows it. It is derived from
// the session's binding (BindTx), never stored: the placement state machine owns the placement.
type PlacementState string

// Placement states.
const (
	// PlacementLocal is a session whose loop runs in the gateway.
	PlacementLocal PlacementState = "local"
	// PlacementWorker is a session bound to an environment's worker (see BindTx).
	PlacementWorker PlacementState = "worker"
)

// placementOf is the placement a session with this binding shows.
func placementOf(envID string) PlacementState {
	if envID != "" {
		return PlacementWorker
	}
	return PlacementLocal
}

// Session is one conversation: its metadata, transcript leaf and placement fields.
type Session struct {
	ID        string `json:"id"`
	Title     string `json:"title"`
	Agent     string `json:"agent"`
	Model     string `json:"model"` // model reference, "provider/model"
	Workspace string `json:"workspace"`
	// LeafID is the transcript entry the next commit appends under; "" for an empty transcript.
	LeafID            string         `json:"leafId"`
	Placement         PlacementState `json:"placement"`
	EnvironmentID     string         `json:"environmentId,omitempty"`
	OwnerEpoch        uint64         `json:"ownerEpoch"`
	LifecycleRevision uint64         `json:"lifecycleRevision"`
	// ParentSessionID and SpawnToolCallID name the session and tool call (sessions_spawn) that
	// spawned this one; SpawnDepth is 0 for a session nobody spawned, its parent's + 1 otherwise.
	ParentSessionID string `json:"parentSessionId,omitempty"`
	SpawnToolCallID string `json:"spawnToolCallId,omitempty"`
	SpawnDepth      int    `json:"spawnDepth,omitempty"`
	// ArchivedAt is when the session was archived (session archive): hidden from lists by
	// default and read-only; nil for a session that is not archived.
	ArchivedAt *time.Time `json:"archivedAt,omitempty"`
	CreatedAt  time.Time  `json:"createdAt"`
	UpdatedAt  time.Time  `json:"updatedAt"`
}

// CreateParams are the caller-chosen fields of a new session.
type CreateParams struct {
	Title     string `json:"title,omitempty"`
	Agent     string `json:"agent,omitempty"`
	Model     string `json:"model,omitempty"`
	Workspace string `json:"workspace,omitempty"`
	// Parent, ToolCallID and Depth are set by the agents package for a spawned child only (never
	// from an API body).
	Parent     string `json:"-"`
	ToolCallID string `json:"-"`
	Depth      int    `json:"-"`
	// BudgetUSD is the session's own budget: its tree's total spend (its own, its children's)
	// may not pass it (docs/operations.md, "Spend and budgets"). 0: none.
	BudgetUSD float64 `json:"budgetUsd,omitempty"`
}

// MaxBudgetUSD bounds a session's budget.
const MaxBudgetUSD = 1e6

// Change kinds on the gateway-wide changes feed. Other packages pass their own kinds to Notify.
const (
	ChangeSessionCreated = "session.created"
	ChangeSessionUpdated = "session.updated"
)

// Change is one item of the gateway-wide changes feed.
type Change struct {
	Cursor uint64    `json:"cursor"`
	Kind   string    `json:"kind"`
	ID     string    `json:"id"`
	At     time.Time `json:"at"`
}

func (c *Change) cursor() uint64 { return c.Cursor }

// Store is the session store. Both placements call its methods directly.
type Store struct {
	cfg     Config
	db      *store.DB
	changes *feed[*Change]

	mu     sync.Mutex
	live   map[string]*liveState
	closed bool

	// liveSQL are the statements of every live event, prepared once: on the writer
	// (store.DB.Prepare) and, for binding, on the read pool.
	liveSQL struct{ owner, insert, trim, cursor, binding *sql.Stmt }
}

// New returns a store over cfg.DB (already migrated by store.Open). Close releases subscribers.
func New(cfg Config) (*Store, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s := &Store{
		cfg:     cfg,
		db:      cfg.DB,
		changes: newFeed[*Change](cfg.ChangesRetention, cfg.SubscriberBuffer, 0),
		live:    map[string]*liveState{},
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for q, p := range map[string]**sql.Stmt{
		sqlLiveOwner: &s.liveSQL.owner, sqlLiveInsert: &s.liveSQL.insert, sqlLiveTrim: &s.liveSQL.trim, sqlLiveCursor: &s.liveSQL.cursor,
	} {
		var err error
		if *p, err = cfg.DB.Prepare(ctx, q); err != nil {
			return nil, fmt.Errorf("sessions: %w", err)
		}
	}
	var err error
	if s.liveSQL.binding, err = cfg.DB.R.PrepareContext(ctx, sqlWorkerBinding); err != nil {
		return nil, fmt.Errorf("sessions: prepare %.60q: %w", sqlWorkerBinding, err)
	}
	return s, nil
}

// Close ends every subscription. It does not close the database.
func (s *Store) Close(context.Context) error {
	s.mu.Lock()
	s.closed = true
	states := make([]*liveState, 0, len(s.live))
	for _, ls := range s.live {
		states = append(states, ls)
	}
	s.mu.Unlock()
	for _, ls := range states {
		ls.feed.close()
	}
	s.changes.close()
	return nil
}

func (s *Store) now() time.Time { return s.cfg.Now().UTC() }

// agentIDPattern is the form of an agent id: a name, never a path.
var agentIDPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$`)

// CheckParams refuses what Create would refuse before anything is written: an agent id that is
// not a name, a model the catalog does not have. The error is a *providers.FieldError.
func (s *Store) CheckParams(p CreateParams) error {
	if p.Agent != "" && !agentIDPattern.MatchString(p.Agent) {
		return providers.Fieldf("agent", "must be 1-64 letters, digits, '_' or '-', starting with a letter or digit, got %.40q", p.Agent)
	}
	if !(p.BudgetUSD >= 0 && p.BudgetUSD <= MaxBudgetUSD) { // NaN fails both
		return providers.Fieldf("budgetUsd", "must be a number of US dollars from 0 (none) to %g, got %v", MaxBudgetUSD, p.BudgetUSD)
	}
	if p.Model != "" && s.cfg.CheckModel != nil {
		if err := s.cfg.CheckModel(p.Model); err != nil {
			return providers.Fieldf("model", "%.80q is not in the model catalog (see `openclaw models list`): %v", p.Model, err)
		}
	}
	return nil
}

// Roots are the workspace roots sessions are confined to.
func (s *Store) Roots() Roots { return s.cfg.Roots }

// Create inserts a new session, after CheckParams.
func (s *Store) Create(ctx context.Context, p CreateParams) (Session, error) {
	if len(p.Title) > MaxTitleLen {
		return Session{}, fmt.Errorf("create session: title longer than %d bytes", MaxTitleLen)
	}
	if p.Agent == "" {
		p.Agent = DefaultAgent
	}
	if err := s.CheckParams(p); err != nil {
		return Session{}, err
	}
	now := store.ParseTime(store.FormatTime(s.now()))
	ses := Session{
		ID: ids.New("ses_", 12), Title: p.Title, Agent: p.Agent, Model: p.Model, Workspace: p.Workspace,
		Placement: PlacementLocal, OwnerEpoch: 1, CreatedAt: now, UpdatedAt: now,
		ParentSessionID: p.Parent, SpawnToolCallID: p.ToolCallID, SpawnDepth: p.Depth,
	}
	err := s.db.InTx(ctx, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO sessions(id, title, agent, model, workspace,
			owner_epoch, parent_session_id, spawn_tool_call_id, spawn_depth, created_at, updated_at) VALUES(?,?,?,?,?,?,?,?,?,?,?)`,
			ses.ID, ses.Title, ses.Agent, ses.Model, ses.Workspace, ses.OwnerEpoch,
			ses.ParentSessionID, ses.SpawnToolCallID, ses.SpawnDepth,
			store.FormatTime(now), store.FormatTime(now))
		if err != nil {
			return err
		}
		if p.BudgetUSD > 0 {
			if _, err := tx.ExecContext(ctx, `INSERT INTO session_budgets(session_id, usd) VALUES(?,?)`, ses.ID, p.BudgetUSD); err != nil {
				return err
			}
		}
		return store.Audit(ctx, tx, s.now(), "session.create", "", fmt.Sprintf("session %s agent %s model %q", ses.ID, ses.Agent, ses.Model))
	})
	if err != nil {
		return Session{}, fmt.Errorf("create session: %w", err)
	}
	s.Notify(ChangeSessionCreated, ses.ID)
	return ses, nil
}

const sessionCols = `id, title, agent, model, workspace, leaf_id, environment_id, owner_epoch,
	lifecycle_revision, parent_session_id, spawn_tool_call_id, spawn_depth, archived_at, created_at, updated_at`

type scanner = store.Scanner

func scanSession(r scanner) (Session, error) {
	var ses Session
	var archived, created, updated string
	err := r.Scan(&ses.ID, &ses.Title, &ses.Agent, &ses.Model, &ses.Workspace, &ses.LeafID,
		&ses.EnvironmentID, &ses.OwnerEpoch, &ses.LifecycleRevision, &ses.ParentSessionID, &ses.SpawnToolCallID,
		&ses.SpawnDepth, &archived, &created, &updated)
	if archived != "" {
		at := store.ParseTime(archived)
		ses.ArchivedAt = &at
	}
	ses.Placement = placementOf(ses.EnvironmentID)
	ses.CreatedAt, ses.UpdatedAt = store.ParseTime(created), store.ParseTime(updated)
	return ses, err
}

// Get returns one session; an unknown id is an *Error wrapping ErrNotFound.
func (s *Store) Get(ctx context.Context, id string) (Session, error) {
	ses, err := scanSession(s.db.R.QueryRowContext(ctx, `SELECT `+sessionCols+` FROM sessions WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return Session{}, notFound(id)
	}
	if err != nil {
		return Session{}, fmt.Errorf("get session %s: %w", id, err)
	}
	return ses, nil
}

// List returns every session, most recently updated first.
func (s *Store) List(ctx context.Context) ([]Session, error) {
	out, err := store.Query(ctx, s.db.R, scanSession, `SELECT `+sessionCols+` FROM sessions ORDER BY updated_at DESC, id`)
	if err != nil {
		return nil, fmt.Errorf("list sessions: %w", err)
	}
	return out, nil
}

// AdvanceOwnerEpoch fences the session's current owner: frames carrying the old epoch are rejected with
// epoch-mismatch from now on. It returns the new epoch. (Step 6 of the migration barrier.)
func (s *Store) AdvanceOwnerEpoch(ctx context.Context, id string) (uint64, error) {
	var epoch uint64
	err := s.db.InTx(ctx, func(tx *sql.Tx) error {
		err := tx.QueryRowContext(ctx, `UPDATE sessions SET owner_epoch = owner_epoch + 1, updated_at = ?
			WHERE id = ? RETURNING owner_epoch`, store.FormatTime(s.now()), id).Scan(&epoch)
		if errors.Is(err, sql.ErrNoRows) {
			return notFound(id)
		}
		if err != nil {
			return err
		}
		return store.Audit(ctx, tx, s.now(), "session.fence", "", fmt.Sprintf("session %s owner epoch %d", id, epoch))
	})
	if err != nil {
		return 0, fmt.Errorf("advance owner epoch of %s: %w", id, err)
	}
	s.Notify(ChangeSessionUpdated, id)
	return epoch, nil
}

// Notify publishes a change on the gateway-wide feed (GET /api/v1/events). It never blocks.
func (s *Store) Notify(kind, id string) {
	at := s.now()
	s.changes.publishNext(func(cursor uint64) *Change { return &Change{Cursor: cursor, Kind: kind, ID: id, At: at} })
}

// SubscribeChanges follows the changes feed after cursor (0: everything retained).
func (s *Store) SubscribeChanges(cursor uint64) *Subscription[*Change] {
	return s.changes.subscribe(cursor)
}

// ChangesCursor is the cursor of the newest change: SubscribeChanges from it sees only later ones.
func (s *Store) ChangesCursor() uint64 { return s.changes.lastCursor() }

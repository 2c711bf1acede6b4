// Package profiles stores provider profiles: how to lease machines and how to treat them.
package profiles

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/openclaw/cloudworkers/gateway/store"
	"github.com/openclaw/cloudworkers/internal/clock"
	"github.com/openclaw/cloudworkers/providers"
)

// ErrInUse is returned when a profile still has live environments.
var ErrInUse = errors.New("profile has live environments")

// Store reads and writes profiles.
type Store struct {
	db       *store.DB
	registry providers.Registry
	log      *slog.Logger
	// Clock dates the rows (the real clock when nil).
	Clock clock.Clock
}

// New returns a profile store that validates against the given providers.
func New(db *store.DB, registry providers.Registry, log *slog.Logger) *Store {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Store{db: db, registry: registry, log: log}
}

// Prepare fills defaults, validates and attaches provider warnings.
func (s *Store) Prepare(p *providers.Profile) error {
	return s.PrepareContext(context.Background(), p)
}

// PrepareContext is Prepare with the provider's validation bounded by ctx.
func (s *Store) PrepareContext(ctx context.Context, p *providers.Profile) error {
	p.SetDefaults()
	if err := s.registry.ValidateProfileContext(ctx, p); err != nil {
		return err
	}
	p.Warnings = nil
	if w, ok := s.registry[p.Provider].(providers.Warner); ok {
		p.Warnings = w.ProfileWarnings(*p)
	}
	return nil
}

// Put creates or replaces a profile. created reports whether it is new.
func (s *Store) Put(ctx context.Context, p *providers.Profile) (created bool, err error) {
	if err := s.Prepare(p); err != nil {
		return false, err
	}
	err = s.db.InTx(ctx, func(tx *sql.Tx) error {
		created, err = s.putTx(ctx, tx, p)
		return err
	})
	if err != nil {
		return false, fmt.Errorf("store profile %s: %w", p.ID, err)
	}
	s.logWarnings(p)
	return created, nil
}

// Apply deletes and creates or replaces profiles all at once: every profile to put is prepared
// (validated) first, then the deletes and puts run in one transaction, so a refusal (a bad
// profile, a profile in use) leaves every profile as it was.
//
// guard, when not nil, is called inside the transaction with every profile as it is there,
// before any change: an error from it (the profiles changed since the caller read them) refuses
// the whole call.
func (s *Store) Apply(ctx context.Context, puts []*providers.Profile, deletes []string, guard func([]providers.Profile) error) error {
	for _, p := range puts {
		if err := s.PrepareContext(ctx, p); err != nil {
			return fmt.Errorf("profile %s: %w", p.ID, err)
		}
	}
	err := s.db.InTx(ctx, func(tx *sql.Tx) error {
		if guard != nil {
			now, err := store.Query(ctx, tx, s.scan, `SELECT `+cols+` FROM profiles ORDER BY id`)
			if err != nil {
				return err
			}
			if err := guard(now); err != nil {
				return err
			}
		}
		for _, id := range deletes {
			if err := s.deleteTx(ctx, tx, id); err != nil {
				return err
			}
		}
		for _, p := range puts {
			if _, err := s.putTx(ctx, tx, p); err != nil {
				return fmt.Errorf("store profile %s: %w", p.ID, err)
			}
		}
		return nil
	})
	if err == nil {
		for _, p := range puts {
			s.logWarnings(p)
		}
	}
	return err
}

// logWarnings logs a stored profile's provider warnings.
func (s *Store) logWarnings(p *providers.Profile) {
	for _, w := range p.Warnings {
		s.log.Warn("profile warning", "profile", p.ID, "provider", p.Provider, "warning", w)
	}
}

// putTx writes a prepared profile.
func (s *Store) putTx(ctx context.Context, tx *sql.Tx, p *providers.Profile) (created bool, err error) {
	hyg, _ := json.Marshal(p.Hygiene)
	if p.Hygiene == nil {
		hyg = []byte("{}")
	}
	policy, _ := json.Marshal(storedPolicy{Setup: p.Setup, Fallback: p.Fallback, CapacityPattern: p.CapacityPattern, Checkpoint: p.Checkpoint, Publish: p.Publish, Git: p.Git, Price: p.Price, Pool: p.Pool})
	inc, _ := json.Marshal(nonNil(p.Sync.Include))
	exc, _ := json.Marshal(nonNil(p.Sync.Exclude))
	now := store.FormatTime(clock.Or(s.Clock).Now())
	var exists int
	if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM profiles WHERE id=?`, p.ID).Scan(&exists); err != nil {
		return false, err
	}
	created = exists == 0
	_, err = tx.ExecContext(ctx, `INSERT INTO profiles(id, provider, settings, idle_timeout_ns, ttl_ns, sync_include, sync_exclude,
		sync_max_delete_share, sync_max_inbound_bytes, sync_max_inbound_entries, sync_max_inbound_file_bytes, max_environments, hygiene, policy, created_at, updated_at)
		VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)
		ON CONFLICT(id) DO UPDATE SET provider=excluded.provider, settings=excluded.settings,
		idle_timeout_ns=excluded.idle_timeout_ns, ttl_ns=excluded.ttl_ns, sync_include=excluded.sync_include,
		sync_exclude=excluded.sync_exclude, sync_max_delete_share=excluded.sync_max_delete_share,
		sync_max_inbound_bytes=excluded.sync_max_inbound_bytes, sync_max_inbound_entries=excluded.sync_max_inbound_entries,
		sync_max_inbound_file_bytes=excluded.sync_max_inbound_file_bytes, max_environments=excluded.max_environments, hygiene=excluded.hygiene,
		policy=excluded.policy, updated_at=excluded.updated_at`,
		p.ID, p.Provider, string(p.Settings), int64(p.Lifetime.IdleTimeout), int64(p.Lifetime.TTL),
		string(inc), string(exc), p.Sync.MaxDeleteShare, p.Sync.MaxInboundBytes, p.Sync.MaxInboundEntries, p.Sync.MaxInboundFileBytes,
		p.MaxEnvironments, string(hyg), string(policy), now, now)
	if err != nil {
		return false, err
	}
	verb := "profile.update"
	if created {
		verb = "profile.create"
	}
	return created, store.Audit(ctx, tx, clock.Or(s.Clock).Now(), verb, "", fmt.Sprintf("profile %s provider %s", p.ID, p.Provider))
}

// EnsureBuiltin creates the profile if it does not exist yet, leaving an existing one alone.
func (s *Store) EnsureBuiltin(ctx context.Context, p providers.Profile) error {
	_, err := s.Get(ctx, p.ID)
	if err == nil {
		return nil
	}
	if !errors.Is(err, store.ErrNotFound) {
		return err
	}
	_, err = s.Put(ctx, &p)
	return err
}

const cols = `id, provider, settings, idle_timeout_ns, ttl_ns, sync_include, sync_exclude, sync_max_delete_share,
	sync_max_inbound_bytes, sync_max_inbound_entries, sync_max_inbound_file_bytes, max_environments, hygiene, policy`

// storedPolicy is the policy column: the setup phase, fallback, checkpoint cadence, publish
// policy, git identity, machine price and prepared pool.
type storedPolicy struct {
	Setup           *providers.Setup        `json:"setup,omitempty"`
	Fallback        []string                `json:"fallback,omitempty"`
	CapacityPattern string                  `json:"capacityPattern,omitempty"`
	Checkpoint      providers.Checkpoint    `json:"checkpoint,omitzero"`
	Publish         providers.PublishPolicy `json:"publish,omitzero"`
	Git             providers.GitPolicy     `json:"git,omitzero"`
	Price           providers.Price         `json:"price,omitzero"`
	Pool            providers.Pool          `json:"pool,omitzero"`
}

func (s *Store) scan(row interface{ Scan(...any) error }) (providers.Profile, error) {
	var p providers.Profile
	var settings, inc, exc, hyg, policy string
	var idle, ttl int64
	if err := row.Scan(&p.ID, &p.Provider, &settings, &idle, &ttl, &inc, &exc, &p.Sync.MaxDeleteShare,
		&p.Sync.MaxInboundBytes, &p.Sync.MaxInboundEntries, &p.Sync.MaxInboundFileBytes, &p.MaxEnvironments, &hyg, &policy); err != nil {
		return p, err
	}
	var pol storedPolicy
	_ = json.Unmarshal([]byte(policy), &pol)
	p.Setup, p.Fallback, p.CapacityPattern, p.Checkpoint, p.Publish, p.Git, p.Price, p.Pool = pol.Setup, pol.Fallback, pol.CapacityPattern, pol.Checkpoint, pol.Publish, pol.Git, pol.Price, pol.Pool
	p.Settings = json.RawMessage(settings)
	p.Lifetime = providers.Lifetime{IdleTimeout: providers.Duration(idle), TTL: providers.Duration(ttl)}
	_ = json.Unmarshal([]byte(inc), &p.Sync.Include)
	_ = json.Unmarshal([]byte(exc), &p.Sync.Exclude)
	_ = json.Unmarshal([]byte(hyg), &p.Hygiene)
	if len(p.Hygiene) == 0 {
		p.Hygiene = nil
	}
	if w, ok := s.registry[p.Provider].(providers.Warner); ok {
		p.Warnings = w.ProfileWarnings(p)
	}
	return p, nil
}

// Get returns one profile, or store.ErrNotFound.
func (s *Store) Get(ctx context.Context, id string) (providers.Profile, error) {
	p, err := s.scan(s.db.R.QueryRowContext(ctx, `SELECT `+cols+` FROM profiles WHERE id=?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return p, fmt.Errorf("profile %q: %w", id, store.ErrNotFound)
	}
	return p, err
}

// List returns all profiles ordered by id.
func (s *Store) List(ctx context.Context) ([]providers.Profile, error) {
	return store.Query(ctx, s.db.R, s.scan, `SELECT `+cols+` FROM profiles ORDER BY id`)
}

// Delete removes a profile that has no live environment.
func (s *Store) Delete(ctx context.Context, id string) error {
	return s.db.InTx(ctx, func(tx *sql.Tx) error { return s.deleteTx(ctx, tx, id) })
}

func (s *Store) deleteTx(ctx context.Context, tx *sql.Tx, id string) error {
	var live int
	if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM environments WHERE profile_id=? AND state NOT IN ('destroyed','failed','orphaned')`, id).Scan(&live); err != nil {
		return err
	}
	if live > 0 {
		return fmt.Errorf("profile %q: %w (%d); destroy them first", id, ErrInUse, live)
	}
	res, err := tx.ExecContext(ctx, `DELETE FROM profiles WHERE id=?`, id)
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("profile %q: %w", id, store.ErrNotFound)
	}
	return store.Audit(ctx, tx, clock.Or(s.Clock).Now(), "profile.delete", "", "profile "+id)
}

// File is the YAML shape of `openclaw profile apply -f`.
type File struct {
	Profiles []providers.Profile `yaml:"profiles"`
}

// ParseYAML decodes a profiles file strictly, naming the bad field of the bad profile and the
// line it is on.
func ParseYAML(r io.Reader) ([]providers.Profile, error) {
	dec := yaml.NewDecoder(r)
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, errors.New("profiles file is empty")
		}
		return nil, fmt.Errorf("profiles file: %w", err)
	}
	top := &doc
	if top.Kind == yaml.DocumentNode && len(top.Content) == 1 {
		top = top.Content[0]
	}
	if top.Kind != yaml.MappingNode {
		return nil, fmt.Errorf("line %d: profiles file must be a mapping with a top-level 'profiles:' list", top.Line)
	}
	var list *yaml.Node
	for i := 0; i+1 < len(top.Content); i += 2 {
		if k := top.Content[i]; k.Value != "profiles" {
			return nil, fmt.Errorf("line %d: unknown top-level field %q (expected 'profiles:')", k.Line, k.Value)
		}
		list = top.Content[i+1]
	}
	if list == nil || len(list.Content) == 0 {
		return nil, errors.New("profiles file has no profiles (expected a top-level 'profiles:' list)")
	}
	if list.Kind != yaml.SequenceNode {
		return nil, fmt.Errorf("line %d: profiles must be a list", list.Line)
	}
	out := make([]providers.Profile, len(list.Content))
	seen := map[string]bool{}
	for i, item := range list.Content {
		p := &out[i]
		if err := item.Decode(p); err != nil {
			if strings.Contains(err.Error(), "line ") {
				return nil, fmt.Errorf("profiles[%d]: %w", i, err)
			}
			return nil, fmt.Errorf("line %d: profiles[%d]: %w", fieldLine(item, err), i, err)
		}
		if seen[p.ID] {
			return nil, fmt.Errorf("line %d: %w", item.Line, providers.Fieldf(fmt.Sprintf("profiles[%d].id", i), "duplicate id %q", p.ID))
		}
		seen[p.ID] = true
	}
	return out, nil
}

// fieldLine is the line of the field a *providers.FieldError names inside a profile's node (the
// profile's own line when it is not found).
func fieldLine(n *yaml.Node, err error) int {
	var fe *providers.FieldError
	if !errors.As(err, &fe) {
		return n.Line
	}
	line := n.Line
	for _, part := range strings.Split(fe.Field, ".") {
		if n.Kind != yaml.MappingNode {
			break
		}
		found := false
		for i := 0; i+1 < len(n.Content); i += 2 {
			if n.Content[i].Value == part {
				line, n, found = n.Content[i].Line, n.Content[i+1], true
				break
			}
		}
		if !found {
			break
		}
	}
	return line
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

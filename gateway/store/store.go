// Package store owns the gateway's SQLite database: connections, migrations and transactions.
package store

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	_ "modernc.org/sqlite" // registers the "sqlite" driver
)

//go:embed migrations/*.sql
var migrationFS embed.FS

// DB is the gateway database: one writer connection and a pool of readers.
type DB struct {
	// W is the single writer connection. Every change goes through it (via InTx).
	W *sql.DB
	// R is the read pool.
	R    *sql.DB
	path string
	// group queues the callers of GroupTx.
	group group
	// stmts are the statements Prepare prepared on W, by query.
	smu   sync.Mutex
	stmts map[string]*sql.Stmt
	// savepoint, rollbackTo and release are GroupTx's per-caller savepoint statements.
	savepoint, rollbackTo, release *sql.Stmt
}

// ErrNotFound is returned when a row does not exist.
var ErrNotFound = errors.New("not found")

// Open opens (creating if needed) the database at path and applies pending migrations.
func Open(ctx context.Context, path string) (*DB, error) {
	dsn := func(mode string) string {
		q := url.Values{}
		q.Add("_pragma", "journal_mode(WAL)")
		q.Add("_pragma", "busy_timeout(10000)")
		q.Add("_pragma", "synchronous(FULL)")
		q.Add("_pragma", "foreign_keys(ON)")
		q.Set("_txlock", "immediate")
		if mode != "" {
			q.Set("mode", mode)
		}
		return "file:" + path + "?" + q.Encode()
	}
	// SQLite gives the -wal and -shm files the database file's mode: create it 0600 first.
	if f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600); err == nil {
		f.Close()
	} else {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	w, err := sql.Open("sqlite", dsn(""))
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	w.SetMaxOpenConns(1)
	w.SetMaxIdleConns(1)
	w.SetConnMaxLifetime(0)
	if err := w.PingContext(ctx); err != nil {
		w.Close()
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	db := &DB{W: w, path: path, stmts: map[string]*sql.Stmt{}}
	if err := db.migrate(ctx); err != nil {
		w.Close()
		return nil, err
	}
	for q, p := range map[string]**sql.Stmt{`SAVEPOINT group_op`: &db.savepoint, `ROLLBACK TO group_op`: &db.rollbackTo, `RELEASE group_op`: &db.release} {
		if *p, err = db.Prepare(ctx, q); err != nil {
			w.Close()
			return nil, err
		}
	}
	r, err := sql.Open("sqlite", dsn("ro"))
	if err != nil {
		w.Close()
		return nil, fmt.Errorf("open %s read pool: %w", path, err)
	}
	// Every reader stays open: a connection closed when idle is opened again (its pragmas run, its
	// statements are parsed again) on the next burst; that churn was 9 % of the bench gateway's CPU.
	r.SetMaxOpenConns(readConns)
	r.SetMaxIdleConns(readConns)
	r.SetConnMaxLifetime(0)
	db.R = r
	return db, nil
}

// readConns is the size of the read pool.
const readConns = 4

// Path is the database file.
func (db *DB) Path() string { return db.path }

// Close closes both pools.
func (db *DB) Close() error {
	return errors.Join(db.R.Close(), db.W.Close())
}

// Prepare returns query prepared once on the writer connection, for hot paths: run inside a
// transaction through tx.StmtContext it is not parsed again (re-parsing SQL on every Exec was 11.6 %
// of the bench gateway's CPU). Call it outside any transaction (at setup): preparing waits for the
// writer connection. The statement lives until Close; preparing the same query again returns it.
func (db *DB) Prepare(ctx context.Context, query string) (*sql.Stmt, error) {
	db.smu.Lock()
	defer db.smu.Unlock()
	if st, ok := db.stmts[query]; ok {
		return st, nil
	}
	st, err := db.W.PrepareContext(ctx, query)
	if err != nil {
		return nil, fmt.Errorf("prepare %.60q: %w", query, err)
	}
	db.stmts[query] = st
	return st, nil
}

// Querier is what a query runs on: the read pool, the writer or a transaction.
type Querier interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// Scanner is a row being read: *sql.Row or *sql.Rows.
type Scanner = interface{ Scan(dest ...any) error }

// Query runs a query and returns every row read with scan, in order (an empty, non-nil slice when
// there is none, so that it encodes as []).
func Query[T any](ctx context.Context, q Querier, scan func(Scanner) (T, error), query string, args ...any) ([]T, error) {
	rows, err := q.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []T{}
	for rows.Next() {
		v, err := scan(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, rows.Err()
}

// Strings runs a query of one text column and returns its values in order.
func Strings(ctx context.Context, q Querier, query string, args ...any) ([]string, error) {
	return Query(ctx, q, func(r Scanner) (string, error) {
		var s string
		return s, r.Scan(&s)
	}, query, args...)
}

// Reader is the pool reads go through (R), for packages that take the database as an interface.
func (db *DB) Reader() *sql.DB { return db.R }

// InTx runs fn in one write transaction, committing when fn returns nil.
func (db *DB) InTx(ctx context.Context, fn func(tx *sql.Tx) error) error {
	tx, err := db.W.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	if err := fn(tx); err != nil {
		_ = tx.Rollback()
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}

type migration struct {
	version int
	name    string
	sql     string
}

func loadMigrations() ([]migration, error) {
	entries, err := fs.ReadDir(migrationFS, "migrations")
	if err != nil {
		return nil, err
	}
	var ms []migration
	for _, e := range entries {
		num, _, ok := strings.Cut(e.Name(), "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil {
			return nil, fmt.Errorf("migration %s: name must start with a number and '_'", e.Name())
		}
		b, err := migrationFS.ReadFile("migrations/" + e.Name())
		if err != nil {
			return nil, err
		}
		ms = append(ms, migration{version: v, name: e.Name(), sql: string(b)})
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].version < ms[j].version })
	for i := range ms {
		if ms[i].version != i+1 {
			return nil, fmt.Errorf("migration %s: expected number %d", ms[i].name, i+1)
		}
	}
	return ms, nil
}

func (db *DB) migrate(ctx context.Context) error {
	ms, err := loadMigrations()
	if err != nil {
		return err
	}
	if _, err := db.W.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
		version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT NOT NULL)`); err != nil {
		return fmt.Errorf("create schema_migrations: %w", err)
	}
	var current int
	if err := db.W.QueryRowContext(ctx, `SELECT COALESCE(MAX(version),0) FROM schema_migrations`).Scan(&current); err != nil {
		return fmt.Errorf("read schema version: %w", err)
	}
	if current > len(ms) {
		return fmt.Errorf("database schema version %d is newer than this binary knows (%d): upgrade openclaw", current, len(ms))
	}
	for _, m := range ms[current:] {
		err := db.InTx(ctx, func(tx *sql.Tx) error {
			if _, err := tx.ExecContext(ctx, m.sql); err != nil {
				return fmt.Errorf("apply migration %s: %w", m.name, err)
			}
			_, err := tx.ExecContext(ctx, `INSERT INTO schema_migrations(version,name,applied_at) VALUES(?,?,?)`,
				m.version, m.name, now())
			return err
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// TimeFormat is how timestamps are stored: UTC RFC 3339 with milliseconds, sortable as text.
const TimeFormat = "2006-01-02T15:04:05.000Z07:00"

// now is the system clock's time for the rows the store dates itself (migrations, audit rows,
// which are written inside other packages' transactions); components date their own rows with
// their injected clock (FormatTime(clock.Now())).
func now() string { return FormatTime(time.Now()) }

// FormatTime formats t for storage; the zero time is stored as "".
func FormatTime(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(TimeFormat)
}

// ParseTime parses a stored timestamp; "" is the zero time.
func ParseTime(s string) time.Time {
	if s == "" {
		return time.Time{}
	}
	t, err := time.Parse(TimeFormat, s)
	if err != nil {
		t, _ = time.Parse(time.RFC3339Nano, s)
	}
	return t
}

// Audit records an audited action in the same transaction as the change it explains, dated at
// (the caller's clock, so that a test's clock dates audit rows as it dates the rest).
func Audit(ctx context.Context, tx *sql.Tx, at time.Time, kind, environmentID, detail string) error {
	_, err := tx.ExecContext(ctx, `INSERT INTO audit(at, kind, environment_id, detail) VALUES(?,?,?,?)`,
		FormatTime(at), kind, environmentID, detail)
	if err != nil {
		return fmt.Errorf("audit %s: %w", kind, err)
	}
	return nil
}

// AuditEntry is one audit row.
type AuditEntry struct {
	ID            int64  `json:"id"`
	At            string `json:"at"`
	Kind          string `json:"kind"`
	EnvironmentID string `json:"environmentId,omitempty"`
	Detail        string `json:"detail"`
}

// ListAuditBefore returns up to limit audit rows with an id below beforeID (0: from the newest),
// newest first, optionally for one environment: a page of GET /audit.
func (db *DB) ListAuditBefore(ctx context.Context, environmentID string, beforeID int64, limit int) ([]AuditEntry, error) {
	q := `SELECT id, at, kind, environment_id, detail FROM audit WHERE 1=1`
	var args []any
	if environmentID != "" {
		q += ` AND environment_id = ?`
		args = append(args, environmentID)
	}
	if beforeID > 0 {
		q += ` AND id < ?`
		args = append(args, beforeID)
	}
	q += ` ORDER BY id DESC LIMIT ?`
	args = append(args, limit)
	out, err := Query(ctx, db.R, func(sc Scanner) (AuditEntry, error) {
		var a AuditEntry
		err := sc.Scan(&a.ID, &a.At, &a.Kind, &a.EnvironmentID, &a.Detail)
		return a, err
	}, q, args...)
	if err != nil {
		return nil, fmt.Errorf("list audit: %w", err)
	}
	return out, nil
}

// ListAudit returns audit rows, newest last, optionally for one environment.
func (db *DB) ListAudit(ctx context.Context, environmentID string, limit int) ([]AuditEntry, error) {
	if limit <= 0 {
		limit = 1000
	}
	q := `SELECT id, at, kind, environment_id, detail FROM audit`
	var args []any
	if environmentID != "" {
		q += ` WHERE environment_id = ?`
		args = append(args, environmentID)
	}
	q += ` ORDER BY id DESC LIMIT ?`
	args = append(args, limit)
	rows, err := db.R.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []AuditEntry
	for rows.Next() {
		var a AuditEntry
		if err := rows.Scan(&a.ID, &a.At, &a.Kind, &a.EnvironmentID, &a.Detail); err != nil {
			return nil, err
		}
		out = append(out, a)
	}
	for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
		out[i], out[j] = out[j], out[i]
	}
	return out, rows.Err()
}

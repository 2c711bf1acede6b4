package sessions

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/openclaw/cloudworkers/gateway/store"
)

// Change kinds of archive and removal on the gateway-wide changes feed.
const (
	ChangeSessionArchived = "session.archived"
	ChangeSessionRemoved  = "session.removed"
)

// ErrArchived refuses a change to an archived session (it is read-only until unarchived).
var ErrArchived = errors.New("session is archived")

// ArchivedError is the refusal of a message (or a dispatch) to an archived session; it names the
// way out.
func ArchivedError(id string) error {
	return fmt.Errorf("session %s is archived (read-only): unarchive it first with `openclaw session unarchive %s`: %w", id, id, ErrArchived)
}

// SetArchived archives (archived true) or unarchives a session. It is idempotent and returns the
// session as it is now.
func (s *Store) SetArchived(ctx context.Context, id string, archived bool) (Session, error) {
	at := ""
	if archived {
		at = store.FormatTime(s.now())
	}
	err := s.db.InTx(ctx, func(tx *sql.Tx) error {
		// an already archived session keeps its first date
		res, err := tx.ExecContext(ctx, `UPDATE sessions SET archived_at = CASE WHEN ? = '' THEN '' WHEN archived_at <> '' THEN archived_at ELSE ? END,
			updated_at = ? WHERE id = ?`, at, at, store.FormatTime(s.now()), id)
		if err != nil {
			return err
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return notFound(id)
		}
		what := "session.unarchive"
		if archived {
			what = "session.archive"
		}
		return store.Audit(ctx, tx, s.now(), what, "", "session "+id)
	})
	if err != nil {
		return Session{}, err
	}
	if archived {
		s.Notify(ChangeSessionArchived, id)
	} else {
		s.Notify(ChangeSessionUpdated, id)
	}
	return s.Get(ctx, id)
}

// ChildIDs lists the sessions spawned by id that still exist.
func (s *Store) ChildIDs(ctx context.Context, id string) ([]string, error) {
	return store.Query(ctx, s.db.R, func(r store.Scanner) (string, error) {
		var c string
		return c, r.Scan(&c)
	}, `SELECT id FROM sessions WHERE parent_session_id = ? ORDER BY created_at, id`, id)
}

// DeleteTx deletes a session and everything this package keeps of it (its transcript, commit
// results, live events and ACK cursor) in tx. Call Forget after tx commits.
func (s *Store) DeleteTx(ctx context.Context, tx *sql.Tx, id string) error {
	for _, q := range []string{
		`DELETE FROM live_events WHERE session_id = ?`,
		`DELETE FROM live_cursors WHERE session_id = ?`,
		`DELETE FROM transcript_commits WHERE session_id = ?`,
		`DELETE FROM transcript_entries WHERE session_id = ?`,
	} {
		if _, err := tx.ExecContext(ctx, q, id); err != nil {
			return fmt.Errorf("remove session %s: %w", id, err)
		}
	}
	if _, err := tx.ExecContext(ctx, `DELETE FROM session_budgets WHERE session_id = ?`, id); err != nil {
		return err
	}
	res, err := tx.ExecContext(ctx, `DELETE FROM sessions WHERE id = ?`, id)
	if err != nil {
		return fmt.Errorf("remove session %s: %w", id, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return notFound(id)
	}
	return store.Audit(ctx, tx, s.now(), "session.remove", "", "session "+id)
}

// Forget drops the in-memory live state of a removed session: its subscribers are ended.
func (s *Store) Forget(id string) {
	s.mu.Lock()
	ls, ok := s.live[id]
	delete(s.live, id)
	s.mu.Unlock()
	if ok {
		select {
		case <-ls.ready:
			ls.feed.close()
		default: // still loading: it finds no session and is dropped by liveFor
		}
	}
	s.Notify(ChangeSessionRemoved, id)
}

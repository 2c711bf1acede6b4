package sessions

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	"github.com/openclaw/cloudworkers/gateway/store"
)

// insertLiveEvent stores rec in the transaction that acknowledges it and drops the session's rows
// that fell out of retention, so live_events holds at most Config.Retention rows per session.
func (s *Store) insertLiveEvent(ctx context.Context, tx *sql.Tx, owner uint64, rec *LiveRecord) error {
	ev, err := json.Marshal(rec.Event)
	if err != nil {
		return fmt.Errorf("encode live event: %w", err)
	}
	_, err = tx.StmtContext(ctx, s.liveSQL.insert).ExecContext(ctx, rec.SessionID, rec.Cursor, owner, rec.RunEpoch, rec.RunID, rec.Seq, store.FormatTime(rec.At), string(ev))
	if err != nil {
		return fmt.Errorf("store live event: %w", err)
	}
	if keep := uint64(s.cfg.Retention); rec.Cursor > keep {
		if _, err := tx.StmtContext(ctx, s.liveSQL.trim).ExecContext(ctx, rec.SessionID, rec.Cursor-keep); err != nil {
			return fmt.Errorf("trim live events: %w", err)
		}
	}
	return nil
}

// catchUpLive brings ls up to SQLite: the ACK cursor, and the retained events after the newest Cursor
// the feed has, published in order (each Cursor once). The caller holds ls's lock, or ls is not yet
// visible; the session's live rows are written only under that lock, so the two reads agree.
func (s *Store) catchUpLive(ctx context.Context, id string, ls *liveState) error {
	var owner, run, acked, stream uint64
	var runID string
	err := s.db.R.QueryRowContext(ctx, `SELECT owner_epoch, run_epoch, run_id, acked_seq, stream_seq FROM live_cursors
		WHERE session_id = ?`, id).Scan(&owner, &run, &runID, &acked, &stream)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("load live cursor of %s: %w", id, err)
	}
	recs, err := s.retainedLive(ctx, id, ls.feed.lastCursor())
	if err != nil {
		return err
	}
	ls.feed.mu.Lock()
	for _, r := range recs {
		if r.Cursor > ls.feed.last {
			ls.feed.publishLocked(r)
		}
	}
	// Events acknowledged before live_events existed, or trimmed, are announced to subscribers as missed.
	ls.feed.last = max(ls.feed.last, stream)
	ls.feed.mu.Unlock()
	ls.owner, ls.run, ls.runID, ls.acked, ls.stream = owner, run, runID, acked, stream
	ls.stale = false
	return nil
}

// retainedLive returns the newest Config.Retention stored events of a session after cursor, oldest first.
func (s *Store) retainedLive(ctx context.Context, id string, after uint64) ([]*LiveRecord, error) {
	rows, err := s.db.R.QueryContext(ctx, `SELECT stream_seq, run_epoch, run_id, seq, at, event FROM live_events
		WHERE session_id = ? AND stream_seq > ? ORDER BY stream_seq DESC LIMIT ?`, id, after, s.cfg.Retention)
	if err != nil {
		return nil, fmt.Errorf("load live events of %s: %w", id, err)
	}
	defer rows.Close()
	var out []*LiveRecord
	for rows.Next() {
		r := &LiveRecord{SessionID: id}
		var at, ev string
		if err := rows.Scan(&r.Cursor, &r.RunEpoch, &r.RunID, &r.Seq, &at, &ev); err != nil {
			return nil, fmt.Errorf("load live events of %s: %w", id, err)
		}
		if err := json.Unmarshal([]byte(ev), &r.Event); err != nil {
			return nil, fmt.Errorf("load live event %d of %s: %w", r.Cursor, id, err)
		}
		r.At = store.ParseTime(at)
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("load live events of %s: %w", id, err)
	}
	slices.Reverse(out)
	return out, nil
}

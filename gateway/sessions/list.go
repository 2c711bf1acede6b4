package sessions

import (
	"context"
	"fmt"

	"github.com/openclaw/cloudworkers/gateway/paging"
	"github.com/openclaw/cloudworkers/gateway/store"
)

// ListFilter selects sessions by archive: All lists every one, Archived only the archived ones,
// neither those not archived.
type ListFilter struct{ All, Archived bool }

// pageKey is a session's position in the paged order: newest created first, then id.
func pageKey(s Session) paging.Key {
	return paging.Key{Sort: store.FormatTime(s.CreatedAt), ID: s.ID}
}

// ListPage returns one page of sessions, newest created first (created_at, then id, both
// descending), after req.After; next is the key to pass on when more follow. The order never
// moves a session (an update does not), so following the pages returns every session that
// existed at the first page exactly once, while others are created.
func (s *Store) ListPage(ctx context.Context, f ListFilter, req paging.Request) (page []Session, next *paging.Key, err error) {
	q := `SELECT ` + sessionCols + ` FROM sessions WHERE 1=1`
	var args []any
	switch {
	case f.All:
	case f.Archived:
		q += ` AND archived_at != ''`
	default:
		q += ` AND archived_at = ''`
	}
	if req.After != nil {
		q += ` AND (created_at < ? OR (created_at = ? AND id < ?))`
		args = append(args, req.After.Sort, req.After.Sort, req.After.ID)
	}
	q += ` ORDER BY created_at DESC, id DESC LIMIT ?`
	args = append(args, req.Limit+1)
	page, err = store.Query(ctx, s.db.R, scanSession, q, args...)
	if err != nil {
		return nil, nil, fmt.Errorf("list sessions: %w", err)
	}
	if len(page) > req.Limit {
		page = page[:req.Limit]
		k := pageKey(page[len(page)-1])
		next = &k
	}
	return page, next, nil
}

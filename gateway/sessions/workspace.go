package sessions

import (
	"context"
	"fmt"

	"github.com/openclaw/cloudworkers/gateway/store"
)

// SetWorkspace points a session at another workspace directory (for example the gateway-owned
// anchor holding a worker's results after pull-back).
func (s *Store) SetWorkspace(ctx context.Context, id, dir string) error {
	res, err := s.db.W.ExecContext(ctx, `UPDATE sessions SET workspace=?, updated_at=? WHERE id=?`, dir, store.FormatTime(s.now()), id)
	if err != nil {
		return fmt.Errorf("set workspace of session %s: %w", id, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return notFound(id)
	}
	s.Notify(ChangeSessionUpdated, id)
	return nil
}

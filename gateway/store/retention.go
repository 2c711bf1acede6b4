package store

import (
	"context"
	"fmt"
	"time"
)

// PruneBatch is how many rows one statement of DeleteBatched deletes; other writers get the
// database between batches.
const PruneBatch = 2000

// DeleteBatched runs query, a DELETE whose last parameter is the batch size (`… LIMIT ?)`), with
// args and PruneBatch until a batch deletes fewer rows, and returns how many rows it deleted.
func (db *DB) DeleteBatched(ctx context.Context, query string, args ...any) (int64, error) {
	var total int64
	args = append(args, PruneBatch)
	for {
		res, err := db.W.ExecContext(ctx, query, args...)
		if err != nil {
			return total, fmt.Errorf("prune: %w", err)
		}
		n, _ := res.RowsAffected()
		total += n
		if n < PruneBatch {
			return total, nil
		}
	}
}

// PruneAudit deletes audit rows written before cutoff and returns how many.
func (db *DB) PruneAudit(ctx context.Context, cutoff time.Time) (int64, error) {
	return db.DeleteBatched(ctx, `DELETE FROM audit WHERE id IN (SELECT id FROM audit WHERE at < ? LIMIT ?)`, FormatTime(cutoff))
}

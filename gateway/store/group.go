package store

import (
	"context"
	"database/sql"
	"fmt"
	"sync"
	"time"
)

// maxGroup bounds the callers whose writes share one group transaction.
const maxGroup = 256

// group is the queue of GroupTx callers waiting for a transaction; one of them (the leader) runs it.
type group struct {
	mu      sync.Mutex
	pending []*groupOp
	leading bool // a caller is running a group transaction
}

type groupOp struct {
	ctx  context.Context
	fn   func(tx *sql.Tx) error
	err  error
	done chan bool // true: lead the next group; false: the op's group committed (or failed), see err
}

// GroupTx runs fn in a write transaction it may share with other GroupTx calls made meanwhile
// (group commit: under load, one WAL fsync covers many callers instead of one each). fn runs in a
// savepoint of its own: an error it returns undoes only its own writes and is returned to its
// caller alone. GroupTx returns once the shared transaction committed (nil: fn's writes are
// durable) or failed (every caller whose fn succeeded gets the commit's error). fn must not start
// another transaction; it must honour ctx, which a caller waiting its turn cannot otherwise leave.
func (db *DB) GroupTx(ctx context.Context, fn func(tx *sql.Tx) error) error {
	op := &groupOp{ctx: ctx, fn: fn, done: make(chan bool, 1)}
	g := &db.group
	g.mu.Lock()
	g.pending = append(g.pending, op)
	lead := !g.leading
	g.leading = true
	g.mu.Unlock()
	if lead {
		db.leadGroup()
	}
	for <-op.done {
		db.leadGroup() // handed the lead: this caller's own op is in the group it runs
	}
	return op.err
}

// leadGroup runs one group transaction of the oldest pending callers, answers them and hands the
// lead to the next caller waiting, if any.
func (db *DB) leadGroup() {
	g := &db.group
	g.mu.Lock()
	n := min(len(g.pending), maxGroup)
	batch := append([]*groupOp(nil), g.pending[:n]...)
	g.pending = append(g.pending[:0:0], g.pending[n:]...)
	g.mu.Unlock()

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err := db.InTx(ctx, func(tx *sql.Tx) error {
		for _, op := range batch {
			if op.err = op.ctx.Err(); op.err != nil {
				continue
			}
			if _, err := tx.StmtContext(ctx, db.savepoint).ExecContext(ctx); err != nil {
				return fmt.Errorf("group savepoint: %w", err)
			}
			if op.err = op.fn(tx); op.err != nil {
				if _, err := tx.StmtContext(ctx, db.rollbackTo).ExecContext(ctx); err != nil {
					return fmt.Errorf("group rollback: %w", err)
				}
			}
			if _, err := tx.StmtContext(ctx, db.release).ExecContext(ctx); err != nil {
				return fmt.Errorf("group release: %w", err)
			}
		}
		return nil
	})
	if err != nil {
		for _, op := range batch {
			if op.err == nil {
				op.err = err
			}
		}
	}
	g.mu.Lock()
	var next *groupOp
	if len(g.pending) > 0 {
		next = g.pending[0]
	} else {
		g.leading = false
	}
	g.mu.Unlock()
	for _, op := range batch {
		op.done <- false
	}
	if next != nil {
		next.done <- true
	}
}

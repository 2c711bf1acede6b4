package turns

import (
	"context"
	"os"

	"github.com/openclaw/cloudworkers/gateway/sessions"
	"github.com/openclaw/cloudworkers/protocol"
	"github.com/openclaw/cloudworkers/worker/runner"
)

// LocalBackend is the runner backend of local placement: the session store, called directly, so
// both placements write identical rows.
type LocalBackend struct{ Store *sessions.Store }

var _ runner.Backend = (*LocalBackend)(nil)

// Context returns the session's messages and leaf.
func (b *LocalBackend) Context(ctx context.Context, sessionID string) ([]protocol.Message, string, error) {
	sess, err := b.Store.Get(ctx, sessionID)
	if err != nil {
		return nil, "", err
	}
	msgs, err := b.Store.Context(ctx, sessionID)
	return msgs, sess.LeafID, err
}

// Commit appends messages with the session's current owner epoch.
func (b *LocalBackend) Commit(ctx context.Context, sessionID string, runEpoch, seq uint64, baseLeaf string, msgs []protocol.Message) (string, error) {
	sess, err := b.Store.Get(ctx, sessionID)
	if err != nil {
		return "", err
	}
	res, err := b.Store.Commit(ctx, sessions.CommitParams{SessionID: sessionID, OwnerEpoch: sess.OwnerEpoch, RunEpoch: runEpoch,
		Seq: seq, BaseLeafID: baseLeaf, Messages: msgs})
	return res.NewLeafID, err
}

// Live publishes a live event.
func (b *LocalBackend) Live(ctx context.Context, sessionID string, runEpoch uint64, runID string, seq uint64, ev protocol.LiveEvent) error {
	sess, err := b.Store.Get(ctx, sessionID)
	if err != nil {
		return err
	}
	_, err = b.Store.PublishLive(ctx, sessions.LiveParams{SessionID: sessionID, OwnerEpoch: sess.OwnerEpoch, RunEpoch: runEpoch,
		RunID: runID, Seq: seq, LastAckedSeq: seq - 1, Event: ev})
	return err
}

func ensureDir(dir string) error { return os.MkdirAll(dir, 0o755) }

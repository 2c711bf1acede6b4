package sessions

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/openclaw/cloudworkers/gateway/store"
	"github.com/openclaw/cloudworkers/internal/ids"
	"github.com/openclaw/cloudworkers/protocol"
)

// MaxBatch is the most messages one transcript commit may carry.
const MaxBatch = 64

// EntryType is the type of a transcript entry (upstream session vocabulary).
type EntryType string

// Entry types.
const (
	EntryMessage     EntryType = "message"      // content: a protocol.Message
	EntryModelChange EntryType = "model_change" // content: ModelChange
	EntryCustom      EntryType = "custom"       // content: Custom
)

// ModelChange is the content of a model_change entry.
type ModelChange struct {
	Provider string `json:"provider"`
	ModelID  string `json:"modelId"`
}

// Custom is the content of a custom entry: gateway-side state that is not part of the model context.
type Custom struct {
	CustomType string          `json:"customType"`
	Data       json.RawMessage `json:"data,omitempty"`
}

// Entry is one node of a session's transcript tree. The gateway assigns ID and ParentID.
type Entry struct {
	ID string `json:"id"`
	// ParentID is "" for a root entry.
	ParentID  string          `json:"parentId"`
	Type      EntryType       `json:"type"`
	RunEpoch  uint64          `json:"runEpoch"`
	Timestamp time.Time       `json:"timestamp"`
	Content   json.RawMessage `json:"content"`
}

// Transcript is a session with every entry of its tree, in insertion order.
type Transcript struct {
	Session Session `json:"session"`
	Entries []Entry `json:"entries"`
}

// CommitParams are one transcript commit. (SessionID, OwnerEpoch) come from the caller's admission
// binding, never from a worker's params; (RunEpoch, Seq) identify the operation for replay.
type CommitParams struct {
	SessionID  string
	OwnerEpoch uint64
	RunEpoch   uint64
	Seq        uint64
	// BaseLeafID must equal the session's leaf ("" for an empty transcript).
	BaseLeafID string
	Messages   []protocol.Message
}

// CommitResult is the terminal result of a commit, cached and replayed for a repeated operation.
type CommitResult struct {
	EntryIDs  []string `json:"entryIds"`
	NewLeafID string   `json:"newLeafId"`
	Replayed  bool     `json:"replayed,omitempty"`
}

func validateMessages(msgs []protocol.Message) error {
	if len(msgs) == 0 || len(msgs) > MaxBatch {
		return errorf(protocol.CodeInvalidBatch, "a commit carries 1..%d messages, got %d", MaxBatch, len(msgs))
	}
	for i, m := range msgs {
		if err := m.Validate(); err != nil {
			return &Error{Code: protocol.CodeInvalidBatch, Message: fmt.Sprintf("messages[%d]: %v", i, err), Err: err}
		}
	}
	return nil
}

// Commit appends messages under the session's leaf. It checks, in order: the batch, the owner epoch
// (epoch-mismatch), a cached result for (session, ownerEpoch, runEpoch, seq) (returned with Replayed and
// nothing written), and the base leaf (stale-base-leaf). Every entry id is generated here.
func (s *Store) Commit(ctx context.Context, p CommitParams) (CommitResult, error) {
	if err := validateMessages(p.Messages); err != nil {
		return CommitResult{}, err
	}
	if p.RunEpoch == 0 || p.Seq == 0 {
		return CommitResult{}, errorf(protocol.CodeInvalidBatch, "runEpoch and seq start at 1")
	}
	var res CommitResult
	err := s.db.InTx(ctx, func(tx *sql.Tx) error {
		var owner uint64
		var leaf string
		err := tx.QueryRowContext(ctx, `SELECT owner_epoch, leaf_id FROM sessions WHERE id = ?`, p.SessionID).Scan(&owner, &leaf)
		if err := ownerCheck(err, p.SessionID, p.OwnerEpoch, owner); err != nil {
			return err
		}
		var cached string
		err = tx.QueryRowContext(ctx, `SELECT result FROM transcript_commits WHERE session_id = ? AND owner_epoch = ?
			AND run_epoch = ? AND seq = ?`, p.SessionID, p.OwnerEpoch, p.RunEpoch, p.Seq).Scan(&cached)
		if err == nil {
			if err := json.Unmarshal([]byte(cached), &res); err != nil {
				return fmt.Errorf("decode cached result: %w", err)
			}
			res.Replayed = true
			return nil
		}
		if !errors.Is(err, sql.ErrNoRows) {
			return err
		}
		if leaf != p.BaseLeafID {
			return &Error{Code: protocol.CodeStaleBaseLeaf, LeafID: leaf,
				Message: fmt.Sprintf("base leaf %q is not the session's leaf %q", p.BaseLeafID, leaf)}
		}
		now := s.now()
		parent := leaf
		for _, m := range p.Messages {
			if m.Timestamp == 0 {
				m.Timestamp = now.UnixMilli()
			}
			id, err := insertEntry(ctx, tx, p.SessionID, parent, EntryMessage, m, p.RunEpoch, now)
			if err != nil {
				return err
			}
			res.EntryIDs = append(res.EntryIDs, id)
			parent = id
		}
		res.NewLeafID = parent
		if _, err := tx.ExecContext(ctx, `UPDATE sessions SET leaf_id = ?, updated_at = ? WHERE id = ?`,
			parent, store.FormatTime(now), p.SessionID); err != nil {
			return err
		}
		b, err := json.Marshal(res)
		if err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, `INSERT INTO transcript_commits(session_id, owner_epoch, run_epoch, seq, result, created_at)
			VALUES(?,?,?,?,?,?)`, p.SessionID, p.OwnerEpoch, p.RunEpoch, p.Seq, string(b), store.FormatTime(now))
		return err
	})
	if err != nil {
		var se *Error
		if errors.As(err, &se) {
			return CommitResult{}, se
		}
		return CommitResult{}, fmt.Errorf("commit to session %s: %w", p.SessionID, err)
	}
	if !res.Replayed {
		s.Notify(ChangeSessionUpdated, p.SessionID)
	}
	return res, nil
}

func insertEntry(ctx context.Context, tx *sql.Tx, sessionID, parent string, typ EntryType, content any, runEpoch uint64, at time.Time) (string, error) {
	b, err := json.Marshal(content)
	if err != nil {
		return "", fmt.Errorf("encode %s entry: %w", typ, err)
	}
	id := ids.New("ent_", 12)
	_, err = tx.ExecContext(ctx, `INSERT INTO transcript_entries(id, session_id, parent_id, type, content, run_epoch, created_at)
		VALUES(?,?,?,?,?,?,?)`, id, sessionID, parent, string(typ), string(b), runEpoch, store.FormatTime(at))
	if err != nil {
		return "", fmt.Errorf("insert entry: %w", err)
	}
	return id, nil
}

// ChangeModel appends a model_change entry under the leaf and sets the session's model reference to
// "provider/modelId".
func (s *Store) ChangeModel(ctx context.Context, sessionID string, mc ModelChange) (Entry, error) {
	if mc.Provider == "" || mc.ModelID == "" {
		return Entry{}, errors.New("change model: provider and modelId are required")
	}
	return s.appendEntry(ctx, sessionID, EntryModelChange, mc, mc.Provider+"/"+mc.ModelID)
}

// AppendCustom appends a custom entry under the leaf.
func (s *Store) AppendCustom(ctx context.Context, sessionID string, c Custom) (Entry, error) {
	if c.CustomType == "" {
		return Entry{}, errors.New("append custom entry: customType is required")
	}
	return s.appendEntry(ctx, sessionID, EntryCustom, c, "")
}

func (s *Store) appendEntry(ctx context.Context, sessionID string, typ EntryType, content any, model string) (Entry, error) {
	var e Entry
	err := s.db.InTx(ctx, func(tx *sql.Tx) error {
		var leaf string
		err := tx.QueryRowContext(ctx, `SELECT leaf_id FROM sessions WHERE id = ?`, sessionID).Scan(&leaf)
		if errors.Is(err, sql.ErrNoRows) {
			return notFound(sessionID)
		}
		if err != nil {
			return err
		}
		now := s.now()
		id, err := insertEntry(ctx, tx, sessionID, leaf, typ, content, 0, now)
		if err != nil {
			return err
		}
		q, args := `UPDATE sessions SET leaf_id = ?, updated_at = ? WHERE id = ?`, []any{id, store.FormatTime(now), sessionID}
		if model != "" {
			q, args = `UPDATE sessions SET leaf_id = ?, updated_at = ?, model = ? WHERE id = ?`, []any{id, store.FormatTime(now), model, sessionID}
		}
		if _, err := tx.ExecContext(ctx, q, args...); err != nil {
			return err
		}
		b, _ := json.Marshal(content)
		e = Entry{ID: id, ParentID: leaf, Type: typ, Timestamp: store.ParseTime(store.FormatTime(now)), Content: b}
		return nil
	})
	if err != nil {
		return Entry{}, fmt.Errorf("append %s to session %s: %w", typ, sessionID, err)
	}
	s.Notify(ChangeSessionUpdated, sessionID)
	return e, nil
}

// Branch moves the session's leaf to entryID, an entry of the same session ("" starts a new root), so
// the next commit creates a sibling branch. The old branch stays in the tree.
func (s *Store) Branch(ctx context.Context, sessionID, entryID string) error {
	err := s.db.InTx(ctx, func(tx *sql.Tx) error {
		if entryID != "" {
			var n int
			err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM transcript_entries WHERE id = ? AND session_id = ?`,
				entryID, sessionID).Scan(&n)
			if err != nil {
				return err
			}
			if n == 0 {
				return fmt.Errorf("entry %s of session %s: %w", entryID, sessionID, store.ErrNotFound)
			}
		}
		r, err := tx.ExecContext(ctx, `UPDATE sessions SET leaf_id = ?, updated_at = ? WHERE id = ?`,
			entryID, store.FormatTime(s.now()), sessionID)
		if err != nil {
			return err
		}
		if n, _ := r.RowsAffected(); n == 0 {
			return notFound(sessionID)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("branch session %s: %w", sessionID, err)
	}
	s.Notify(ChangeSessionUpdated, sessionID)
	return nil
}

// Context returns the messages on the path from the root to the session's leaf, root first.
func (s *Store) Context(ctx context.Context, sessionID string) ([]protocol.Message, error) {
	ses, err := s.Get(ctx, sessionID)
	if err != nil {
		return nil, err
	}
	rows, err := s.db.R.QueryContext(ctx, `WITH RECURSIVE chain(id, parent_id, type, content, depth) AS (
			SELECT id, parent_id, type, content, 0 FROM transcript_entries WHERE id = ? AND session_id = ?
			UNION ALL
			SELECT e.id, e.parent_id, e.type, e.content, c.depth + 1
			FROM transcript_entries e JOIN chain c ON e.id = c.parent_id AND e.session_id = ?
		) SELECT type, content FROM chain ORDER BY depth DESC`, ses.LeafID, sessionID, sessionID)
	if err != nil {
		return nil, fmt.Errorf("context of session %s: %w", sessionID, err)
	}
	defer rows.Close()
	out := []protocol.Message{}
	for rows.Next() {
		var typ, content string
		if err := rows.Scan(&typ, &content); err != nil {
			return nil, fmt.Errorf("context of session %s: %w", sessionID, err)
		}
		if EntryType(typ) != EntryMessage {
			continue
		}
		var m protocol.Message
		if err := json.Unmarshal([]byte(content), &m); err != nil {
			return nil, fmt.Errorf("context of session %s: decode entry: %w", sessionID, err)
		}
		out = append(out, m)
	}
	return out, rows.Err()
}

// Transcript returns the session and all its entries in insertion order.
func (s *Store) Transcript(ctx context.Context, sessionID string) (Transcript, error) {
	ses, err := s.Get(ctx, sessionID)
	if err != nil {
		return Transcript{}, err
	}
	rows, err := s.db.R.QueryContext(ctx, `SELECT id, parent_id, type, run_epoch, created_at, content
		FROM transcript_entries WHERE session_id = ? ORDER BY n`, sessionID)
	if err != nil {
		return Transcript{}, fmt.Errorf("transcript of session %s: %w", sessionID, err)
	}
	defer rows.Close()
	t := Transcript{Session: ses, Entries: []Entry{}}
	for rows.Next() {
		var e Entry
		var typ, at, content string
		if err := rows.Scan(&e.ID, &e.ParentID, &typ, &e.RunEpoch, &at, &content); err != nil {
			return Transcript{}, fmt.Errorf("transcript of session %s: %w", sessionID, err)
		}
		e.Type, e.Timestamp, e.Content = EntryType(typ), store.ParseTime(at), json.RawMessage(content)
		t.Entries = append(t.Entries, e)
	}
	return t, rows.Err()
}

// CommitRequest is the wire params of worker.transcript.commit.
type CommitRequest struct {
	RunEpoch   uint64            `json:"runEpoch"`
	Seq        uint64            `json:"seq"`
	BaseLeafID string            `json:"baseLeafId"`
	Messages   []json.RawMessage `json:"messages"`
}

// idKeys are fields a worker might use to smuggle transcript identity into a message.
var idKeys = []string{"id", "entryId", "parentId", "sessionId"}

// DecodeCommit strictly decodes worker.transcript.commit params for the session and owner epoch the
// worker's admission binds it to. Unknown fields, more than MaxBatch messages, invalid messages and
// messages that carry ids are invalid-batch.
func DecodeCommit(sessionID string, ownerEpoch uint64, raw json.RawMessage) (CommitParams, error) {
	var req CommitRequest
	if err := protocol.DecodeParams(raw, &req); err != nil {
		return CommitParams{}, &Error{Code: protocol.CodeInvalidBatch, Message: err.Error(), Err: err}
	}
	return decodeCommitRequest(sessionID, ownerEpoch, req)
}

// decodeCommitRequest checks and decodes the messages of a commit request.
func decodeCommitRequest(sessionID string, ownerEpoch uint64, req CommitRequest) (CommitParams, error) {
	if len(req.Messages) == 0 || len(req.Messages) > MaxBatch {
		return CommitParams{}, errorf(protocol.CodeInvalidBatch, "a commit carries 1..%d messages, got %d", MaxBatch, len(req.Messages))
	}
	p := CommitParams{SessionID: sessionID, OwnerEpoch: ownerEpoch, RunEpoch: req.RunEpoch, Seq: req.Seq,
		BaseLeafID: req.BaseLeafID, Messages: make([]protocol.Message, len(req.Messages))}
	for i, rm := range req.Messages {
		var keys map[string]json.RawMessage
		if err := json.Unmarshal(rm, &keys); err != nil {
			return CommitParams{}, errorf(protocol.CodeInvalidBatch, "messages[%d]: %v", i, err)
		}
		for _, k := range idKeys {
			if _, ok := keys[k]; ok {
				return CommitParams{}, errorf(protocol.CodeInvalidBatch, "messages[%d]: carries %q: the gateway assigns transcript ids", i, k)
			}
		}
		if err := protocol.DecodeParams(bytes.TrimSpace(rm), &p.Messages[i]); err != nil {
			return CommitParams{}, errorf(protocol.CodeInvalidBatch, "messages[%d]: %v", i, err)
		}
	}
	return p, validateMessages(p.Messages)
}

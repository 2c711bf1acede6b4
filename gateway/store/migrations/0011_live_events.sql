-- Retained live events of a session, written in the same transaction as the live ACK cursor that
-- acknowledges them, so a subscriber resumes across a gateway restart without a gap. stream_seq is
-- the subscriber-facing Cursor (live_cursors.stream_seq is the newest one); only the newest
-- sessions.Config.Retention rows of a session are kept.
CREATE TABLE live_events (
	session_id  TEXT NOT NULL REFERENCES sessions(id),
	stream_seq  INTEGER NOT NULL,
	owner_epoch INTEGER NOT NULL,
	run_epoch   INTEGER NOT NULL,
	run_id      TEXT NOT NULL DEFAULT '',
	seq         INTEGER NOT NULL,
	at          TEXT NOT NULL,
	event       TEXT NOT NULL,
	PRIMARY KEY (session_id, stream_seq)
) WITHOUT ROWID;

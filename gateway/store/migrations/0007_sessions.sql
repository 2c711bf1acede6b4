-- Sessions, their transcript trees, cached commit results and live-event ACK cursors.
CREATE TABLE sessions (
	id                 TEXT PRIMARY KEY,
	title              TEXT NOT NULL DEFAULT '',
	agent              TEXT NOT NULL DEFAULT '',
	model              TEXT NOT NULL DEFAULT '',
	workspace          TEXT NOT NULL DEFAULT '',
	leaf_id            TEXT NOT NULL DEFAULT '',
	placement_state    TEXT NOT NULL DEFAULT 'local',
	environment_id     TEXT NOT NULL DEFAULT '',
	owner_epoch        INTEGER NOT NULL DEFAULT 1,
	lifecycle_revision INTEGER NOT NULL DEFAULT 0,
	created_at         TEXT NOT NULL,
	updated_at         TEXT NOT NULL
);
CREATE INDEX sessions_updated ON sessions(updated_at);

-- One row per transcript entry; parent_id '' is a root. n orders entries by insertion.
CREATE TABLE transcript_entries (
	n          INTEGER PRIMARY KEY AUTOINCREMENT,
	id         TEXT NOT NULL UNIQUE,
	session_id TEXT NOT NULL REFERENCES sessions(id),
	parent_id  TEXT NOT NULL DEFAULT '',
	type       TEXT NOT NULL,
	content    TEXT NOT NULL,
	run_epoch  INTEGER NOT NULL DEFAULT 0,
	created_at TEXT NOT NULL
);
CREATE INDEX transcript_entries_session ON transcript_entries(session_id, n);

-- Terminal results of transcript commits, replayed when the same operation identity is sent again.
CREATE TABLE transcript_commits (
	session_id  TEXT NOT NULL REFERENCES sessions(id),
	owner_epoch INTEGER NOT NULL,
	run_epoch   INTEGER NOT NULL,
	seq         INTEGER NOT NULL,
	result      TEXT NOT NULL,
	created_at  TEXT NOT NULL,
	PRIMARY KEY (session_id, owner_epoch, run_epoch, seq)
);

-- The live-event ACK cursor of a session: the newest (owner_epoch, run_epoch) stream, the worker seq
-- acknowledged in it, and the subscriber-facing stream sequence reached so far.
CREATE TABLE live_cursors (
	session_id  TEXT PRIMARY KEY REFERENCES sessions(id),
	owner_epoch INTEGER NOT NULL,
	run_epoch   INTEGER NOT NULL,
	run_id      TEXT NOT NULL DEFAULT '',
	acked_seq   INTEGER NOT NULL,
	stream_seq  INTEGER NOT NULL,
	updated_at  TEXT NOT NULL
);

-- Placement state machine per session (where its turns run), with generation for compare-and-swap.
CREATE TABLE placements (
	session_id        TEXT PRIMARY KEY,
	state             TEXT NOT NULL,
	generation        INTEGER NOT NULL,
	profile_id        TEXT NOT NULL DEFAULT '',
	environment_id    TEXT NOT NULL DEFAULT '',
	anchor_dir        TEXT NOT NULL DEFAULT '',
	box_workspace     TEXT NOT NULL DEFAULT '',
	sync_mode         TEXT NOT NULL DEFAULT '',
	owner_epoch       INTEGER NOT NULL DEFAULT 1,
	base_manifest_id  TEXT NOT NULL DEFAULT '',
	bundle_hash       TEXT NOT NULL DEFAULT '',
	barrier_step      INTEGER NOT NULL DEFAULT 0,
	turn_run_id       TEXT NOT NULL DEFAULT '',
	error             TEXT NOT NULL DEFAULT '',
	updated_at        TEXT NOT NULL
);
CREATE TABLE placement_events (
	id          INTEGER PRIMARY KEY AUTOINCREMENT,
	session_id  TEXT NOT NULL,
	at          TEXT NOT NULL,
	from_state  TEXT NOT NULL,
	to_state    TEXT NOT NULL,
	generation  INTEGER NOT NULL,
	reason      TEXT NOT NULL DEFAULT ''
);
CREATE INDEX placement_events_session ON placement_events(session_id, id);

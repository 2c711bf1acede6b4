-- One row per proxied model call of a worker: audit, accounting and the cached terminal result that
-- is replayed to a worker asking again for the same (session, run epoch, turn).
CREATE TABLE inference_calls (
	n                  INTEGER PRIMARY KEY AUTOINCREMENT,
	environment_id     TEXT NOT NULL,
	session_id         TEXT NOT NULL,
	run_epoch          INTEGER NOT NULL,
	run_id             TEXT NOT NULL DEFAULT '',
	turn_id            TEXT NOT NULL,
	model              TEXT NOT NULL,
	outcome            TEXT NOT NULL,
	input_tokens       INTEGER NOT NULL DEFAULT 0,
	output_tokens      INTEGER NOT NULL DEFAULT 0,
	cache_read_tokens  INTEGER NOT NULL DEFAULT 0,
	cache_write_tokens INTEGER NOT NULL DEFAULT 0,
	total_tokens       INTEGER NOT NULL DEFAULT 0,
	cost               REAL NOT NULL DEFAULT 0,
	bytes_in           INTEGER NOT NULL DEFAULT 0,
	bytes_out          INTEGER NOT NULL DEFAULT 0,
	duration_ms        INTEGER NOT NULL DEFAULT 0,
	terminal           TEXT NOT NULL DEFAULT '',
	started_at         TEXT NOT NULL,
	finished_at        TEXT NOT NULL DEFAULT '',
	UNIQUE (session_id, run_epoch, turn_id)
);
CREATE INDEX inference_calls_env ON inference_calls(environment_id);

-- Turns (runs) of sessions: admission, idempotency and outcome.
CREATE TABLE turns (
	session_id      TEXT NOT NULL,
	run_epoch       INTEGER NOT NULL,
	run_id          TEXT NOT NULL UNIQUE,
	idempotency_key TEXT,
	placement       TEXT NOT NULL,
	model           TEXT NOT NULL,
	status          TEXT NOT NULL,
	error           TEXT NOT NULL DEFAULT '',
	created_at      TEXT NOT NULL,
	finished_at     TEXT NOT NULL DEFAULT '',
	PRIMARY KEY (session_id, run_epoch),
	UNIQUE (session_id, idempotency_key)
);

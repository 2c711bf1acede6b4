-- Every change of a turn's status, written with the status in one transaction (turns.transitionTurn).
CREATE TABLE turn_events (
	id          INTEGER PRIMARY KEY AUTOINCREMENT,
	run_id      TEXT NOT NULL,
	at          TEXT NOT NULL,
	from_status TEXT NOT NULL,
	to_status   TEXT NOT NULL,
	reason      TEXT NOT NULL DEFAULT ''
);
CREATE INDEX turn_events_run ON turn_events(run_id, id);

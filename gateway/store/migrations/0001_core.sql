-- Gateway core: identity, profiles, environments and their events, audit.
CREATE TABLE gateway_meta (
	key   TEXT PRIMARY KEY,
	value TEXT NOT NULL
);

CREATE TABLE profiles (
	id               TEXT PRIMARY KEY,
	provider         TEXT NOT NULL,
	settings         TEXT NOT NULL DEFAULT '{}',
	idle_timeout_ns  INTEGER NOT NULL,
	ttl_ns           INTEGER NOT NULL,
	sync_include     TEXT NOT NULL DEFAULT '[]',
	sync_exclude     TEXT NOT NULL DEFAULT '[]',
	max_environments INTEGER NOT NULL,
	builtin          INTEGER NOT NULL DEFAULT 0,
	created_at       TEXT NOT NULL,
	updated_at       TEXT NOT NULL
);

CREATE TABLE environments (
	id               TEXT PRIMARY KEY,
	profile_id       TEXT NOT NULL,
	provider_id      TEXT NOT NULL,
	idempotency_key  TEXT UNIQUE,
	operation_id     TEXT NOT NULL UNIQUE,
	lease_id         TEXT NOT NULL DEFAULT '',
	state            TEXT NOT NULL,
	error            TEXT NOT NULL DEFAULT '',
	ssh_host         TEXT NOT NULL DEFAULT '',
	ssh_port         INTEGER NOT NULL DEFAULT 0,
	ssh_user         TEXT NOT NULL DEFAULT '',
	ssh_key_path     TEXT NOT NULL DEFAULT '',
	host_keys        TEXT NOT NULL DEFAULT '[]',
	lease_labels     TEXT NOT NULL DEFAULT '{}',
	lease_expires_at TEXT NOT NULL DEFAULT '',
	profile_snapshot TEXT NOT NULL,
	destroy_attempts INTEGER NOT NULL DEFAULT 0,
	next_attempt_at  TEXT NOT NULL DEFAULT '',
	created_at       TEXT NOT NULL,
	updated_at       TEXT NOT NULL,
	last_activity_at TEXT NOT NULL
);
CREATE INDEX environments_state ON environments(state);
CREATE INDEX environments_profile ON environments(profile_id);

CREATE TABLE environment_events (
	id             INTEGER PRIMARY KEY AUTOINCREMENT,
	environment_id TEXT NOT NULL REFERENCES environments(id),
	at             TEXT NOT NULL,
	from_state     TEXT NOT NULL,
	to_state       TEXT NOT NULL,
	reason         TEXT NOT NULL DEFAULT ''
);
CREATE INDEX environment_events_env ON environment_events(environment_id, id);

CREATE TABLE audit (
	id             INTEGER PRIMARY KEY AUTOINCREMENT,
	at             TEXT NOT NULL,
	kind           TEXT NOT NULL,
	environment_id TEXT NOT NULL DEFAULT '',
	detail         TEXT NOT NULL DEFAULT ''
);
CREATE INDEX audit_env ON audit(environment_id, id);

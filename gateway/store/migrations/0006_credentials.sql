-- Provider credentials (API keys) set with `openclaw credential set`. The value is sealed with
-- AES-256-GCM under <dataDir>/credentials.key; the row's name is the additional data, so a sealed
-- value cannot be moved to another name.
CREATE TABLE credentials (
	name       TEXT PRIMARY KEY,
	sealed     BLOB NOT NULL,
	created_at TEXT NOT NULL,
	updated_at TEXT NOT NULL
);

-- An archived session is hidden from session lists by default and read-only (no new turns); its
-- transcript is kept. archived_at is '' for a session that is not archived.
ALTER TABLE sessions ADD COLUMN archived_at TEXT NOT NULL DEFAULT '';

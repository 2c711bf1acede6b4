-- Sign-in of the Control UI (written by gateway/auth only). A sign-in code is minted with the
-- operator token (`openclaw ui`), used at most once and valid two minutes; only its sha256 is
-- stored.
CREATE TABLE signin_codes (
	hash       TEXT PRIMARY KEY,
	created_at TEXT NOT NULL,
	expires_at TEXT NOT NULL,
	used_at    TEXT NOT NULL DEFAULT ''
);
-- A browser session: the cookie carries a random secret, stored as its sha256; id is the public
-- name `openclaw ui sessions` lists and revokes. token_hash is the sha256 of the operator token
-- the session was signed in under: a session of another token is not valid (rotation ends it).
-- A session ends at expires_at (absolute lifetime), after the idle lifetime without a request
-- (last_seen_at), or when revoked (revoked_at, revoked_reason).
CREATE TABLE browser_sessions (
	id             TEXT PRIMARY KEY,
	secret_hash    TEXT NOT NULL UNIQUE,
	token_hash     TEXT NOT NULL,
	created_at     TEXT NOT NULL,
	last_seen_at   TEXT NOT NULL,
	expires_at     TEXT NOT NULL,
	remote         TEXT NOT NULL DEFAULT '',
	user_agent     TEXT NOT NULL DEFAULT '',
	revoked_at     TEXT NOT NULL DEFAULT '',
	revoked_reason TEXT NOT NULL DEFAULT ''
);
CREATE INDEX browser_sessions_expires ON browser_sessions(expires_at);

-- Devices of OpenClaw's own clients (written by gateway/openclaw only). A client that connects with
-- the operator token and a verified device identity (an Ed25519 key whose fingerprint is the id) is
-- issued a device token for that device; only its sha256 is stored. The token authenticates the
-- same device later (its signature is checked again) with the scopes it was issued for, until it
-- is revoked (`openclaw devices revoke`) or replaced by the next one issued.
CREATE TABLE openclaw_devices (
	id           TEXT PRIMARY KEY,
	public_key   TEXT NOT NULL,
	client_id    TEXT NOT NULL,
	client_mode  TEXT NOT NULL,
	platform     TEXT NOT NULL DEFAULT '',
	scopes       TEXT NOT NULL,
	token_hash   TEXT NOT NULL,
	created_at   TEXT NOT NULL,
	last_seen_at TEXT NOT NULL,
	revoked_at   TEXT NOT NULL DEFAULT ''
);

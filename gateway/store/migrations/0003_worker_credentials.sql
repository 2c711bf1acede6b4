-- Worker credentials: minted at provisioning, bound to an environment, a bundle hash and a method set.
-- Only the sha256 of the secret is stored.
CREATE TABLE worker_credentials (
	hash           TEXT PRIMARY KEY,
	environment_id TEXT NOT NULL,
	bundle_hash    TEXT NOT NULL,
	methods        TEXT NOT NULL DEFAULT '[]',
	expires_at     TEXT NOT NULL,
	created_at     TEXT NOT NULL,
	revoked_at     TEXT NOT NULL DEFAULT ''
);
CREATE INDEX worker_credentials_env ON worker_credentials(environment_id);

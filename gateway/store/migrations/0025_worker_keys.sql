-- The worker key each credential lineage is bound to (written by gateway/hub only). A worker makes
-- an Ed25519 key pair at launch and keeps it in memory; the first admission with a credential of a
-- lineage binds the lineage to its public key, and every later admission (reconnects, refreshed
-- credentials, per-session connections) must prove the same key: a copied credential alone admits
-- nothing.
CREATE TABLE worker_keys (
	lineage    TEXT PRIMARY KEY,
	public_key TEXT NOT NULL,
	bound_at   TEXT NOT NULL
);

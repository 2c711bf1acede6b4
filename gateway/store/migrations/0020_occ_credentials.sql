-- 0020: the OCC credential gateway (gateway/occ, credgw.go). A source's value is sealed in the
-- credentials table under credential_name (derived from namespace and source id); nothing in these
-- tables is secret. Everything is keyed by the OCC namespace id, so one namespace never sees
-- another's sources or attachments.
CREATE TABLE occ_credential_sources (
	namespace_id    TEXT NOT NULL,
	source_id       TEXT NOT NULL,
	type            TEXT NOT NULL,
	credential_name TEXT NOT NULL UNIQUE,
	created_at      TEXT NOT NULL,
	updated_at      TEXT NOT NULL,
	PRIMARY KEY (namespace_id, source_id)
);
-- One row per (revision, bound source): the opaque ref handed to OCC and whether the revision may
-- still use the source (attached) or lost it (revoked: withdraw, retirement). Rows outlive a
-- removed source, so a revision whose source was removed is refused instead of falling back to
-- the gateway's own provider credential.
CREATE TABLE occ_credential_attachments (
	namespace_id TEXT NOT NULL,
	revision_id  TEXT NOT NULL,
	source_id    TEXT NOT NULL,
	source_type  TEXT NOT NULL,
	ref          TEXT NOT NULL UNIQUE,
	state        TEXT NOT NULL CHECK (state IN ('attached', 'revoked')),
	created_at   TEXT NOT NULL,
	revoked_at   TEXT NOT NULL DEFAULT '',
	PRIMARY KEY (namespace_id, revision_id, source_id)
);

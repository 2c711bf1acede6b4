-- OCC's Compute side (gateway/occ, which alone writes these tables). A namespace is an isolation
-- scope; an agent is bound in exactly one namespace; a revision is an embedded agent runtime on
-- one worker environment at a time (attempt n's environment has idempotency key
-- occ:<namespace id>:<revision id>:<n>, so a repeated prepareRevision never leases twice).
CREATE TABLE occ_namespaces (
    id         TEXT PRIMARY KEY,
    name       TEXT NOT NULL,
    profile_id TEXT NOT NULL,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL
);

CREATE TABLE occ_agents (
    id                   TEXT PRIMARY KEY,
    namespace_id         TEXT NOT NULL REFERENCES occ_namespaces(id),
    service_principal_id TEXT NOT NULL DEFAULT '',
    session_id           TEXT NOT NULL DEFAULT '',
    active_revision_id   TEXT NOT NULL DEFAULT '',
    created_at           TEXT NOT NULL,
    updated_at           TEXT NOT NULL
);
CREATE INDEX occ_agents_namespace ON occ_agents(namespace_id);

CREATE TABLE occ_revisions (
    id                    TEXT PRIMARY KEY,
    namespace_id          TEXT NOT NULL REFERENCES occ_namespaces(id),
    agent_id              TEXT NOT NULL REFERENCES occ_agents(id),
    revision              INTEGER NOT NULL DEFAULT 0,
    profile_id            TEXT NOT NULL,
    machine_class         TEXT NOT NULL DEFAULT '',
    model                 TEXT NOT NULL DEFAULT '',
    requires_stopped      INTEGER NOT NULL DEFAULT 0,
    state                 TEXT NOT NULL,
    attempt               INTEGER NOT NULL DEFAULT 1,
    environment_id        TEXT NOT NULL DEFAULT '',
    pending_reason        TEXT NOT NULL DEFAULT '',
    failure_code          TEXT NOT NULL DEFAULT '',
    failure_component     TEXT NOT NULL DEFAULT '',
    failure_check         TEXT NOT NULL DEFAULT '',
    failure_at            TEXT NOT NULL DEFAULT '',
    created_at            TEXT NOT NULL,
    updated_at            TEXT NOT NULL
);
CREATE INDEX occ_revisions_agent ON occ_revisions(agent_id);
CREATE INDEX occ_revisions_namespace ON occ_revisions(namespace_id, state);

-- Every environment a revision was given (one per attempt), so retirement revokes and destroys
-- all of them and nothing else.
CREATE TABLE occ_revision_environments (
    revision_id    TEXT NOT NULL REFERENCES occ_revisions(id),
    attempt        INTEGER NOT NULL,
    environment_id TEXT NOT NULL,
    PRIMARY KEY (revision_id, attempt)
);

CREATE TABLE occ_revision_events (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    revision_id TEXT NOT NULL,
    at          TEXT NOT NULL,
    from_state  TEXT NOT NULL,
    to_state    TEXT NOT NULL,
    reason      TEXT NOT NULL
);
CREATE INDEX occ_revision_events_revision ON occ_revision_events(revision_id, id);

-- The options a child session was spawned with (profile, machine class, model, run timeout,
-- cleanup; JSON), and the parent's git workspace its branch is fetched into, so that follow-ups and
-- cleanup after a gateway restart still apply them. Written by gateway/agents only.
CREATE TABLE spawn_options (
    session_id  TEXT PRIMARY KEY,
    options     TEXT NOT NULL,
    parent_repo TEXT NOT NULL DEFAULT ''
);

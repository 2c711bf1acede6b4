-- A child session spawned by an agent's sessions_spawn tool call records its parent session and the
-- spawning tool call; spawn_depth is 0 for a session nobody spawned, parent's depth + 1 otherwise.
ALTER TABLE sessions ADD COLUMN parent_session_id TEXT NOT NULL DEFAULT '';
ALTER TABLE sessions ADD COLUMN spawn_tool_call_id TEXT NOT NULL DEFAULT '';
ALTER TABLE sessions ADD COLUMN spawn_depth INTEGER NOT NULL DEFAULT 0;
CREATE INDEX sessions_parent ON sessions(parent_session_id) WHERE parent_session_id <> '';

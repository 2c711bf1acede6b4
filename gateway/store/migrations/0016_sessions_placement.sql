-- A session's placement has one copy, the placements row: sessions.placement_state goes (a session
-- bound to an environment is the one whose environment_id is set).
ALTER TABLE sessions DROP COLUMN placement_state;

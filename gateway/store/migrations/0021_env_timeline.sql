-- Provisioning past the first try (issue 24).
-- A profile's setup phase, fallback profiles, capacity pattern and checkpoint cadence, as one JSON
-- document ({"setup":…, "fallback":…, "capacityPattern":…, "checkpoint":…}).
ALTER TABLE profiles ADD COLUMN policy TEXT NOT NULL DEFAULT '{}';
-- Timeline entries are environment events with a step: its name, kind (bootstrap, setup,
-- closeNetwork, provision), when it started, how long it took, its result and its output's tail.
ALTER TABLE environment_events ADD COLUMN step TEXT NOT NULL DEFAULT '';
ALTER TABLE environment_events ADD COLUMN step_kind TEXT NOT NULL DEFAULT '';
ALTER TABLE environment_events ADD COLUMN started_at TEXT NOT NULL DEFAULT '';
ALTER TABLE environment_events ADD COLUMN duration_ms INTEGER NOT NULL DEFAULT 0;
ALTER TABLE environment_events ADD COLUMN result TEXT NOT NULL DEFAULT '';
ALTER TABLE environment_events ADD COLUMN exit_code INTEGER NOT NULL DEFAULT 0;
ALTER TABLE environment_events ADD COLUMN output TEXT NOT NULL DEFAULT '';
-- The cache key of the setup that last succeeded on the environment's box ('' = none).
ALTER TABLE environments ADD COLUMN setup_key TEXT NOT NULL DEFAULT '';
-- Earlier provisioning attempts of an environment that fell back to another profile
-- ([{"profileId","providerId","operationId","leaseId","reason"}]), so the sweep still knows their leases.
ALTER TABLE environments ADD COLUMN lease_attempts TEXT NOT NULL DEFAULT '[]';

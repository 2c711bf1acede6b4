-- The spend ledger: one row per model call (from its usage) and per stretch of an environment's
-- leased time. Totals, budgets and the usage report are derived from these rows alone.
-- lineage is the session's chain of ancestors and itself ("ses_root/ses_child"), so that a
-- session tree's spend is one prefix match.
CREATE TABLE spend (
	id                 INTEGER PRIMARY KEY AUTOINCREMENT,
	at                 TEXT NOT NULL,
	kind               TEXT NOT NULL,
	session_id         TEXT NOT NULL DEFAULT '',
	lineage            TEXT NOT NULL DEFAULT '',
	agent              TEXT NOT NULL DEFAULT '',
	profile_id         TEXT NOT NULL DEFAULT '',
	environment_id     TEXT NOT NULL DEFAULT '',
	model              TEXT NOT NULL DEFAULT '',
	usd                REAL NOT NULL,
	input_tokens       INTEGER NOT NULL DEFAULT 0,
	output_tokens      INTEGER NOT NULL DEFAULT 0,
	cache_read_tokens  INTEGER NOT NULL DEFAULT 0,
	cache_write_tokens INTEGER NOT NULL DEFAULT 0,
	seconds            REAL NOT NULL DEFAULT 0,
	-- pending: a reservation (a model call's worst case, a lease's minimum billing) that is not
	-- settled yet; it counts against the budgets at its worst case until it is. A model call's
	-- reservation left by a gateway that died stays charged at its worst case (its provider may
	-- have billed it); a lease's is dropped (the lease, if made, counts on its own).
	pending            INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX spend_at ON spend(at);
CREATE INDEX spend_lineage ON spend(lineage, at);
CREATE INDEX spend_profile ON spend(profile_id, at);
CREATE INDEX spend_agent ON spend(agent, at);
CREATE INDEX spend_session ON spend(session_id);

-- How far each environment's leased time is in the ledger: accrued_to moves forward with each
-- machine row (in the same transaction), so a restart neither loses nor counts a stretch twice.
-- closed: the environment is destroyed and its time is all in.
CREATE TABLE spend_accrual (
	environment_id TEXT PRIMARY KEY,
	accrued_to     TEXT NOT NULL,
	closed         INTEGER NOT NULL DEFAULT 0
);

-- A session's own budget (session new --budget): its tree's total spend may not pass it.
CREATE TABLE session_budgets (
	session_id TEXT PRIMARY KEY,
	usd        REAL NOT NULL
);

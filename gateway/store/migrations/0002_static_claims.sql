-- Static provider: durable claims of a profile's fixed SSH hosts, one lease per host.
CREATE TABLE static_claims (
	profile_id     TEXT NOT NULL,
	host_index     INTEGER NOT NULL,
	host_addr      TEXT NOT NULL,
	lease_id       TEXT NOT NULL UNIQUE,
	operation_id   TEXT NOT NULL UNIQUE,
	environment_id TEXT NOT NULL DEFAULT '',
	gateway_id     TEXT NOT NULL DEFAULT '',
	claimed_at     TEXT NOT NULL,
	PRIMARY KEY (profile_id, host_addr)
);

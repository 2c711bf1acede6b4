-- Retention: indexes for the periodic prune, and the lineage of refreshed worker credentials (the
-- hash of the minted credential a chain of refreshes descends from; '' means the row's own hash), so
-- that the first use of a refreshed credential revokes the ones it replaced.
ALTER TABLE worker_credentials ADD COLUMN lineage TEXT NOT NULL DEFAULT '';
CREATE INDEX worker_credentials_lineage ON worker_credentials(lineage);
CREATE INDEX worker_credentials_expires ON worker_credentials(expires_at);
CREATE INDEX audit_at ON audit(at);
CREATE INDEX inference_calls_finished ON inference_calls(finished_at);

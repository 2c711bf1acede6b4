-- A profile's inbound sync quotas (0: the gateway's defaults) and its deletion brake (0: 0.5),
-- which until now lived in the profile only while it was being applied.
ALTER TABLE profiles ADD COLUMN sync_max_inbound_bytes INTEGER NOT NULL DEFAULT 0;
ALTER TABLE profiles ADD COLUMN sync_max_inbound_entries INTEGER NOT NULL DEFAULT 0;
ALTER TABLE profiles ADD COLUMN sync_max_inbound_file_bytes INTEGER NOT NULL DEFAULT 0;
ALTER TABLE profiles ADD COLUMN sync_max_delete_share REAL NOT NULL DEFAULT 0;

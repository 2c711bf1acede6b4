-- The worker bundle pushed to an environment's box and the box-side socket its tunnel forwards.
ALTER TABLE environments ADD COLUMN bundle_hash TEXT NOT NULL DEFAULT '';
ALTER TABLE environments ADD COLUMN worker_socket TEXT NOT NULL DEFAULT '';
ALTER TABLE environments ADD COLUMN worker_home TEXT NOT NULL DEFAULT '';

-- The machine class a dispatch asked for (overrides the profile's settings.class).
ALTER TABLE placements ADD COLUMN machine_class TEXT NOT NULL DEFAULT '';

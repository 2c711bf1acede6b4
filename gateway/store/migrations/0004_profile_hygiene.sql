-- Per-profile box hygiene policy: {"check": "enforce"|"warn"}.
ALTER TABLE profiles ADD COLUMN hygiene TEXT NOT NULL DEFAULT '{}';

-- The owner epoch is stored once, in sessions.owner_epoch (written by sessions.BindTx inside the
-- placement transition that moves the session, and by a discard's fence). A placement reads it
-- from there; its own copy, which a discard did not advance, is gone.
ALTER TABLE placements DROP COLUMN owner_epoch;

-- A queued job that cannot be placed on the pool as it exists (more devices than the pool has of its kind,
-- or none of its kind): since when, and why in words (issue 12). The scheduler sets and clears both each
-- pass, and fails the job once the platform's grace period has passed.
ALTER TABLE jobs ADD COLUMN unplaceable_since TEXT;
ALTER TABLE jobs ADD COLUMN unplaceable_reason TEXT;

-- A device the node no longer offers (its agent re-registered without it): kept for the assignments that
-- name it, never shown or placed on again (issue 12). Registering it again brings it back.
ALTER TABLE devices ADD COLUMN retired BOOLEAN NOT NULL DEFAULT FALSE;

-- A team's storage quota in bytes, datasets and checkpoints together; NULL: the server's default.
ALTER TABLE teams ADD COLUMN storage_quota_bytes BIGINT;

-- The version agents' long polls carry (issue 12): one counter in the database, moved on every change of
-- jobs or assignments, so it survives a server restart and is the same through every replica.
CREATE TABLE change_version (id INTEGER PRIMARY KEY CHECK (id = 1), seq BIGINT NOT NULL);
INSERT INTO change_version (id, seq) VALUES (1, 0);

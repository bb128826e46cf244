-- A queued job that cannot be placed on the pool as it exists (more devices than the pool has of its kind,
-- or none of its kind): since when, and why in words (issue 12). The scheduler sets and clears both each
-- pass, and fails the job once the platform's grace period has passed.
ALTER TABLE jobs ADD COLUMN unplaceable_since TIMESTAMPTZ;
ALTER TABLE jobs ADD COLUMN unplaceable_reason TEXT;

-- A device the node no longer offers (its agent re-registered without it): kept for the assignments that
-- name it, never shown or placed on again (issue 12). Registering it again brings it back.
ALTER TABLE devices ADD COLUMN retired BOOLEAN NOT NULL DEFAULT FALSE;

-- A team's storage quota in bytes, datasets and checkpoints together; NULL: the server's default.
ALTER TABLE teams ADD COLUMN storage_quota_bytes BIGINT;

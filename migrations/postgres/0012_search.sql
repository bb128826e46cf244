-- Issue 31. A study's search (asynchronous successive halving) stops the points that are not among the best
-- at a rung: their jobs end `stopped`, checkpoints and figures kept, and resume if a later result promotes
-- them. The study keeps the search's memory (which points were promoted past each rung, which are stopped),
-- changed only by a compare-and-set on `search_version`, so replicas judging reports at once cannot both
-- decide from the same memory.
ALTER TABLE jobs DROP CONSTRAINT jobs_state_check;
ALTER TABLE jobs ADD CONSTRAINT jobs_state_check
    CHECK (state IN ('queued', 'scheduled', 'running', 'succeeded', 'failed', 'cancelled', 'stopped'));
ALTER TABLE studies ADD COLUMN search_state JSONB;
ALTER TABLE studies ADD COLUMN search_version BIGINT NOT NULL DEFAULT 0;

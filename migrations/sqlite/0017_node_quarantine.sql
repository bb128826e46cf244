-- Issue 49. A node that failed its agent's self-test (or that a platform admin set aside) gets no new
-- placements until a platform admin lifts it: why, and since when. NULL: the node may be placed on.
ALTER TABLE nodes ADD COLUMN quarantine TEXT;
ALTER TABLE nodes ADD COLUMN quarantined_at TEXT;

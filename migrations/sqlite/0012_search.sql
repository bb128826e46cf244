-- Issue 31. A study's search (asynchronous successive halving) stops the points that are not among the best
-- at a rung: their jobs end `stopped`, checkpoints and figures kept, and resume if a later result promotes
-- them. The study keeps the search's memory, changed only by a compare-and-set on `search_version`.
--
-- SQLite cannot alter a CHECK constraint: the jobs table is rebuilt with the new one, by SQLite's own recipe
-- (https://www.sqlite.org/lang_altertable.html#otheralter): copy, drop, rename, indexes again. The store runs
-- migrations with foreign keys off (`sqlite::migrate`; dropping the old table would otherwise cascade into
-- every table that references it) and checks every reference afterwards.
CREATE TABLE jobs_rebuilt (
    -- seq orders the run history (newest first) and is the pagination cursor; ids are random.
    seq                 INTEGER PRIMARY KEY AUTOINCREMENT,
    id                  BLOB NOT NULL UNIQUE,
    team_id             BLOB NOT NULL REFERENCES teams (id),
    created_by          BLOB REFERENCES tokens (id),
    name                TEXT,
    spec                TEXT NOT NULL,
    effective           TEXT,
    dataset_size        BIGINT,
    state               TEXT NOT NULL CHECK (state IN ('queued', 'scheduled', 'running', 'succeeded', 'failed', 'cancelled', 'stopped')),
    priority            INTEGER NOT NULL,
    device              TEXT NOT NULL CHECK (device IN ('cpu', 'gpu')),
    devices             INTEGER NOT NULL CHECK (devices > 0),
    attempt             INTEGER NOT NULL DEFAULT 0,
    max_restarts        INTEGER NOT NULL,
    lease_owner         TEXT,
    lease_expires       TEXT,
    created_at          TEXT NOT NULL,
    updated_at          TEXT NOT NULL,
    started_at          TEXT,
    finished_at         TEXT,
    result              TEXT,
    error               TEXT,
    preemptions         INTEGER NOT NULL DEFAULT 0,
    unplaceable_since   TEXT,
    unplaceable_reason  TEXT,
    study_id            BLOB REFERENCES studies (id),
    study_point         INTEGER,
    tags                TEXT NOT NULL DEFAULT '[]',
    note                TEXT NOT NULL DEFAULT ''
);
INSERT INTO jobs_rebuilt (seq, id, team_id, created_by, name, spec, effective, dataset_size, state, priority, device,
    devices, attempt, max_restarts, lease_owner, lease_expires, created_at, updated_at, started_at, finished_at,
    result, error, preemptions, unplaceable_since, unplaceable_reason, study_id, study_point, tags, note)
SELECT seq, id, team_id, created_by, name, spec, effective, dataset_size, state, priority, device,
    devices, attempt, max_restarts, lease_owner, lease_expires, created_at, updated_at, started_at, finished_at,
    result, error, preemptions, unplaceable_since, unplaceable_reason, study_id, study_point, tags, note
FROM jobs;
DROP TABLE jobs;
ALTER TABLE jobs_rebuilt RENAME TO jobs;
CREATE INDEX jobs_team_history ON jobs (team_id, seq DESC);
CREATE INDEX jobs_team_state_history ON jobs (team_id, state, seq DESC);
CREATE INDEX jobs_team_created ON jobs (team_id, created_at DESC);
CREATE INDEX jobs_queue ON jobs (priority DESC, seq) WHERE state = 'queued';
CREATE INDEX jobs_leases ON jobs (lease_expires) WHERE lease_owner IS NOT NULL;
CREATE INDEX jobs_team_name ON jobs (team_id, name, seq);
CREATE INDEX jobs_active ON jobs (state) WHERE state IN ('scheduled', 'running');
CREATE INDEX jobs_study ON jobs (study_id, study_point) WHERE study_id IS NOT NULL;
ALTER TABLE studies ADD COLUMN search_state TEXT;
ALTER TABLE studies ADD COLUMN search_version INTEGER NOT NULL DEFAULT 0;

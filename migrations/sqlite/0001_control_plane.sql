-- ringtrain control plane (SQLite). The Postgres twin is migrations/postgres/0001_control_plane.sql: keep the
-- column names and meanings identical, the store runs the same SQL text on both wherever it can.

CREATE TABLE teams (
    id          BLOB PRIMARY KEY,
    name        TEXT NOT NULL UNIQUE,
    gpu_quota   INTEGER NOT NULL CHECK (gpu_quota >= 0),
    cpu_quota   INTEGER NOT NULL CHECK (cpu_quota >= 0),
    created_at  TEXT NOT NULL
);

-- Only the sha256 of a token is stored; the token itself is shown once, when it is created.
-- role 'agent' is a node agent's token: no team, only the /v1/agent routes.
CREATE TABLE tokens (
    id          BLOB PRIMARY KEY,
    token_hash  TEXT NOT NULL UNIQUE,
    role        TEXT NOT NULL CHECK (role IN ('admin', 'member', 'viewer', 'agent')),
    team_id     BLOB REFERENCES teams (id),
    label       TEXT,
    created_at  TEXT NOT NULL,
    revoked_at  TEXT,
    CHECK ((role = 'agent') = (team_id IS NULL))
);

CREATE TABLE jobs (
    -- seq orders the run history (newest first) and is the pagination cursor; ids are random.
    seq            INTEGER PRIMARY KEY AUTOINCREMENT,
    id             BLOB NOT NULL UNIQUE,
    team_id        BLOB NOT NULL REFERENCES teams (id),
    created_by     BLOB REFERENCES tokens (id),
    name           TEXT,
    spec           TEXT NOT NULL,
    effective      TEXT,
    dataset_size   BIGINT,
    state          TEXT NOT NULL CHECK (state IN ('queued', 'scheduled', 'running', 'succeeded', 'failed', 'cancelled')),
    priority       INTEGER NOT NULL,
    device         TEXT NOT NULL CHECK (device IN ('cpu', 'gpu')),
    workers        INTEGER NOT NULL CHECK (workers > 0),
    attempt        INTEGER NOT NULL DEFAULT 0,
    max_restarts   INTEGER NOT NULL,
    lease_owner    TEXT,
    lease_expires  TEXT,
    created_at     TEXT NOT NULL,
    updated_at     TEXT NOT NULL,
    started_at     TEXT,
    finished_at    TEXT,
    result         TEXT,
    error          TEXT
);
CREATE INDEX jobs_team_history ON jobs (team_id, seq DESC);
CREATE INDEX jobs_team_state_history ON jobs (team_id, state, seq DESC);
CREATE INDEX jobs_team_created ON jobs (team_id, created_at DESC);
CREATE INDEX jobs_queue ON jobs (priority DESC, seq) WHERE state = 'queued';
CREATE INDEX jobs_leases ON jobs (lease_expires) WHERE lease_owner IS NOT NULL;

CREATE TABLE job_events (
    seq         INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id      BLOB NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    at          TEXT NOT NULL,
    kind        TEXT NOT NULL,
    from_state  TEXT,
    to_state    TEXT,
    attempt     INTEGER NOT NULL,
    reason      TEXT
);
CREATE INDEX job_events_by_job ON job_events (job_id, seq);

-- One compact row per report (not one per name/value): ~5x fewer rows for 10^7-row histories. The primary
-- key is the de-duplication key, so a resumed attempt overwrites rather than double counts, and it is the
-- index every metrics page walks: (job, kind) series ordered by iteration.
CREATE TABLE metrics (
    job_id       BLOB NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    kind         TEXT NOT NULL,
    iteration    BIGINT NOT NULL,
    rank         INTEGER NOT NULL,
    epoch        BIGINT NOT NULL,
    attempt      INTEGER NOT NULL,
    fields       TEXT NOT NULL,
    reported_at  TEXT NOT NULL,
    PRIMARY KEY (job_id, kind, iteration, rank)
) WITHOUT ROWID;

CREATE TABLE nodes (
    id              BLOB PRIMARY KEY,
    name            TEXT NOT NULL UNIQUE,
    agent_token_id  BLOB NOT NULL REFERENCES tokens (id),
    address         TEXT,
    state           TEXT NOT NULL CHECK (state IN ('up', 'lost')),
    registered_at   TEXT NOT NULL,
    last_heartbeat  TEXT NOT NULL
);

CREATE TABLE devices (
    id            BLOB PRIMARY KEY,
    node_id       BLOB NOT NULL REFERENCES nodes (id) ON DELETE CASCADE,
    idx           INTEGER NOT NULL,
    kind          TEXT NOT NULL CHECK (kind IN ('cpu', 'gpu')),
    name          TEXT NOT NULL,
    memory_bytes  BIGINT,
    UNIQUE (node_id, idx)
);

-- One row per rank of an attempt: the scheduler writes them, the node's agent polls for them.
CREATE TABLE assignments (
    id          BLOB PRIMARY KEY,
    job_id      BLOB NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    attempt     INTEGER NOT NULL,
    node_id     BLOB NOT NULL REFERENCES nodes (id),
    device_id   BLOB NOT NULL REFERENCES devices (id),
    rank        INTEGER NOT NULL,
    world_size  INTEGER NOT NULL,
    state       TEXT NOT NULL CHECK (state IN ('pending', 'delivered', 'running', 'done', 'failed', 'cancelled')),
    created_at  TEXT NOT NULL,
    updated_at  TEXT NOT NULL,
    UNIQUE (job_id, attempt, rank)
);
CREATE INDEX assignments_by_node ON assignments (node_id, state);
-- A device runs one rank at a time: a double placement fails in the database, not in a race.
CREATE UNIQUE INDEX assignments_busy_device ON assignments (device_id) WHERE state IN ('pending', 'delivered', 'running');

CREATE TABLE checkpoints (
    id          BLOB PRIMARY KEY,
    job_id      BLOB NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    attempt     INTEGER NOT NULL,
    epoch       BIGINT NOT NULL,
    iteration   BIGINT NOT NULL,
    path        TEXT NOT NULL,
    size_bytes  BIGINT NOT NULL,
    sha256      TEXT NOT NULL,
    is_final    INTEGER NOT NULL,
    created_at  TEXT NOT NULL,
    UNIQUE (job_id, iteration, is_final)
);

CREATE TABLE datasets (
    id             BLOB PRIMARY KEY,
    team_id        BLOB NOT NULL REFERENCES teams (id),
    name           TEXT NOT NULL,
    path           TEXT NOT NULL,
    size_bytes     BIGINT NOT NULL,
    sha256         TEXT NOT NULL,
    train_samples  BIGINT NOT NULL,
    sample_shape   TEXT NOT NULL,
    num_classes    INTEGER NOT NULL,
    created_at     TEXT NOT NULL
);
CREATE INDEX datasets_by_team ON datasets (team_id, created_at DESC);

-- Idempotency-Key: the first request with a key wins the primary key; later ones with the same body get its
-- job, with another body a 409.
CREATE TABLE idempotency_keys (
    team_id       BLOB NOT NULL REFERENCES teams (id),
    key           TEXT NOT NULL,
    request_hash  TEXT NOT NULL,
    job_id        BLOB NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    created_at    TEXT NOT NULL,
    PRIMARY KEY (team_id, key)
);

-- What ranks print (issue 14): each rank's stderr, and stdout lines that are not metric reports, relayed by
-- its agent. `id` orders a job's lines as they arrived (the cursor of reads and follows); the unique key
-- makes a batch sent again store nothing twice.
CREATE TABLE rank_logs (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id      BLOB NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    attempt     INTEGER NOT NULL,
    rank        INTEGER NOT NULL,
    seq         INTEGER NOT NULL,
    at          TEXT NOT NULL,
    stream      TEXT NOT NULL CHECK (stream IN ('stdout', 'stderr')),
    line        TEXT NOT NULL,
    UNIQUE (job_id, attempt, rank, seq)
);
CREATE INDEX rank_logs_by_job ON rank_logs (job_id, id);

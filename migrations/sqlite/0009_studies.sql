-- Issue 16. A job's `workers` (k) is the math of its run; what it holds is `devices` rank processes, each
-- playing k/devices virtual ranks. The column has always counted the processes placed: it is named for it
-- (SQLite renames the column in its CHECK constraint too).
ALTER TABLE jobs RENAME COLUMN workers TO devices;

-- A study: one base spec and the points made of it, each an ordinary job (`jobs.study_id`, `study_point`).
-- `definition` keeps what was asked (name, base, axes or points, reference) so the study can be shown and
-- submitted again; `reference_point` is the small-batch baseline the other points are judged against.
CREATE TABLE studies (
    seq              INTEGER PRIMARY KEY AUTOINCREMENT,
    id               BLOB NOT NULL UNIQUE,
    team_id          BLOB NOT NULL REFERENCES teams (id),
    created_by       BLOB REFERENCES tokens (id),
    name             TEXT,
    definition       TEXT NOT NULL,
    reference_point  INTEGER NOT NULL,
    created_at       TEXT NOT NULL
);
CREATE INDEX studies_team_history ON studies (team_id, seq DESC);

ALTER TABLE jobs ADD COLUMN study_id BLOB REFERENCES studies (id);
ALTER TABLE jobs ADD COLUMN study_point INTEGER;
CREATE INDEX jobs_study ON jobs (study_id, study_point) WHERE study_id IS NOT NULL;

-- Issue 55. Data set uploads in parts: what was declared (the parts are the server's files or objects);
-- the declared size counts against the team's storage quota until the upload completes or is abandoned.
CREATE TABLE dataset_uploads (
    id          BLOB PRIMARY KEY,
    team_id     BLOB NOT NULL REFERENCES teams (id),
    name        TEXT NOT NULL,
    size_bytes  BIGINT NOT NULL,
    part_bytes  BIGINT NOT NULL,
    created_at  TEXT NOT NULL
);
CREATE INDEX dataset_uploads_by_team ON dataset_uploads (team_id, created_at);

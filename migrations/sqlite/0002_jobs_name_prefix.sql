-- Name-prefix filters of the run history: a range scan of this index (SQLite's default BINARY collation is
-- byte order, so a range is exactly a prefix).
CREATE INDEX jobs_team_name ON jobs (team_id, name, seq);

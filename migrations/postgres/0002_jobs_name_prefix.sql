-- Name-prefix filters of the run history: `name COLLATE "C" >= prefix AND < prefix+1` is a range scan of
-- this index (byte order, so a range is exactly a prefix, whatever the database's default collation).
CREATE INDEX jobs_team_name ON jobs (team_id, (name COLLATE "C"), seq);

-- Issue 55. The folders on the nodes' shared filesystems a team's idx: and shards: data sets may lie
-- under (a JSON array of absolute paths, set by a platform admin): a team reads its own data, not another
-- team's, where the server's --idx-root folders are granted to every team.
ALTER TABLE teams ADD COLUMN data_roots TEXT NOT NULL DEFAULT '[]';

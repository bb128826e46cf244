-- Issue 32. The run history's text search (`q=`, in a job's name or note) read every job of the team: 1.3 s
-- at 10^6 jobs. A trigram index on the searched text finds the jobs that hold a needle of three characters
-- or more from the index, at a cost that grows with the matches, not the history. pg_trgm ships with
-- Postgres and is a trusted extension (13+): a database owner may create it.
CREATE EXTENSION IF NOT EXISTS pg_trgm;
CREATE INDEX jobs_text_trigrams ON jobs USING gin ((lower(coalesce(name, '') || ' ' || note)) gin_trgm_ops);

-- The scheduler loop and the node agents (issue 5). The Postgres twin is migrations/postgres/0003_scheduling.sql.
--
-- jobs.attempt counts placements: every start writes a fresh set of assignments under a new attempt number,
-- which is also the guard on every agent report, so a stale agent can never touch a newer placement.
-- jobs.preemptions counts the placements that ended because the scheduler reclaimed their devices: they are
-- not failures, so the restart budget and the attempt the API shows (attempt - preemptions) leave them out.
ALTER TABLE jobs ADD COLUMN preemptions INTEGER NOT NULL DEFAULT 0;

-- Rank 0's rendezvous address (HOST:PORT), reported by its agent before the rank starts; the other ranks'
-- agents read it from their poll.
ALTER TABLE assignments ADD COLUMN endpoint TEXT;
-- Set when the scheduler preempted the placement: its agents stop the ranks after a checkpoint of where they
-- are (instead of at once, as for a cancel), so the job resumes without losing work.
ALTER TABLE assignments ADD COLUMN preempted BOOLEAN NOT NULL DEFAULT FALSE;
CREATE INDEX assignments_by_job ON assignments (job_id, attempt);
CREATE INDEX jobs_active ON jobs (state) WHERE state IN ('scheduled', 'running');

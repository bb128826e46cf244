-- Scheduler transparency and accounting (issue 13).

-- A team's weight in the division of idle capacity beyond guarantees (weighted fair share), set by the
-- platform admin.
ALTER TABLE teams ADD COLUMN weight INTEGER NOT NULL DEFAULT 1;

-- An optional budget of device-hours per period ('day', 'week' or 'month', UTC); a team's queued jobs wait
-- while its usage in the current period has reached it. NULL: no budget.
ALTER TABLE teams ADD COLUMN budget_device_hours DOUBLE PRECISION;
ALTER TABLE teams ADD COLUMN budget_period TEXT;

-- Each event names its placement (the `attempt` column: 1 for the first placement, one more per start) and
-- the attempt as users count it (one more per failure-restart, the same across a preemption).
ALTER TABLE job_events ADD COLUMN run_attempt INTEGER;

-- Where a placement resumed: the checkpoint's iteration, and the newest iteration the job's ranks had
-- reported before it (what was trained again is the difference), set when rank 0's work is first handed
-- out; on rank 0's assignment.
ALTER TABLE assignments ADD COLUMN resumed_from BIGINT;
ALTER TABLE assignments ADD COLUMN reached_before BIGINT;

-- Usage reads assignments by the time they were placed.
CREATE INDEX assignments_by_created ON assignments (created_at);

-- Issue 32. How far each rank's reports reached (what a placement resumes from, a job page's resources)
-- grouped every point of the job: 0.64 s at 2e6 points, seconds at 1e7. With the points also ordered by
-- rank, it is a few index probes per rank.
CREATE INDEX metrics_by_rank ON metrics (job_id, kind, rank, iteration);

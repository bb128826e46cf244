-- Issue 32. A scheduler pass reads the first jobs (queue_window, 1,000) of each team's queue of each device
-- kind. A window function over every queued job sorted the whole queue on every pass: 5-13 ms at 10^4
-- queued jobs, 91-118 ms at 1.1 x 10^5, growing with the queue. With this index each team's and kind's
-- first jobs are an index range read (store/src/postgres.rs, QUEUE_WINDOW): 4 and 17-23 ms.
CREATE INDEX jobs_team_queue ON jobs (team_id, device, priority DESC, seq) WHERE state = 'queued';

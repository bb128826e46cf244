//! The log ingestion budget: how many lines of rank output one job may store per second (a rank printing
//! in a tight loop must not fill the database or starve heartbeats on SQLite), with a few seconds saved up
//! for bursts such as a stack trace. Lines beyond it are dropped and counted in the agent's ack. The
//! budget is per server, like the metric budget.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use ringtrain_core::JobId;

/// Seconds of budget a job may save up.
const BURST_SECONDS: f64 = 10.0;
/// Budgets beyond this many are pruned of jobs idle for [`IDLE`].
const MAX_JOBS: usize = 10_000;
const IDLE: Duration = Duration::from_secs(600);

#[derive(Debug)]
pub struct LogBudgets {
    lines_per_second: f64,
    jobs: Mutex<HashMap<JobId, (f64, Instant)>>,
}

impl LogBudgets {
    /// `lines_per_second` 0 or less: no limit.
    pub fn new(lines_per_second: f64) -> Self {
        LogBudgets { lines_per_second, jobs: Mutex::new(HashMap::new()) }
    }

    /// How many of `wanted` lines the job may store now (taken from its budget).
    pub fn take(&self, job: JobId, wanted: usize, now: Instant) -> usize {
        if self.lines_per_second <= 0.0 {
            return wanted;
        }
        let capacity = self.lines_per_second * BURST_SECONDS;
        let mut jobs = self.jobs.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if jobs.len() >= MAX_JOBS {
            jobs.retain(|_, (_, at)| now.duration_since(*at) < IDLE);
        }
        let (tokens, at) = jobs.entry(job).or_insert((capacity, now));
        *tokens = (*tokens + now.duration_since(*at).as_secs_f64() * self.lines_per_second).min(capacity);
        *at = now;
        let granted = (tokens.floor().max(0.0) as usize).min(wanted);
        *tokens -= granted as f64;
        granted
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_gets_its_burst_then_its_rate() {
        let budgets = LogBudgets::new(10.0);
        let job = JobId::new();
        let start = Instant::now();
        assert_eq!(budgets.take(job, 150, start), 100, "ten seconds saved up");
        assert_eq!(budgets.take(job, 50, start), 0);
        assert_eq!(budgets.take(job, 50, start + Duration::from_secs(2)), 20, "then 10 a second");
        assert_eq!(budgets.take(JobId::new(), 5, start), 5, "per job");
        assert_eq!(LogBudgets::new(0.0).take(job, 1_000_000, start), 1_000_000);
    }
}

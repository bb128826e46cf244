//! The metric ingestion budget: how many iteration reports one job may store per second. A job with
//! `log_every_iterations: 1` and tiny batches reports k rows per iteration, thousands a second, and on
//! SQLite every row is a write that heartbeats queue behind. Beyond its budget a job's iteration reports
//! are thinned *evenly*: only iterations that are multiples of a stride are kept, the same iterations for
//! every rank, so a plotted curve stays a curve. The stride doubles while the job is over its budget and
//! halves again once it has been under it for a full refill. Epoch reports are always kept.
//!
//! The budget is per server: behind several replicas a job's agents all report to whichever they reach.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use ringtrain_core::JobId;
use ringtrain_store::MetricPoint;

/// The largest stride: one report in 2^20 iterations.
const MAX_STRIDE: i64 = 1 << 20;
/// Seconds of budget a job may save up (its burst).
const BURST_SECONDS: f64 = 10.0;
/// Budgets beyond this many are pruned of jobs idle for [`IDLE`].
const MAX_JOBS: usize = 10_000;
const IDLE: Duration = Duration::from_secs(600);

#[derive(Debug)]
pub struct MetricBudgets {
    rows_per_second: f64,
    jobs: Mutex<HashMap<JobId, Budget>>,
}

#[derive(Debug, Clone, Copy)]
struct Budget {
    rows: f64,
    at: Instant,
    stride: i64,
}

/// What thinning kept of a batch.
#[derive(Debug)]
pub struct Thinned {
    pub kept: Vec<MetricPoint>,
    /// Iteration reports left out.
    pub dropped: usize,
    /// Only iterations that are multiples of this were kept.
    pub stride: i64,
}

impl MetricBudgets {
    /// `rows_per_second` ≤ 0 keeps everything.
    pub fn new(rows_per_second: f64) -> Self {
        MetricBudgets { rows_per_second, jobs: Mutex::new(HashMap::new()) }
    }

    /// Keeps what `job`'s budget allows of `points`, as of `now`.
    pub fn thin(&self, job: JobId, points: Vec<MetricPoint>, now: Instant) -> Thinned {
        let rate = self.rows_per_second;
        if rate <= 0.0 {
            return Thinned { kept: points, dropped: 0, stride: 1 };
        }
        let burst = rate * BURST_SECONDS;
        let mut jobs = self.jobs.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if jobs.len() >= MAX_JOBS && !jobs.contains_key(&job) {
            jobs.retain(|_, b| now.duration_since(b.at) < IDLE);
        }
        let budget = jobs.entry(job).or_insert(Budget { rows: burst, at: now, stride: 1 });
        budget.rows = (budget.rows + now.duration_since(budget.at).as_secs_f64() * rate).min(burst);
        budget.at = now;
        // a full bucket means the job has been under its budget for a whole refill: try a finer stride
        if budget.rows >= burst && budget.stride > 1 {
            budget.stride /= 2;
        }
        let kept_at =
            |stride: i64| points.iter().filter(|p| p.kind == "iteration" && p.iteration % stride == 0).count() as f64;
        while kept_at(budget.stride) > budget.rows && budget.stride < MAX_STRIDE {
            budget.stride *= 2;
        }
        let stride = budget.stride;
        budget.rows = (budget.rows - kept_at(stride)).max(0.0);
        let before = points.len();
        let kept: Vec<MetricPoint> =
            points.into_iter().filter(|p| p.kind != "iteration" || p.iteration % stride == 0).collect();
        Thinned { dropped: before - kept.len(), kept, stride }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::Map;

    use super::*;

    fn reports(iterations: std::ops::Range<i64>, ranks: i32) -> Vec<MetricPoint> {
        iterations
            .flat_map(|iteration| {
                (0..ranks).map(move |rank| MetricPoint {
                    kind: "iteration".into(),
                    rank,
                    epoch: 0,
                    iteration,
                    attempt: 1,
                    fields: Map::new(),
                })
            })
            .collect()
    }

    #[test]
    fn a_job_under_its_budget_keeps_everything() {
        let budgets = MetricBudgets::new(100.0);
        let thinned = budgets.thin(JobId::new(), reports(0..250, 4), Instant::now());
        assert_eq!((thinned.kept.len(), thinned.dropped, thinned.stride), (1000, 0, 1));
    }

    #[test]
    fn a_flood_is_thinned_evenly_and_the_same_for_every_rank() {
        let budgets = MetricBudgets::new(100.0);
        let (job, start) = (JobId::new(), Instant::now());
        // a burst of 1,000 rows is allowed, then 100 per second: 10 s of 2,000 rows per second
        let mut kept = 0;
        for second in 0..10 {
            let from = second * 500;
            let thinned = budgets.thin(job, reports(from..from + 500, 4), start + Duration::from_secs(second as u64));
            assert!(thinned.kept.iter().all(|p| p.iteration % thinned.stride == 0));
            // every kept iteration is there for all four ranks
            assert_eq!(thinned.kept.len() % 4, 0);
            kept += thinned.kept.len();
        }
        assert!(kept <= 1000 + 100 * 10, "kept {kept} of 20,000");
        assert!(kept >= 1000, "kept {kept}: thinning should keep the budget's worth");
        // epoch reports pass whatever the stride
        let mut epoch = reports(0..1, 1);
        epoch[0].kind = "epoch".into();
        epoch[0].iteration = 7;
        assert_eq!(budgets.thin(job, epoch, start + Duration::from_secs(10)).kept.len(), 1);
    }

    #[test]
    fn the_stride_comes_back_down_once_the_job_is_quiet() {
        let budgets = MetricBudgets::new(100.0);
        let (job, start) = (JobId::new(), Instant::now());
        let flooded = budgets.thin(job, reports(0..10_000, 1), start);
        assert!(flooded.stride > 1);
        let later = budgets.thin(job, reports(10_000..10_010, 1), start + Duration::from_secs(60));
        assert!(later.stride < flooded.stride, "{} then {}", flooded.stride, later.stride);
    }
}

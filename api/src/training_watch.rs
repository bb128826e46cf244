//! Warnings about a run that goes on: a loss spike or a throughput collapse in rank 0's iteration reports
//! becomes a `warning` event on the job (its page and `GET /v1/jobs/{id}/events` show it), and the job is
//! not stopped: a spike may pass, a slow node may recover, and the NaN and collapse guards stop what cannot.
//!
//! Per server, like the metric budget: behind several replicas each watches the batches it receives, which
//! for one placement are its agents' (rank 0's reports come from one agent).

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use ringtrain_core::JobId;
use ringtrain_store::MetricPoint;

/// Reports a median is taken over.
const WINDOW: usize = 50;
/// Reports seen before anything is judged.
const WARM_UP: usize = 20;
/// A loss this many times the median is a spike.
const SPIKE: f64 = 4.0;
/// Throughput below this share of the median, for [`SLOW_REPORTS`] reports in a row, is a collapse (one
/// slow report is the evaluation at an epoch's end, in the window after it).
const COLLAPSE: f64 = 0.25;
const SLOW_REPORTS: u32 = 5;
/// Iterations between two warnings of one kind.
const QUIET_ITERATIONS: i64 = 200;
/// Warnings per placement at most: a run that keeps warning has said what it had to.
const MAX_WARNINGS: u32 = 10;
/// Jobs watched beyond this many are pruned of those idle for [`IDLE`].
const MAX_JOBS: usize = 10_000;
const IDLE: Duration = Duration::from_secs(600);

#[derive(Debug, Default)]
pub struct TrainingWatch {
    jobs: Mutex<HashMap<JobId, Watch>>,
}

#[derive(Debug)]
struct Watch {
    /// The placement whose reports these are: a new one (resized, on other devices) starts afresh.
    attempt: i32,
    warnings: u32,
    newest: i64,
    losses: VecDeque<f64>,
    speeds: VecDeque<f64>,
    slow_in_a_row: u32,
    last_spike: Option<i64>,
    last_collapse: Option<i64>,
    seen: Instant,
}

impl Watch {
    fn new(attempt: i32, now: Instant) -> Watch {
        Watch {
            attempt,
            warnings: 0,
            newest: -1,
            losses: VecDeque::new(),
            speeds: VecDeque::new(),
            slow_in_a_row: 0,
            last_spike: None,
            last_collapse: None,
            seen: now,
        }
    }
}

fn median(values: &VecDeque<f64>) -> f64 {
    let mut sorted: Vec<f64> = values.iter().copied().collect();
    sorted.sort_by(f64::total_cmp);
    sorted[sorted.len() / 2]
}

fn push(window: &mut VecDeque<f64>, value: f64) {
    if window.len() == WINDOW {
        window.pop_front();
    }
    window.push_back(value);
}

fn quiet(last: Option<i64>, iteration: i64) -> bool {
    last.is_none_or(|at| iteration - at >= QUIET_ITERATIONS)
}

impl TrainingWatch {
    /// The warnings `points` (a batch of one job's reports, as stored) raise, in words.
    pub fn observe(&self, job: JobId, points: &[MetricPoint], now: Instant) -> Vec<String> {
        let mut reports: Vec<&MetricPoint> = points.iter().filter(|p| p.kind == "iteration" && p.rank == 0).collect();
        if reports.is_empty() {
            return Vec::new();
        }
        reports.sort_by_key(|p| p.iteration);
        let mut jobs = self.jobs.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if jobs.len() >= MAX_JOBS {
            jobs.retain(|_, w| now.duration_since(w.seen) < IDLE);
        }
        let watch = jobs.entry(job).or_insert_with(|| Watch::new(reports[0].attempt, now));
        watch.seen = now;
        let mut warnings = Vec::new();
        for p in reports {
            if p.attempt > watch.attempt {
                let newest = watch.newest;
                *watch = Watch::new(p.attempt, now);
                watch.newest = newest;
            }
            // a resumed placement reports the lost iterations again: judged once
            if p.iteration <= watch.newest || p.attempt < watch.attempt {
                continue;
            }
            watch.newest = p.iteration;
            if watch.warnings >= MAX_WARNINGS {
                continue;
            }
            if let Some(loss) = p.number("loss").filter(|l| l.is_finite()) {
                if watch.losses.len() >= WARM_UP {
                    let typical = median(&watch.losses);
                    if typical > 0.0 && loss > SPIKE * typical && quiet(watch.last_spike, p.iteration) {
                        watch.last_spike = Some(p.iteration);
                        watch.warnings += 1;
                        warnings.push(format!(
                            "loss spike at iteration {}: {loss:.4}, {:.1} times the median {typical:.4} of the {} \
                             reports before (the job goes on)",
                            p.iteration,
                            loss / typical,
                            watch.losses.len()
                        ));
                    }
                }
                push(&mut watch.losses, loss);
            }
            if let Some(speed) = p.number("samples_per_s").filter(|s| s.is_finite()) {
                if watch.speeds.len() >= WARM_UP {
                    let typical = median(&watch.speeds);
                    if speed < COLLAPSE * typical {
                        watch.slow_in_a_row += 1;
                        if watch.slow_in_a_row >= SLOW_REPORTS && quiet(watch.last_collapse, p.iteration) {
                            watch.last_collapse = Some(p.iteration);
                            watch.warnings += 1;
                            // said once: the slower speed is the normal one from here (a lasting drop is
                            // not warned of again every 200 iterations)
                            watch.speeds.clear();
                            watch.slow_in_a_row = 0;
                            warnings.push(format!(
                                "throughput collapse at iteration {}: {speed:.0} samples/s, under a quarter of the \
                                 median {typical:.0} before, for {SLOW_REPORTS} reports in a row (the job goes on)",
                                p.iteration
                            ));
                        }
                        // the slow reports do not become the new normal
                        continue;
                    }
                    watch.slow_in_a_row = 0;
                }
                push(&mut watch.speeds, speed);
            }
        }
        warnings
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn report(iteration: i64, loss: f64, speed: f64) -> MetricPoint {
        let serde_json::Value::Object(fields) = json!({"loss": loss, "samples_per_s": speed}) else { unreachable!() };
        MetricPoint { kind: "iteration".into(), rank: 0, epoch: 0, iteration, attempt: 1, fields }
    }

    #[test]
    fn a_spike_and_a_collapse_are_named_once_and_a_steady_run_never() {
        let watch = TrainingWatch::default();
        let job = JobId(uuid::Uuid::from_u128(1));
        let now = Instant::now();
        let steady: Vec<MetricPoint> = (0..60).map(|i| report(i, 1.0 + 0.01 * (i % 5) as f64, 1000.0)).collect();
        assert!(watch.observe(job, &steady, now).is_empty());
        let spike = watch.observe(job, &[report(60, 9.0, 1000.0), report(61, 9.5, 1000.0)], now);
        assert_eq!(spike.len(), 1, "{spike:?}");
        assert!(spike[0].starts_with("loss spike at iteration 60: 9.0000, 8.8 times the median 1.02"), "{spike:?}");
        // one slow report (an evaluation's window) is not a collapse; five are
        assert!(watch.observe(job, &[report(62, 1.0, 100.0), report(63, 1.0, 1000.0)], now).is_empty());
        let slow: Vec<MetricPoint> = (64..70).map(|i| report(i, 1.0, 100.0)).collect();
        let collapse = watch.observe(job, &slow, now);
        assert_eq!(collapse.len(), 1, "{collapse:?}");
        assert!(collapse[0].starts_with("throughput collapse at iteration 68: 100 samples/s"), "{collapse:?}");
        // iterations reported again by a resumed placement are not judged twice
        assert!(watch.observe(job, &[report(60, 9.0, 1000.0)], now).is_empty());
        // other ranks and kinds are not watched
        let mut other = report(80, 50.0, 1.0);
        other.rank = 1;
        assert!(watch.observe(job, &[other], now).is_empty());
        // the slower speed is the new normal: no second warning at it
        let slower: Vec<MetricPoint> = (300..600).map(|i| report(i, 1.0, 100.0)).collect();
        assert!(watch.observe(job, &slower, now).is_empty());
        // a new placement starts afresh (its own warm-up)
        let mut resumed = report(600, 9.0, 1000.0);
        resumed.attempt = 2;
        assert!(watch.observe(job, &[resumed], now).is_empty());
    }
}

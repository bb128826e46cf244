//! What a running or finished job did: its progress while it runs, what it used of the pool, each of its
//! placements, and its result.

use chrono::{DateTime, Utc};
use ringtrain_core::Timeline;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::ToSchema;

/// How far a running job has come, from rank 0's newest iteration report.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct LiveProgress {
    /// Iterations done (rank 0's newest reported iteration + 1).
    pub iterations_done: i64,
    /// Iterations the whole run takes; absent while the dataset's size is unknown.
    pub total_iterations: Option<i64>,
    /// The epoch of the newest report (0-based).
    pub epoch: i64,
    /// Mean training loss over all ranks at that iteration.
    pub loss: Option<f64>,
    /// Samples per second of the whole job over the newest report's window.
    pub samples_per_s: Option<f64>,
    /// Share of that window's wall time spent in the gradient all-reduce (0 to 1).
    pub allreduce_share: Option<f64>,
    /// Seconds until the last iteration at that window's rate (evaluations and checkpoints not counted).
    pub seconds_left: Option<f64>,
}

impl LiveProgress {
    /// Seconds until the last iteration at the newest rate; None without a rate or a total.
    pub fn seconds_left(&self, global_batch: f64) -> Option<f64> {
        let (total, rate) = (self.total_iterations?, self.samples_per_s.filter(|r| *r > 0.0)?);
        Some((total - self.iterations_done).max(0) as f64 * global_batch / rate)
    }
}

/// A job's use of the pool.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct JobResources {
    /// Device-seconds its placements held devices, every placement counted (preempted, failed and
    /// cancelled ones too; a live one up to now), as the team's usage counts them.
    pub device_seconds: f64,
    /// The most memory any of its rank processes has held resident, in bytes, from the ranks' newest
    /// reports; absent before they report it.
    pub peak_rss_bytes: Option<f64>,
    /// CPU cores its rank processes kept busy together over their newest reports' windows.
    pub cpu_cores: Option<f64>,
}

/// One placement of a job.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct PlacementRecord {
    /// 1 for the first time the job was placed, one more per start.
    pub placement: i32,
    /// The attempt as the job's view counts it (the same across a preemption).
    pub attempt: i32,
    pub started_at: DateTime<Utc>,
    pub ended_at: Option<DateTime<Utc>>,
    /// From the placement claiming its devices to its last rank giving its device back.
    pub wall_seconds: f64,
    pub devices: u32,
    /// Each device's time held, summed.
    pub device_seconds: f64,
    /// `succeeded`, `preempted`, `failed`, `cancelled`, or `running`.
    pub ended: String,
    /// The iteration it resumed from (0: from the start).
    pub resumed_from_iteration: Option<i64>,
    /// Iterations it had trained and reported that the next placement trained again (0 when it stopped
    /// after a checkpoint of where it was, as a preemption does).
    pub iterations_lost: i64,
    /// Iterations it trained that count: from where it resumed to where the next placement resumed (None for
    /// the last placement, or when either is unknown).
    pub iterations: Option<i64>,
    /// Seconds from the previous placement's last rank stopping to this placement claiming its devices: what
    /// a stop and a start (a resize, a preemption, a lost node) cost beside the training itself, waiting in
    /// the queue included (None for the first).
    pub restart_seconds: Option<f64>,
}

/// A finished run's result: rank 0's `result.json` (spec, effective hyperparameters, schedule, epochs,
/// timeline, …), with the figures of the whole history the server puts in place of the last placement's.
/// The fields named here are those clients read; every other field of the file is kept in `rest`, so the
/// JSON is the file's.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct JobResult {
    /// Top-1 error (or RMSE, see `error_metric`) on the test split after the last epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub final_test_error: Option<f64>,
    /// Seconds from the first placement's start to the end, every placement and the gaps between counted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wall_seconds: Option<f64>,
    /// The last placement's own seconds, as its trainer measured them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trainer_wall_seconds: Option<f64>,
    /// Device-seconds of every placement.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_seconds: Option<f64>,
    /// Iterations trained twice because a placement stopped between checkpoints.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iterations_lost: Option<i64>,
    /// Training samples per second of the last placement (k·n per iteration).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub samples_per_s: Option<f64>,
    /// Every placement, the last one included.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub history: Option<Vec<PlacementRecord>>,
    /// Where rank 0's wall time went in the last placement.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeline: Option<Timeline>,
    /// The rest of `result.json`, as the rank wrote it.
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

impl JobResult {
    /// The stored `result.json` as a result; a field of an unexpected type leaves the whole file in `rest`
    /// rather than losing it. None for what is not a JSON object.
    pub fn from_json(value: Value) -> Option<JobResult> {
        // read from the value in place: it is cloned only where nothing fits
        match JobResult::deserialize(&value) {
            Ok(result) => Some(result),
            Err(_) => match value {
                Value::Object(rest) => Some(JobResult { rest, ..JobResult::default() }),
                _ => None,
            },
        }
    }
}

//! What a job left behind, each read in pages: its events (state changes, restarts), its ranks' metric
//! reports, their output lines, and its checkpoints.

use chrono::{DateTime, Utc};
use ringtrain_core::JobId;
pub use ringtrain_protocol::Checkpoint;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::ToSchema;

/// A row of a job's history: a state change, a restart, a note.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct JobEvent {
    pub seq: i64,
    pub job_id: JobId,
    pub at: DateTime<Utc>,
    /// `state` for transitions; `warning` for a loss spike or a throughput collapse in a run that goes on
    /// (no `from_state`, `to_state`).
    pub kind: String,
    pub from_state: Option<String>,
    pub to_state: Option<String>,
    /// The placement it belongs to: 1 for the first time the job was placed, one more per start (after a
    /// failure or a preemption); 0 before the first.
    pub placement: i32,
    /// The attempt as the job's view counts it: one more per failure-restart, the same across a preemption.
    pub attempt: i32,
    pub reason: Option<String>,
}

/// `GET /v1/jobs/{id}/events` as JSON.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct EventList {
    pub events: Vec<JobEvent>,
}

/// One report of a rank: an `iteration` or `epoch` line. `fields` holds the numbers (`loss`, `lr`,
/// `test_error`, ...). (kind, iteration, rank) is unique per job: reporting it again replaces it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct MetricPoint {
    pub kind: String,
    pub rank: i32,
    pub epoch: i64,
    pub iteration: i64,
    pub attempt: i32,
    #[schema(value_type = Object)]
    pub fields: Map<String, Value>,
}

impl MetricPoint {
    /// The number `name` of this report, if it has one.
    pub fn number(&self, name: &str) -> Option<f64> {
        self.fields.get(name).and_then(Value::as_f64)
    }
}

/// `GET /v1/jobs/{id}/metrics`: a page of reports.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct MetricsPage {
    pub points: Vec<MetricPoint>,
    /// Downsampled: with `kind`, points are `stride` iterations apart (the first report at or after each);
    /// without, every `stride`-th report of each series was kept. 1: every point.
    pub stride: i64,
    pub next_cursor: Option<String>,
}

/// A line a rank printed, as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct RankLogLine {
    /// Arrival order within the job: pass the last one as `since` to read on.
    pub id: i64,
    /// The placement that printed it.
    pub attempt: i32,
    pub rank: i32,
    /// Its number in the rank's output.
    pub seq: i64,
    pub at: DateTime<Utc>,
    /// `stderr` or `stdout`.
    pub stream: String,
    pub line: String,
}

/// `GET /v1/jobs/{id}/logs` as JSON.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct LogPage {
    pub lines: Vec<RankLogLine>,
    /// Pass as `since` to read on (the last line's id, or `since` when there was none).
    pub next_since: i64,
}

/// `GET /v1/jobs/{id}/checkpoints`: oldest first; `is_final` marks the finished job's weights.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct CheckpointList {
    pub checkpoints: Vec<Checkpoint>,
}

/// `DELETE /v1/jobs/{id}/artifacts`: what was deleted.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct DeletedCheckpoints {
    pub deleted: usize,
    pub freed_bytes: i64,
    /// Lines of its ranks' output deleted with them.
    pub log_lines: u64,
}

//! Studies (`/v1/studies`): a grid of points or a search over one spec, each point a job, with the
//! curves and costs that compare them.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use ringtrain_core::{JobId, JobState, ScheduleView, StudyId, TeamId};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::ToSchema;

/// One point of a study: what it changes, how it runs, and how it did.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct StudyPointView {
    pub point: i32,
    /// Its overrides in words (`workers=32 lr.warmup.kind=none`).
    pub label: String,
    /// Spec path → value, as the study made it.
    #[schema(value_type = Object)]
    pub overrides: Map<String, Value>,
    pub job_id: JobId,
    #[schema(value_type = String, example = "running")]
    pub state: JobState,
    pub is_reference: bool,
    /// k, the devices it holds, and the global batch k·n.
    pub workers: u32,
    pub devices: i32,
    pub global_batch: u64,
    /// The lr after scaling (before any cap), and the warmup and scaling it used.
    pub scaled_lr: Option<f64>,
    pub warmup: Option<String>,
    pub scaling: Option<String>,
    /// Per finished epoch, in order.
    pub train_error: Vec<f64>,
    pub test_error: Vec<f64>,
    /// The finished run's test error (its last epoch's).
    pub final_test_error: Option<f64>,
    /// final_test_error minus the reference's (positive: worse than the reference).
    pub vs_reference: Option<f64>,
    /// Seconds from start to finish (so far, while it runs).
    pub wall_seconds: Option<f64>,
    /// Training samples per second over the whole run (finished runs).
    pub samples_per_s: Option<f64>,
    pub error: Option<String>,
    /// Device-seconds its placements held (every placement counted).
    pub device_seconds: f64,
    /// A finished job reused as the reference (a scale search's `reference_job`): its device-seconds are
    /// not the study's.
    pub reused: bool,
    /// Its place in the study's search, in words (`promoted past rung 2 of 3`, `stopped at rung 1 (1
    /// epochs)`); absent without a search.
    pub search: Option<String>,
    /// Rungs it was promoted past; absent without a search.
    pub rungs_passed: Option<usize>,
    /// The search's metric at each rung it reached, in order (what it was judged by); absent without a
    /// search.
    pub at_rungs: Option<Vec<f64>>,
}

/// What a study's search found and what it cost.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct SearchSummary {
    /// The search as run (`kind`, `metric`, `rungs`, `reduction`).
    #[schema(value_type = Object)]
    pub spec: Value,
    /// No point is queued or running any more, nor promoted and waiting to resume.
    pub done: bool,
    /// The best point so far (not the reference): the finished one with the lowest final test error, else
    /// the one furthest on with the best figure at its last rung.
    pub best_point: Option<i32>,
    /// Its `lr.multiplier` (a scale search's answer).
    pub best_multiplier: Option<f64>,
    /// The spec to submit: the best point's, as it ran.
    #[schema(value_type = Option<Object>)]
    pub best_spec: Option<Value>,
    /// Device-hours every point held, the reference's included (unless it was reused: `reference_job`).
    pub device_hours: f64,
    /// What every point trained to the end would have held: a stopped or running point's device-hours per
    /// epoch so far times its epochs (an estimate until they all ran); a point that failed, or was cancelled,
    /// what it held (the grid would have failed it too).
    pub grid_device_hours: Option<f64>,
    /// grid_device_hours minus device_hours.
    pub saved_device_hours: Option<f64>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct StudyView {
    pub id: StudyId,
    pub name: Option<String>,
    pub team_id: TeamId,
    pub created_at: DateTime<Utc>,
    /// The index of the reference point (the small-batch baseline).
    pub reference_point: i32,
    /// Points per state.
    #[schema(value_type = Object)]
    pub states: BTreeMap<String, u64>,
    pub points: Vec<StudyPointView>,
    /// The request as stored (a template written out).
    #[schema(value_type = Object)]
    pub definition: Value,
    /// Device-hours the study's own points held so far (a reused reference's are not the study's).
    pub device_hours: f64,
    /// The study's cap, if it has one: reached, the points not ended are stopped.
    pub max_device_hours: Option<f64>,
    /// What the search found (studies with `search`).
    pub search: Option<SearchSummary>,
    pub links: StudyLinks,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct StudyLinks {
    #[serde(rename = "self")]
    pub this: String,
    pub plot: String,
    pub cancel: String,
}

/// A study in the list: no curves.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct StudySummary {
    pub id: StudyId,
    pub name: Option<String>,
    pub created_at: DateTime<Utc>,
    pub points: usize,
    /// Points per state.
    #[schema(value_type = Object)]
    pub states: BTreeMap<String, u64>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct StudyPage {
    pub studies: Vec<StudySummary>,
    /// Pass as `cursor` for the next (older) page; absent on the last page.
    pub next_cursor: Option<String>,
}

/// A point of a dry run.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct PlannedPointView {
    pub point: usize,
    pub label: String,
    pub is_reference: bool,
    /// The spec the point's job would be submitted with.
    #[schema(value_type = Object)]
    pub spec: Value,
    /// Its ScheduleView (effective hyperparameters, per-epoch lr, change points); null while the dataset's
    /// size is unknown (`idx:`).
    #[schema(value_type = Option<Object>)]
    pub schedule: Option<ScheduleView>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct StudyDryRun {
    /// Always true: nothing was stored.
    pub dry_run: bool,
    pub name: Option<String>,
    pub reference_point: usize,
    pub points: Vec<PlannedPointView>,
    /// The most the study may cost: its cap (`max_device_hours`), if it has one.
    pub max_device_hours: Option<f64>,
    /// What the team's budget has left this period, in device-hours; absent without a budget.
    pub budget_left_device_hours: Option<f64>,
}

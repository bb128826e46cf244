//! A job as the API shows it (`/v1/jobs`): [`JobView`] and the run history's pages, with what a queued
//! job waits for in [`waiting`], what a running or finished one did in [`run`], and what it left behind
//! (events, metrics, output lines, checkpoints) in [`records`].

pub mod records;
pub mod run;
pub mod waiting;

use chrono::{DateTime, Utc};
use ringtrain_core::spec::DeviceKind;
use ringtrain_core::{Effective, JobId, JobState, StudyId, TeamId};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

pub use records::RankLogLine;
pub use run::{JobResources, JobResult, LiveProgress, PlacementRecord};
pub use waiting::{EstimatedStart, PendingReason, Unplaceable};

/// A job as the API shows it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct JobView {
    pub id: JobId,
    pub name: Option<String>,
    #[schema(value_type = String, example = "queued")]
    pub state: JobState,
    pub team_id: TeamId,
    pub priority: i32,
    /// `cpu` or `gpu`.
    #[schema(value_type = String, example = "cpu")]
    pub device: DeviceKind,
    /// k: the ranks of the run's math (global batch workers × per_worker_batch).
    pub workers: i32,
    /// The devices it holds when placed, each playing workers / devices virtual ranks (the spec's `devices`,
    /// by default `workers`).
    pub devices: i32,
    /// The study this job is a point of, and which point (0-based).
    pub study: Option<StudyMembership>,
    /// The attempt: 0 until first placed, 1 for the first run, one more per restart after a failure. A run
    /// that was preempted and resumes elsewhere continues the same attempt.
    pub attempt: i32,
    /// How often the scheduler reclaimed its devices (it resumed from its last checkpoint each time).
    pub preemptions: i32,
    pub max_restarts: i32,
    /// The spec as submitted.
    #[schema(value_type = Object)]
    pub spec: Value,
    /// The effective hyperparameters (scaled lr, warmup iterations, milestones...); null while the
    /// dataset's size is unknown.
    #[schema(value_type = Option<Object>)]
    pub effective: Option<Effective>,
    pub dataset_size: Option<i64>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
    /// A finished run's `result.json`, with the server's whole-history figures (see [`JobResult`]).
    #[schema(value_type = Option<Object>)]
    pub result: Option<JobResult>,
    pub error: Option<String>,
    /// While queued: the pool as it exists cannot place this job (more devices than it has of the kind,
    /// or none of the kind), why, and since when. The job fails once the platform's grace period (an hour
    /// by default) has passed without the pool growing.
    pub unplaceable: Option<Unplaceable>,
    /// While queued: why it has not started, from the scheduler's own policy run on the current cluster
    /// (what its next pass decides). `code` is one of waiting_for_devices, head_of_line,
    /// head_of_line_reserved, behind_reservation, team_at_guarantee_pool_full, reclaiming,
    /// reclaim_after_min_run_time, too_large, no_devices_of_kind, previous_placement_stopping,
    /// beyond_queue_window, starting_next_pass, budget_exhausted; the other fields are the code's numbers (user guide, "Why a job
    /// waits"); `message` says it in words.
    #[schema(value_type = Option<Object>)]
    pub pending_reason: Option<PendingReason>,
    /// While queued: its place among the waiting jobs of its device kind, as the policy orders them (1 is
    /// next); absent when it starts in the next pass or cannot be placed.
    pub queue_position: Option<u32>,
    /// While queued, on `GET /v1/jobs/{id}` only: when it is expected to start, and on what that rests.
    /// Here and in `pending_reason`, another team's job or team is null and "a job of another team" in
    /// words (a platform admin sees the ids).
    pub estimated_start: Option<EstimatedStart>,
    /// Failed, on `GET /v1/jobs/{id}` only: the last stderr lines of its last placement's ranks (the whole
    /// output is at `/v1/jobs/{id}/logs`).
    pub last_log_lines: Option<Vec<RankLogLine>>,
    /// While running: how far it has come (rank 0's newest report: iterations done of the total, epoch,
    /// loss, samples/s, all-reduce share); absent until it reports.
    pub progress: Option<LiveProgress>,
    /// On `GET /v1/jobs/{id}` only, once placed: the device-seconds it used, and what its ranks reported of
    /// their memory and CPU.
    pub resources: Option<JobResources>,
    /// On `GET /v1/jobs/{id}` only, once placed: every placement so far (devices, wall time, device-seconds,
    /// how it ended, where it resumed): an elastic job's device count over time.
    pub placements: Option<Vec<PlacementRecord>>,
    /// What the team wrote about the run (`PATCH /v1/jobs/{id}`): tags to filter by, and a note.
    pub tags: Vec<String>,
    pub note: String,
    pub links: JobLinks,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct StudyMembership {
    pub id: StudyId,
    pub point: i32,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct JobLinks {
    #[serde(rename = "self")]
    pub this: String,
    pub schedule: String,
    pub events: String,
    pub metrics: String,
    pub logs: String,
    pub checkpoints: String,
}

/// A page of the team's run history (`GET /v1/jobs`), newest first.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct JobPage {
    pub jobs: Vec<JobView>,
    /// Pass as `cursor` for the next (older) page; absent on the last page.
    pub next_cursor: Option<String>,
}

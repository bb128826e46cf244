//! What a queued job waits for: why (the scheduler's reason), when it is expected to start, whether the
//! pool can place it at all; and a dry run's answer, what the scheduler would do with a submission now.

use chrono::{DateTime, Utc};
use ringtrain_core::memory::StageEstimate;
use ringtrain_core::{Effective, JobId, TeamId};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::ToSchema;
use uuid::Uuid;

/// Why a queued job has not started: a reason of the scheduler's policy, with its numbers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PendingReason {
    /// waiting_for_devices, head_of_line, … (user guide, "Why a job waits").
    pub code: String,
    /// The reason in words.
    pub message: String,
    /// The code's numbers (devices free and needed, the jobs awaited, …), and `slurm` on a Slurm pool.
    #[serde(flatten)]
    pub details: Map<String, Value>,
}

/// Why a queued job cannot be placed on the pool as it exists, and since when.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Unplaceable {
    pub since: DateTime<Utc>,
    /// In words, with the numbers: "needs 8 cpu devices; the pool has 1".
    pub reason: String,
}

/// When a waiting job is expected to start.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct EstimatedStart {
    /// `now` (the next pass starts it), `at`, or `unknown`.
    pub kind: String,
    /// Seconds from now (with `at`).
    pub seconds: Option<f64>,
    /// The moment (with `at`).
    pub at: Option<DateTime<Utc>>,
    /// The jobs it waits for: those whose end starts it (`at`), or those without a known end (`unknown`).
    /// Another team's job is null (its id is shown to platform admins only).
    pub jobs: Vec<Option<JobId>>,
    /// What the estimate rests on, in words.
    pub basis: String,
}

/// A device of a node.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct PlannedDevice {
    pub node_id: Uuid,
    /// The device's index on its node (CUDA ordinal or CPU slot).
    pub index: u32,
}

/// A job the submission would preempt.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct PlannedPreemption {
    pub job_id: JobId,
    pub team_id: TeamId,
}

/// What the scheduler would do with the job now (`POST /v1/jobs?dry_run=true`).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct DryRunView {
    /// Always true: nothing was stored.
    pub dry_run: bool,
    pub verdict: String,
    /// The verdict in words.
    pub message: String,
    /// `start`: where rank r would run (`devices[r]`). `reclaim`: the devices it would get, free ones held
    /// for it and busy ones it awaits.
    pub devices: Vec<PlannedDevice>,
    /// `start`: devices within the team's guarantee, and borrowed beyond it (reclaimable by other teams).
    pub within_guarantee: Option<u32>,
    pub borrowed: Option<u32>,
    /// `reclaim`: the jobs it would preempt (they checkpoint first, then resume when devices are free).
    pub preempts: Vec<PlannedPreemption>,
    /// `reclaim` and `wait`: its place among the waiting jobs of its device kind.
    pub queue_position: Option<u32>,
    /// `reclaim` and `wait`: the reason, as `pending_reason` in a job's view.
    #[schema(value_type = Option<Object>)]
    pub pending_reason: Option<PendingReason>,
    /// `reclaim` and `wait`: when it would start, if it were submitted now.
    pub estimated_start: Option<EstimatedStart>,
    /// Other jobs the next pass would start without this submission and not with it.
    pub delays: Vec<JobId>,
    /// The effective hyperparameters, as the job's view would show them.
    #[schema(value_type = Option<Object>)]
    pub effective: Option<Effective>,
    /// A job cut into pipeline stages: each stage's blocks, the micro-batches it keeps at once and its
    /// memory (each stage is a device of its own). Empty for a job that is not.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schema(value_type = Vec<Object>)]
    pub stages: Vec<StageEstimate>,
}

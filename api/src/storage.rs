//! What a team keeps in the server's store (its folder or its bucket: `crate::blobs`): its datasets and its
//! jobs' checkpoints, under one byte quota per team (the team's own, or the server's default), and never
//! past the free space of the disk uploads arrive on, less a reserve.
//! Checkpoints other than a job's final weights are kept to the newest few per job (retention), so a long
//! job does not grow its team's usage without bound.

use axum::response::Response;
use ringtrain_core::memory::human_bytes;
use ringtrain_core::{CheckpointId, JobId, TeamId};
use ringtrain_store::Checkpoint;

use crate::error::{ApiError, ApiResult, ProblemType};
use crate::state::AppState;

/// The team's quota in bytes: its own, else the server's default.
pub async fn quota(state: &AppState, team: TeamId) -> ApiResult<u64> {
    let own = state.store.get_team(team).await?.and_then(|t| t.storage_quota_bytes);
    Ok(own.map_or(state.config.team_storage_bytes, |q| q.max(0) as u64))
}

/// Refuses an upload of `incoming` bytes that would take the team past its quota (413, with the numbers
/// and how to make room), or the disk below its reserve of free space (507). Checked before the body is
/// read, with its declared length.
pub async fn check_room(state: &AppState, team: TeamId, incoming: u64, what: &str) -> ApiResult<()> {
    check_quota(state, team, incoming, what).await?;
    check_free_space(state, incoming)
}

/// The quota part of [`check_room`], checked again once the body's real length is known.
pub async fn check_quota(state: &AppState, team: TeamId, incoming: u64, what: &str) -> ApiResult<()> {
    let quota = quota(state, team).await?;
    let used = state.store.storage_use(team).await?;
    let total = used.total().max(0) as u64;
    if total.saturating_add(incoming) > quota {
        return Err(ApiError::new(
            ProblemType::StorageQuota,
            format!(
                "this {what} of {} does not fit in the team's storage quota: it keeps {} ({} of datasets, {} of \
                 checkpoints) of {}; delete datasets (DELETE /v1/datasets/{{id}}) or finished jobs' checkpoints \
                 (DELETE /v1/jobs/{{id}}/artifacts)",
                human_bytes(incoming),
                human_bytes(total),
                human_bytes(used.datasets_bytes.max(0) as u64),
                human_bytes(used.checkpoints_bytes.max(0) as u64),
                human_bytes(quota),
            ),
        ));
    }
    Ok(())
}

/// 507 when writing `incoming` bytes would leave the data directory's disk with less than the reserve.
pub fn check_free_space(state: &AppState, incoming: u64) -> ApiResult<()> {
    let Some(free) = free_bytes(&state.config.data_dir) else { return Ok(()) };
    let reserve = state.config.min_free_bytes;
    if free < incoming.saturating_add(reserve) {
        return Err(ApiError::new(
            ProblemType::InsufficientStorage,
            format!(
                "the server's disk has {} free and keeps {} in reserve: this upload of {} does not fit; try later",
                human_bytes(free),
                human_bytes(reserve),
                human_bytes(incoming)
            ),
        ));
    }
    Ok(())
}

/// Bytes an unprivileged writer may still use on the disk holding `dir`.
fn free_bytes(dir: &std::path::Path) -> Option<u64> {
    let stats = rustix::fs::statvfs(dir).ok()?;
    Some(stats.f_bavail.saturating_mul(stats.f_frsize))
}

/// Keeps the job's newest `keep_checkpoints` checkpoints besides its final weights, removing the others'
/// files. Best effort: a file that cannot be removed is logged, its row is gone either way.
pub async fn apply_retention(state: &AppState, job: JobId) -> ApiResult<Vec<Checkpoint>> {
    let pruned = state.store.prune_checkpoints(job, state.config.keep_checkpoints).await?;
    state.config.blobs().remove(&checkpoint_area(job), pruned.iter().map(|c| c.path.as_str())).await;
    Ok(pruned)
}

/// Where a job's checkpoints (and a fork's pinned start) are kept in the server's store.
pub fn checkpoint_area(job: JobId) -> String {
    format!("checkpoints/{job}")
}

/// The job's checkpoint `checkpoint`, or 404.
pub async fn find_checkpoint(state: &AppState, job: JobId, checkpoint: CheckpointId) -> ApiResult<Checkpoint> {
    let checkpoints = state.store.list_checkpoints(job).await?;
    checkpoints
        .into_iter()
        .find(|c| c.id == checkpoint)
        .ok_or_else(|| ApiError::not_found(format!("no checkpoint {checkpoint} of job {job}")))
}

/// A checkpoint's archive, served only from the server's own place for that job's checkpoints.
pub async fn checkpoint_file(state: &AppState, checkpoint: &Checkpoint) -> ApiResult<Response> {
    state.config.blobs().response(&checkpoint_area(checkpoint.job_id), &checkpoint.path, 0, None).await
}
